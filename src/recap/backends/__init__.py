"""Backends: what the decode loop needs from a model engine (``Target``) and its implementations
(``hf.HFTarget`` for transformers models). Backends import the model-free core only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from ..core.topk import TopK
from ..core.tree import DraftTree


class Prefill(NamedTuple):
    """What a prefill returns to the loop."""

    first: int  # the greedy first new token
    topk: TopK | None  # top-k at the prompt positions asked for, or None
    logits: torch.Tensor  # [1, V] raw logits at the prompt's last position (for processed token choices)


class Verification(NamedTuple):
    """What one verify forward over a tree returns to the loop."""

    greedy: np.ndarray  # [N] int64, the raw argmax after each node
    topk: TopK  # [N, k], what the drafters learn from
    logits: torch.Tensor  # [N, V] raw logits (for processed or sampled token choices)
    # the forward was still timing kernels (``few_row_linear.Scope.timing``): its time is not what its size costs
    timing_kernels: bool = False


class Target(Protocol):
    """One request's view of the target model: the decode loop's only window on it.

    ``vocab_size`` logits per position; ``placeholder_ids`` (image / video tokens) are never
    drafted. The top-k rows it returns hold the ``k`` candidates it was built with.
    """

    vocab_size: int
    placeholder_ids: frozenset[int]

    def prefill(self, inputs: Mapping[str, Any], positions: Sequence[int]) -> Prefill:
        """Run the prompt; the greedy first token, top-k at ``positions`` of the prompt (or None)."""
        ...

    def verify(self, tree: DraftTree) -> Verification:
        """One forward over the tree: greedy next token after each node, top-k, raw logits."""
        ...

    def commit(self, path: Sequence[int]) -> None:
        """Keep the cache entries of the accepted ``path`` (node indices, root first)."""
        ...

    def close(self) -> None: ...
