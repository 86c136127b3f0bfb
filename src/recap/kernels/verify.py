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


# 2**f on f in [-1/2, 1/2]: its Taylor polynomial of degree 7, highest power first (truncation error < 1e-8)
_EXP2_COEFFICIENTS = tuple(np.float32(np.log(2.0) ** n / np.prod(np.arange(1.0, n + 1))) for n in range(7, -1, -1))
_LOG2_E = np.float32(1.0 / np.log(2.0))


@njit_fast_sum
def _exp_sum(row: np.ndarray, top: np.float32, mantissas: np.ndarray, powers: np.ndarray) -> float:
    """sum(exp(row - top)) in float64 for ``row`` [V] float32 whose largest value is ``top``
    (finite); NaN if ``row`` holds a NaN. ``mantissas`` [V] float32 and ``powers`` [V] int32 are
    scratch. exp(d) = 2**k * 2**f (k = round(d log2 e), |f| <= 1/2) with a polynomial for 2**f and
    2**k written as float32 exponent bits: every operation has a SIMD form, so the loop is
    vectorized (a call to exp per value is not, and cost 3 ns a value). Relative error about 1e-7 a
    term, that of float32's exp; a difference below 2**-125 counts as 2**-125 (about 2e-38)."""
    c7, c6, c5, c4, c3, c2, c1, c0 = _EXP2_COEFFICIENTS
    nans = 0
    for j in range(row.shape[0]):
        x = row[j]
        nans += x != x
        y = (x - top) * _LOG2_E
        if not y >= -125.0:  # also a NaN or -inf: the exponent bits below stay in range
            y = np.float32(-125.0)
        k = np.floor(y + np.float32(0.5))
        f = y - k
        mantissas[j] = ((((((c7 * f + c6) * f + c5) * f + c4) * f + c3) * f + c2) * f + c1) * f + c0
        powers[j] = (np.int32(k) + np.int32(127)) << np.int32(23)
    if nans:
        return np.nan
    scales = powers.view(np.float32)
    total = 0.0  # float64: the sum of up to V float32 terms
    for j in range(row.shape[0]):
        total += np.float64(mantissas[j] * scales[j])
    return total


@njit
def top_probabilities(logits: np.ndarray, values: np.ndarray) -> np.ndarray:
    """[N, k] float32: softmax(``logits`` [N, V] float32) at the top-k ``values`` [N, k] that
    ``top_candidates`` found (``values[:, 0]`` is each row's maximum). A row with a NaN or with no
    finite maximum gives NaN, as ``torch.softmax`` does. One compiled pass per row with a
    vectorized exp (``_exp_sum``): on a few rows of a small vocabulary it costs a tenth of torch's
    ``logsumexp`` + ``exp`` in the decode loop, and on many rows of a large one less than they do."""
    n, v = logits.shape
    k = values.shape[1]
    probs = np.empty((n, k), np.float32)
    mantissas = np.empty(v, np.float32)
    powers = np.empty(v, np.int32)
    for r in range(n):
        top = values[r, 0]
        if not np.isfinite(top):
            probs[r, :] = np.nan
            continue
        log_total = np.float64(top) + np.log(_exp_sum(logits[r], top, mantissas, powers))
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
