"""Models that ship inside the package, loadable offline by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent / "models"
NAMES: tuple[str, ...] = (
    tuple(sorted(p.name for p in ROOT.iterdir() if (p / "config.json").is_file())) if ROOT.is_dir() else ()
)


def path(name: str) -> Path:
    """The folder of an embedded model."""
    if name not in NAMES:
        raise ValueError(f"no embedded model {name!r}; available: {', '.join(NAMES) or 'none'}")
    return ROOT / name


def load(name: str) -> tuple[Any, Any]:
    """(model, processor) of an embedded model, float32 on the CPU, sdpa attention."""
    from transformers import AutoModelForImageTextToText

    from .image_processor import load_processor

    folder = path(name)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype="float32", attn_implementation="sdpa").eval()
    processor = load_processor(folder)
    return model, processor
