"""Fusing the memory rows found for one context into a single candidate list."""

from __future__ import annotations

from collections.abc import Sequence

from ..codes import FIXED_FUSION_WEIGHTS
from ..core.memory import Row
from ..core.tree import Source, key_order

Fused = tuple[list[int], list[float], list[int]]  # tokens, fused q, source of the most specific row holding each


def lookup_rows(
    context: tuple[int, ...], token_memory, local: dict, persistent: dict | None, orders: Sequence[int]
) -> list[tuple[int, Row]]:
    """The (source, row) pairs a context finds, most specific first: the 3-token row of its last
    three tokens, the 2-token row of its last two (the request's own ``local`` row, else the
    ``persistent`` one, if given), the token memory's row of its last token; each where
    ``orders`` uses that key length and the context is long enough. The tables (``local[2]``,
    ``local[3]``, ...) are anything with ``get(key)`` (``ContextMemory``, ``ContextTable``), the
    token memory anything with ``row(t)``."""
    found = []
    for order, kept in ((3, Source.PERSISTENT3), (2, Source.PERSISTENT2)):
        if order in orders and len(context) >= order:
            key = tuple(context[-order:])
            row = local[order].get(key)
            if row is not None:
                found.append((order, row))
            elif persistent is not None:
                row = persistent[order].get(key)
                if row is not None:
                    found.append((int(kept), row))
    if 1 in orders:
        row = token_memory.row(context[-1])
        if row is not None:
            found.append((1, row))
    return found


def fuse_rows(rows: Sequence[tuple[int, Row]], mode: str, specificity: Sequence[float]) -> Fused:
    """Merge (source, row) pairs, most specific first, into candidates sorted by fused q.

    entropy: w_r = specificity[order_r - 1] * kappa_r, order_r the key length of r's source
    fixed:   w_r = (0.70, 0.20, 0.10, 0.05)[position of r among the rows present]
    strict:  only the most specific row
    q(t) = sum_r w_r p_r(t) / sum_r w_r. A single row's lists are returned as they are
    (shared: never mutate them).
    """
    if not rows:
        return [], [], []
    if mode == "strict" or len(rows) == 1:
        source, (ids, probs, _) = rows[0]
        return ids, probs, [source] * len(ids)
    fused: dict[int, float] = {}
    sources: dict[int, int] = {}
    total = 0.0
    for position, (source, (ids, probs, kappa)) in enumerate(rows):
        if mode == "entropy":
            weight = specificity[key_order(source) - 1] * kappa
        else:
            weight = FIXED_FUSION_WEIGHTS[min(position, len(FIXED_FUSION_WEIGHTS) - 1)]
        total += weight
        for t, p in zip(ids, probs):
            if t in fused:
                fused[t] += weight * p
            else:
                fused[t] = weight * p
                sources[t] = source
    if total <= 0:
        total = 1.0
    ranked = sorted(fused, key=fused.__getitem__, reverse=True)
    return ranked, [fused[t] / total for t in ranked], [sources[t] for t in ranked]
