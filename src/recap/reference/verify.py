"""References of the compiled verification kernels (``recap.kernels.verify``)."""

from __future__ import annotations

import numpy as np

from ..core.accept import Acceptance
from ..core.tree import DraftTree


def ancestor_mask(tree: DraftTree) -> np.ndarray:
    """The readable reference of ``DraftTree.ancestor_mask``: one depth at a time."""
    n = len(tree)
    mask = np.zeros((n, n), dtype=bool)
    mask[0, 0] = True
    for depth in range(1, int(tree.depths.max()) + 1):
        rows = np.nonzero(tree.depths == depth)[0]
        mask[rows] = mask[tree.parents[rows]]
        mask[rows, rows] = True
    return mask


def accept_greedy(tree: DraftTree, argmax: np.ndarray) -> Acceptance:
    """The readable reference of ``recap.core.accept.accept_greedy``."""
    tokens = tree.tokens.tolist()
    parents = tree.parents.tolist()
    best = argmax.tolist()
    depths = tree.depths.tolist()
    accepted = [True] + [False] * (len(tokens) - 1)
    last = 0
    for i in range(1, len(tokens)):
        p = parents[i]
        if accepted[p] and tokens[i] == best[p]:
            accepted[i] = True
            if depths[i] > depths[last]:
                last = i
    return Acceptance(path=tree.path(last), bonus=int(best[last]))
