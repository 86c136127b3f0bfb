"""Greedy acceptance: the longest root-to-node path the target agrees with."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels import verify
from .tree import DraftTree


@dataclass(frozen=True)
class Acceptance:
    """Result of verifying a tree greedily.

    path:  node indices from the root to the last accepted node (root included)
    bonus: the target's argmax at the last accepted node (the token after the path)
    """

    path: list[int]
    bonus: int

    @property
    def accepted_drafts(self) -> int:
        return len(self.path) - 1


def accept_greedy(tree: DraftTree, argmax: np.ndarray) -> Acceptance:
    """Accept the longest path whose every token equals the argmax at its parent.

    ``argmax``: [N] int, the target's greedy next token after each node's path. Among
    equally long accepted paths the first in node order wins. (Compiled; the reference is
    ``recap.reference.verify.accept_greedy``.)
    """
    if len(tree.tokens) == 1:  # a plain step: the root alone, nothing to compare
        return Acceptance(path=[0], bonus=int(argmax[0]))
    path, bonus = verify.accept_greedy(tree.tokens, tree.parents, tree.depths, np.ascontiguousarray(argmax, np.int64))
    return Acceptance(path=path.tolist(), bonus=int(bonus))
