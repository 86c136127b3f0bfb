"""Compiled greedy acceptance and the tree's ancestor mask (references: ``recap.reference.verify``)."""

from __future__ import annotations

import numpy as np

from ..jit import njit


@njit
def accept_greedy(tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, argmax: np.ndarray):
    """(path [m] int64 from the root, bonus): the longest path whose every token equals the
    argmax at its parent; among equally long ones the first in node order."""
    n = tokens.shape[0]
    accepted = np.zeros(n, np.bool_)
    accepted[0] = True
    last = 0
    for i in range(1, n):
        p = parents[i]
        if accepted[p] and tokens[i] == argmax[p]:
            accepted[i] = True
            if depths[i] > depths[last]:
                last = i
    path = np.empty(depths[last] + 1, np.int64)
    node = last
    for d in range(depths[last], -1, -1):
        path[d] = node
        node = parents[node]
    return path, argmax[last]


@njit
def ancestor_mask(parents: np.ndarray) -> np.ndarray:
    """[N, N] bool: row i is True at i and at each ancestor of i (parents precede children)."""
    n = parents.shape[0]
    mask = np.zeros((n, n), np.bool_)
    for i in range(n):
        p = parents[i]
        if p >= 0:
            mask[i, :i] = mask[p, :i]
        mask[i, i] = True
    return mask


def warm_up() -> None:
    ancestor_mask(np.array([-1, 0]))
    accept_greedy(np.zeros(2, np.int64), np.array([-1, 0]), np.array([0, 1]), np.zeros(2, np.int64))
