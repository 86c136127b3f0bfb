"""Fusing the memory rows found for one context into a single candidate list."""

from __future__ import annotations

from collections.abc import Sequence

from .config import FIXED_FUSION_WEIGHTS
from .memory import Row

Fused = tuple[list[int], list[float], list[int]]  # tokens, fused q, key order of the most specific row holding each


def lookup_rows(context: tuple[int, ...], token_memory, table2, table3, orders: Sequence[int]) -> list[tuple[int, Row]]:
    """The (order, row) pairs a context finds, most specific first: the 3-token row of its last
    three tokens, the 2-token row of its last two, the token memory's row of its last token
    (each where ``orders`` uses it and the context is long enough). The tables are anything with
    ``get(key)`` (``ContextMemory``, ``ContextTable``), the token memory anything with ``row(t)``."""
    found = []
    for order, lookup in ((3, table3.get), (2, table2.get), (1, lambda key: token_memory.row(key[0]))):
        if order in orders and len(context) >= order:
            row = lookup(tuple(context[-order:]))
            if row is not None:
                found.append((order, row))
    return found


def fuse_rows(rows: Sequence[tuple[int, Row]], mode: str, specificity: Sequence[float]) -> Fused:
    """Merge (order, row) pairs, highest order first, into candidates sorted by fused q.

    entropy: w_r = specificity[order_r - 1] * kappa_r
    fixed:   w_r = (0.70, 0.20, 0.10, 0.05)[position of r among the rows present]
    strict:  only the most specific row
    q(t) = sum_r w_r p_r(t) / sum_r w_r. A single row's lists are returned as they are
    (shared: never mutate them).
    """
    if not rows:
        return [], [], []
    if mode == "strict" or len(rows) == 1:
        order, (ids, probs, _) = rows[0]
        return ids, probs, [order] * len(ids)
    fused: dict[int, float] = {}
    source: dict[int, int] = {}
    total = 0.0
    for position, (order, (ids, probs, kappa)) in enumerate(rows):
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
    ranked = sorted(fused, key=fused.__getitem__, reverse=True)
    return ranked, [fused[t] / total for t in ranked], [source[t] for t in ranked]
