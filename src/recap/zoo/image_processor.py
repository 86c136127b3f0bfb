"""A Qwen2.5-VL processor for machines without torchvision.

``Qwen2_5_VLProcessor`` wants a video processor, and transformers' video processors need
torchvision. Images are all the embedded models take, so this subclass drops the video
part; everything else (the image processor, M-RoPE token types, chat template) is the
stock class. Registered with ``AutoProcessor`` so a saved folder loads with it.
"""

from __future__ import annotations

from transformers import AutoProcessor, Qwen2_5_VLConfig, Qwen2_5_VLProcessor


class QwenVLImageProcessor(Qwen2_5_VLProcessor):
    """``Qwen2_5_VLProcessor`` for images only (no video processor, so no torchvision)."""

    attributes = ["image_processor", "tokenizer"]

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


def register() -> None:
    """Let ``AutoProcessor.from_pretrained`` build this class for a saved tiny model."""
    AutoProcessor.register(Qwen2_5_VLConfig, QwenVLImageProcessor, exist_ok=True)
