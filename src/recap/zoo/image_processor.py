"""A Qwen2.5-VL processor for machines without torchvision.

``Qwen2_5_VLProcessor`` wants a video processor, and transformers' video processors need
torchvision. Images are all the embedded models take, so this subclass drops the video
part; everything else (the image processor, M-RoPE token types, chat template) is the
stock class. ``load_processor`` builds it for a folder whose ``processor_config.json`` names it;
``register`` also lets ``AutoProcessor`` build it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from transformers import AutoProcessor, Qwen2_5_VLConfig, Qwen2_5_VLProcessor


class QwenVLImageProcessor(Qwen2_5_VLProcessor):
    """``Qwen2_5_VLProcessor`` for images only (no video processor, so no torchvision)."""

    attributes = ["image_processor", "tokenizer"]

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


def register() -> None:
    """Let ``AutoProcessor.from_pretrained`` build this class for a saved tiny model (transformers 5.17
    and older ignore a registration for one of their own config classes: ``load_processor`` does not
    depend on it)."""
    AutoProcessor.register(Qwen2_5_VLConfig, QwenVLImageProcessor, exist_ok=True)


def load_processor(name_or_path: str | os.PathLike) -> Any:
    """The processor of a model folder or hub id: this class, built directly, where the folder's
    ``processor_config.json`` names it; else ``AutoProcessor``'s (with this class registered)."""
    config = Path(name_or_path) / "processor_config.json"
    try:
        named = json.loads(config.read_text()).get("processor_class")
    except (OSError, ValueError, AttributeError):
        named = None
    if named == QwenVLImageProcessor.__name__:
        return QwenVLImageProcessor.from_pretrained(name_or_path)
    register()
    return AutoProcessor.from_pretrained(name_or_path)
