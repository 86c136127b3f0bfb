"""The one model fact the model-free core needs: how many logits a model returns per position."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedModelError


def output_vocab_size(model: Any) -> int:
    """Number of logits the model returns per position (the rows of its output embedding)."""
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise UnsupportedModelError(f"{type(model).__name__} has no output embedding (lm_head)")
    return int(head.weight.shape[0])
