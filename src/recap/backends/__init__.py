"""Backends: what the decode loop needs from a model engine (``Target``) and its implementations
(``hf.HFTarget`` for transformers models)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from ..topk import TopK
from ..tree import DraftTree


class Target(Protocol):
    """One request's view of the target model: the decode loop's only window on it.

    ``vocab_size`` logits per position; ``placeholder_ids`` (image / video tokens) are never
    drafted; ``k`` candidates per top-k row; ``logits`` the raw logits of the last prefill (last
    row, [1, V]) or verify ([N, V]), for token choices that process them. ``model`` identifies
    the model for per-model state that outlives a request (default memories, step costs).
    """

    model: Any
    vocab_size: int
    placeholder_ids: frozenset[int]
    k: int
    logits: torch.Tensor | None

    def prefill(self, inputs: Mapping[str, Any], positions: Sequence[int]) -> tuple[int, TopK | None]:
        """Run the prompt; (greedy first token, top-k at ``positions`` of the prompt or None)."""
        ...

    def verify(self, tree: DraftTree) -> tuple[np.ndarray, TopK]:
        """One forward over the tree: (greedy next token after each node [N], top-k [N, k])."""
        ...

    def commit(self, path: Sequence[int]) -> None:
        """Keep the cache entries of the accepted ``path`` (node indices, root first)."""
        ...

    def close(self) -> None: ...
