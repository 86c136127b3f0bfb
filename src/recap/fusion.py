"""Fusing the memory rows found for one context into a single candidate list."""

from __future__ import annotations

from collections.abc import Sequence

from .config import FIXED_FUSION_WEIGHTS

# (order, ids [k], probs [k], kappa); rows come highest key order first
OrderedRow = tuple[int, list[int], list[float], float]
Candidate = tuple[int, float, int]  # (token, fused probability q, order of the most specific row holding it)


def fuse_rows(rows: Sequence[OrderedRow], mode: str, specificity: Sequence[float]) -> list[Candidate]:
    """Merge rows into candidates sorted by fused probability q, best first.

    entropy: w_r = specificity[order_r - 1] * kappa_r
    fixed:   w_r = (0.70, 0.20, 0.10, 0.05)[position of r among the rows present]
    strict:  only the most specific row
    q(t) = sum_r w_r p_r(t) / sum_r w_r
    """
    if not rows:
        return []
    if mode == "strict" or len(rows) == 1:
        order, ids, probs, _ = rows[0]
        return [(t, p, order) for t, p in zip(ids, probs)]
    fused: dict[int, float] = {}
    source: dict[int, int] = {}
    total = 0.0
    for position, (order, ids, probs, kappa) in enumerate(rows):
        if mode == "entropy":
            weight = specificity[order - 1] * kappa
        else:
            weight = FIXED_FUSION_WEIGHTS[min(position, len(FIXED_FUSION_WEIGHTS) - 1)]
        total += weight
        for t, p in zip(ids, probs):
            if t in fused:
                fused[t] += weight * p
            else:
                fused[t] = weight * p
                source[t] = order
    if total <= 0:
        total = 1.0
    ranked = sorted(fused.items(), key=lambda item: -item[1])
    return [(t, v / total, source[t]) for t, v in ranked]
