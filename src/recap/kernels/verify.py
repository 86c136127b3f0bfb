"""Compiled greedy acceptance, the tree's ancestor mask and additive tree mask (references:
``recap.reference.verify``), and the greedy token, top-k candidates and their probabilities of
logit rows (references: ``torch.argmax`` / ``torch.topk`` / ``torch.softmax``)."""

from __future__ import annotations

import numpy as np

from ..jit import njit, njit_fast_sum


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


@njit
def additive_tree_mask(parents: np.ndarray, length: int, blocked: float) -> np.ndarray:
    """[1, 1, N, length + N] float32: 0 where node i may attend (the ``length`` committed slots,
    itself, its ancestors), ``blocked`` elsewhere (a tree forward's 4-D additive mask)."""
    n = parents.shape[0]
    sees = ancestor_mask(parents)
    mask = np.full((1, 1, n, length + n), np.float32(blocked), np.float32)
    rows = mask[0, 0]
    for i in range(n):
        rows[i, :length] = 0.0
        for j in range(i + 1):
            if sees[i, j]:
                rows[i, length + j] = 0.0
    return mask


@njit
def top_candidates(logits: np.ndarray, k: int):
    """(greedy [N] int64, ids [N, k] int64, values [N, k] float32) of ``logits`` [N, V] float32
    (k <= V): ``greedy`` is each row's first maximum, or its first NaN (as ``torch.argmax``);
    ``ids`` its k largest values, largest first (the lower id first on a tie), in one pass."""
    n, v = logits.shape
    greedy = np.empty(n, np.int64)
    ids = np.empty((n, k), np.int64)
    values = np.empty((n, k), np.float32)
    for r in range(n):
        row = logits[r]
        top_v = values[r]
        top_i = ids[r]
        first_nan = -1
        for j in range(v):
            x = row[j]
            if x != x and first_nan < 0:
                first_nan = j
            if j < k:  # the first k fill the list (so a row of -inf still gives k ids)
                i = j
            elif x > top_v[k - 1]:
                i = k - 1
            else:
                continue
            while i > 0 and x > top_v[i - 1]:  # strict: an equal value stays behind the lower id
                top_v[i] = top_v[i - 1]
                top_i[i] = top_i[i - 1]
                i -= 1
            top_v[i] = x
            top_i[i] = j
        greedy[r] = first_nan if first_nan >= 0 else top_i[0]
    return greedy, ids, values


@njit_fast_sum
def top_probabilities(logits: np.ndarray, values: np.ndarray) -> np.ndarray:
    """[N, k] float32: softmax(``logits`` [N, V] float32) at the top-k ``values`` [N, k] that
    ``top_candidates`` found (``values[:, 0]`` is each row's maximum). A row with a NaN or with no
    finite maximum gives NaN, as ``torch.softmax`` does. One compiled pass per row: on a few rows
    of a small vocabulary it costs a third of torch's ``logsumexp`` + ``exp`` in the decode loop."""
    n, v = logits.shape
    k = values.shape[1]
    probs = np.empty((n, k), np.float32)
    for r in range(n):
        top = values[r, 0]
        total = 0.0  # float64: the sum of up to V float32 terms
        row = logits[r]
        for j in range(v):
            total += np.float64(np.exp(row[j] - top))
        log_total = np.float64(top) + np.log(total)
        for i in range(k):
            probs[r, i] = np.exp(np.float64(values[r, i]) - log_total)
    return probs


@njit
def top_candidates_and_probabilities(logits: np.ndarray, k: int):
    """``top_candidates`` and ``top_probabilities`` in one call: (greedy [N] int64, ids [N, k]
    int64, probs [N, k] float32)."""
    greedy, ids, values = top_candidates(logits, k)
    return greedy, ids, top_probabilities(logits, values)


def warm_up() -> None:
    ancestor_mask(np.array([-1, 0]))
    additive_tree_mask(np.array([-1, 0]), 3, -1.0)
    accept_greedy(np.zeros(2, np.int64), np.array([-1, 0]), np.array([0, 1]), np.zeros(2, np.int64))
    top_candidates(np.zeros((1, 2), np.float32), 1)
    top_probabilities(np.zeros((1, 2), np.float32), np.zeros((1, 1), np.float32))
    top_candidates_and_probabilities(np.zeros((1, 2), np.float32), 1)
