"""Compiled drafting: fusion of memory rows, the best-first tree and its layout.

Twins of ``recap.reference.fusion.fuse_rows``, ``recap.reference.tree_builder.build_tree`` and
``recap.reference.tree_builder.layout`` (same algorithm, same tie-breaks, same float64 arithmetic), so
the trees are identical; the tests check that on many random memories.

Memories are passed as tuples of arrays:
- token memory: (ids [V, k] int32, probs [V, k] float32, kappa [V] float32, filled [V] bool)
- a context table: (keys [cap] int64, ids [cap, k] int32, probs [cap, k] float32, kappa [cap] float32,
  stamps [cap] int64, used [cap] int64); ``tables`` = (2-token table, 3-token table). A row stamped with
  this request's ``stamp`` is the request's own (source ORDER2/3); another stamp marks a row kept from an
  earlier request (PERSISTENT2/3), used only when ``use[0]``. A row read is marked used at ``now`` (the
  use clock the bounded tables evict by; the only write of drafting, made under the memory's lock).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..codes import (
    FIXED_FUSION_WEIGHTS,
    FUSION_MODES,
    N_CELLS,
    SOURCE_FREQUENCY,
    SOURCE_ORDER1,
    SOURCE_PERSISTENT2,
    SOURCE_PERSISTENT3,
    SOURCE_ROOT,
    SOURCE_SUFFIX,
)
from ..jit import njit
from .cells import cell_index
from .tables import find, pack_key

FIXED_WEIGHTS = np.array(FIXED_FUSION_WEIGHTS)
FUSION_CODES = {mode: code for code, mode in enumerate(FUSION_MODES)}  # entropy 0, fixed 1, strict 2
ENTROPY, FIXED, STRICT = range(3)


class BuiltTree(NamedTuple):
    """The best-first tree in insertion order (arrays of length n) and the size chosen."""

    tokens: np.ndarray  # [n] int64
    parents: np.ndarray  # [n] int64
    depths: np.ndarray  # [n] int64
    sources: np.ndarray  # [n] int64, source codes
    scores: np.ndarray  # [n] float64, best-first scores
    probs: np.ndarray  # [n] float64, the estimate that each node's path is accepted
    cells: np.ndarray  # [n] int64, calibration cell of each node (-1: none)
    keep: int  # how many of the first nodes to verify (the size the cost rule chose)


class LaidOutTree(NamedTuple):
    """A tree in depth-first order (what is verified); arrays of length N."""

    tokens: np.ndarray  # [N] int64
    parents: np.ndarray  # [N] int64
    depths: np.ndarray  # [N] int64
    sources: np.ndarray  # [N] int8
    probs: np.ndarray  # [N] float64
    cells: np.ndarray  # [N] int64


@njit
def _row_source(order: int, persistent_row: bool) -> int:
    """The source code of a row found under a key of ``order`` tokens (2 or 3)."""
    if persistent_row:
        return SOURCE_PERSISTENT2 if order == 2 else SOURCE_PERSISTENT3
    return order  # SOURCE_ORDER2 = 2, SOURCE_ORDER3 = 3


@njit
def _key_order(source: int) -> int:
    """The number of tokens in the key of a memory row's source."""
    if source == SOURCE_PERSISTENT2:
        return 2
    if source == SOURCE_PERSISTENT3:
        return 3
    return source  # SOURCE_ORDER1/2/3 = 1/2/3


@njit
def fuse_context(
    a: int,
    b: int,
    c: int,  # the context: c the node's token, b and a the two before (-1 where none)
    token_memory,
    tables,  # (2-token table, 3-token table)
    use: np.ndarray,  # [4] bool: use[o] key order o; use[0] rows kept from earlier requests
    stamp: int,  # this request's stamp
    now: int,  # the use clock: set on every row read
    mode: int,
    specificity: np.ndarray,  # [3] float64
    fallback_tokens: np.ndarray,  # [F] int64, the frequency fallback (empty: off)
    fallback_q: np.ndarray,  # [F] float64
    out_tokens: np.ndarray,  # [>= 3k + 1] int64
    out_q: np.ndarray,  # [>= 3k + 1] float64
    out_sources: np.ndarray,  # [>= 3k + 1] int64
) -> int:
    """Fused candidates of a context, best first, into the ``out_*`` arrays; returns their count
    (see ``recap.fusion.lookup_rows`` and ``fuse_rows``)."""
    mem_ids, mem_probs, mem_kappa, mem_filled = token_memory
    k = mem_ids.shape[1]
    # rows found, most specific first: the table holding each (-1: the token memory), slot, source
    which = np.empty(3, np.int64)
    slots = np.empty(3, np.int64)
    sources = np.empty(3, np.int64)
    n_rows = 0
    for order in (3, 2):
        if not use[order] or b < 0 or (order == 3 and a < 0):
            continue
        t = order - 2
        slot = find(tables[t][0], pack_key(a if order == 3 else -1, b, c))
        if slot < 0:
            continue
        own = tables[t][4][slot] == stamp
        if own or use[0]:
            tables[t][5][slot] = now
            which[n_rows], slots[n_rows], sources[n_rows] = t, slot, _row_source(order, not own)
            n_rows += 1
    if use[1] and 0 <= c < mem_filled.shape[0] and mem_filled[c]:
        which[n_rows], slots[n_rows], sources[n_rows] = -1, c, SOURCE_ORDER1
        n_rows += 1
    if n_rows == 0:
        for i in range(fallback_tokens.shape[0]):
            out_tokens[i] = fallback_tokens[i]
            out_q[i] = fallback_q[i]
            out_sources[i] = SOURCE_FREQUENCY
        return fallback_tokens.shape[0]
    n = 0
    total = 0.0
    single = mode == STRICT or n_rows == 1
    for r in range(1 if single else n_rows):
        t, slot, source = which[r], slots[r], sources[r]
        if t < 0:
            ids, probs, kappa = mem_ids[slot], mem_probs[slot], mem_kappa[slot]
        else:
            ids, probs, kappa = tables[t][1][slot], tables[t][2][slot], tables[t][3][slot]
        if single:  # the row as it is
            for i in range(k):
                out_tokens[i], out_q[i], out_sources[i] = ids[i], probs[i], source
            return k
        order = _key_order(source)
        if mode == ENTROPY:
            weight = specificity[order - 1] * np.float64(kappa)
        else:
            weight = FIXED_WEIGHTS[min(r, 3)]
        total += weight
        for i in range(k):
            token = np.int64(ids[i])
            mass = weight * np.float64(probs[i])
            found = -1
            for j in range(n):
                if out_tokens[j] == token:
                    found = j
                    break
            if found >= 0:
                out_q[found] += mass
            else:
                out_tokens[n], out_q[n], out_sources[n] = token, mass, source
                n += 1
    if total <= 0.0:
        total = 1.0
    # stable insertion sort, descending, on the unnormalised masses (as the reference sorts)
    for i in range(1, n):
        token, q, source = out_tokens[i], out_q[i], out_sources[i]
        j = i
        while j > 0 and out_q[j - 1] < q:
            out_tokens[j], out_q[j], out_sources[j] = out_tokens[j - 1], out_q[j - 1], out_sources[j - 1]
            j -= 1
        out_tokens[j], out_q[j], out_sources[j] = token, q, source
    for i in range(n):
        out_q[i] = out_q[i] / total
    return n


@njit
def _heap_less(neg: np.ndarray, cnt: np.ndarray, i: int, j: int) -> bool:
    return neg[i] < neg[j] or (neg[i] == neg[j] and cnt[i] < cnt[j])


@njit
def _heap_swap(neg, cnt, par, rank, i, j) -> None:
    neg[i], neg[j] = neg[j], neg[i]
    cnt[i], cnt[j] = cnt[j], cnt[i]
    par[i], par[j] = par[j], par[i]
    rank[i], rank[j] = rank[j], rank[i]


@njit
def _heap_push(neg, cnt, par, rank, size, score, counter, parent, at) -> int:
    neg[size], cnt[size], par[size], rank[size] = -score, counter, parent, at
    i = size
    while i > 0:
        up = (i - 1) // 2
        if _heap_less(neg, cnt, i, up):
            _heap_swap(neg, cnt, par, rank, i, up)
            i = up
        else:
            break
    return size + 1


@njit
def _heap_pop(neg, cnt, par, rank, size) -> int:
    """Move the smallest entry to slot ``size - 1``; returns the new size."""
    last = size - 1
    _heap_swap(neg, cnt, par, rank, 0, last)
    i = 0
    while True:
        left, right, best = 2 * i + 1, 2 * i + 2, i
        if left < last and _heap_less(neg, cnt, left, best):
            best = left
        if right < last and _heap_less(neg, cnt, right, best):
            best = right
        if best == i:
            break
        _heap_swap(neg, cnt, par, rank, i, best)
        i = best
    return last


@njit
def _build_tree(
    root_context: np.ndarray,  # [3] int64: two tokens before the root (-1 where none), the root
    token_memory,
    tables,
    use: np.ndarray,
    stamp: int,
    now: int,
    mode: int,
    specificity: np.ndarray,
    fallback_tokens: np.ndarray,
    fallback_q: np.ndarray,
    budget: int,
    max_depth: int,
    max_width: int,
    calibrated: bool,
    hit_masses: np.ndarray,  # [max_depth] float64
    cell_probs: np.ndarray,  # [N_CELLS] float64
    blocked: np.ndarray,  # [vocab] bool
    suffix: np.ndarray,  # [S] int64, the suffix-matched continuation (merged only when calibrated)
    suffix_length: int,
    step_costs: np.ndarray,  # [budget + 2] float64 seconds per step by tree size, or empty: no choice
    node_value: float,  # tokens a verified node's learned rows are counted as worth (the size choice)
    valued_nodes: int,  # the drafted nodes (the first ones) counted so
    rows_need_drafts: bool,  # the rows count only where some tree beats a plain step on its drafts alone
):
    """The best-first tree in insertion order, as arrays of length n, and the size chosen
    (see the reference): (tokens, parents, depths, sources, scores, probs, cells, keep)."""
    size = budget + 1
    width = max_width
    k = token_memory[0].shape[1]
    # working arrays, one per quantity (each with its own dtype), allocated once per call: the
    # nodes, the candidates offered under each node, the scratch of one fusion, the frontier heap
    tokens = np.empty(size, np.int64)
    parents = np.empty(size, np.int64)
    depths = np.empty(size, np.int64)
    sources = np.empty(size, np.int64)
    scores = np.empty(size, np.float64)
    probs = np.empty(size, np.float64)
    cells = np.empty(size, np.int64)
    before1 = np.empty(size, np.int64)  # the token before each node
    on_suffix = np.empty(size, np.int64)
    offer_tokens = np.empty((size, width), np.int64)
    offer_factors = np.empty((size, width), np.float64)
    offer_sources = np.empty((size, width), np.int64)
    offer_probs = np.empty((size, width), np.float64)
    offer_cells = np.empty((size, width), np.int64)
    offer_count = np.zeros(size, np.int64)
    scratch = 3 * k + 1
    cand_tokens = np.empty(scratch, np.int64)
    cand_q = np.empty(scratch, np.float64)
    cand_sources = np.empty(scratch, np.int64)
    cand_factors = np.empty(scratch, np.float64)
    cand_probs = np.empty(scratch, np.float64)
    cand_cells = np.empty(scratch, np.int64)
    heap_cap = 2 * size + 2
    heap_neg = np.empty(heap_cap, np.float64)
    heap_cnt = np.empty(heap_cap, np.int64)
    heap_par = np.empty(heap_cap, np.int64)
    heap_rank = np.empty(heap_cap, np.int64)
    heap_size = 0
    counter = 0
    vocab = blocked.shape[0]
    n_suffix = suffix.shape[0]

    tokens[0], parents[0], depths[0], sources[0] = root_context[2], -1, 0, SOURCE_ROOT
    scores[0], probs[0], cells[0] = 1.0, 1.0, -1
    before1[0] = root_context[1]
    on_suffix[0] = 0 if (n_suffix > 0 and calibrated) else -1
    n = 1
    choose = step_costs.shape[0] > 0
    expected, best_rate, keep = 1.0, 0.0, 1
    drafts_expected, drafts_pay = 1.0, not rows_need_drafts  # the expected tokens without the rows' worth
    if choose:
        best_rate = 1.0 / step_costs[1]
    plain_rate = best_rate
    expand = 0  # the node to expand next (each added node is expanded at once)
    while True:
        # -- expand node ``expand``: its candidates, best first, filtered, at most ``width``
        node = expand
        depth = depths[node] + 1
        if depth <= max_depth and n < size:  # (a node added last is not expanded: nothing follows)
            before2 = before1[parents[node]] if node > 0 else root_context[0]
            count = fuse_context(
                before2, before1[node], tokens[node], token_memory, tables, use, stamp, now, mode, specificity,
                fallback_tokens, fallback_q, cand_tokens, cand_q, cand_sources,
            )  # fmt: skip
            for i in range(count):
                cell = cell_index(cand_sources[i], depth, cand_q[i])
                p = cell_probs[cell]
                cand_probs[i], cand_cells[i] = p, cell
                cand_factors[i] = p if calibrated else hit_masses[depth - 1] * cand_q[i]
            j = on_suffix[node]
            if 0 <= j < n_suffix:
                cell = cell_index(SOURCE_SUFFIX, depth, suffix_length)
                p = cell_probs[cell]
                at = -1
                for i in range(count):
                    if cand_tokens[i] == suffix[j]:
                        at = i
                        break
                appended = at < 0
                if appended:
                    at = count
                    count += 1
                    cand_tokens[at], cand_q[at] = suffix[j], 0.0
                if appended or p > cand_factors[at]:
                    cand_sources[at], cand_factors[at], cand_probs[at], cand_cells[at] = SOURCE_SUFFIX, p, p, cell
            # stable insertion sort by factor, descending
            for i in range(1, count):
                t, f, s, p, c = cand_tokens[i], cand_factors[i], cand_sources[i], cand_probs[i], cand_cells[i]
                m = i
                while m > 0 and cand_factors[m - 1] < f:
                    cand_tokens[m], cand_factors[m] = cand_tokens[m - 1], cand_factors[m - 1]
                    cand_sources[m], cand_probs[m] = cand_sources[m - 1], cand_probs[m - 1]
                    cand_cells[m] = cand_cells[m - 1]
                    m -= 1
                cand_tokens[m], cand_factors[m], cand_sources[m], cand_probs[m], cand_cells[m] = t, f, s, p, c
            kept = 0
            parent_token = tokens[node]
            for i in range(count):
                t = cand_tokens[i]
                if 0 <= t < vocab and blocked[t]:
                    continue
                on_path = False
                up = node
                while up > 0:
                    if tokens[parents[up]] == parent_token and tokens[up] == t:
                        on_path = True
                        break
                    up = parents[up]
                if on_path:
                    continue
                offer_tokens[node, kept], offer_factors[node, kept] = t, cand_factors[i]
                offer_sources[node, kept], offer_probs[node, kept] = cand_sources[i], cand_probs[i]
                offer_cells[node, kept] = cand_cells[i]
                kept += 1
                if kept == width:
                    break
            offer_count[node] = kept
            if kept > 0:
                counter += 1
                heap_size = _heap_push(
                    heap_neg, heap_cnt, heap_par, heap_rank, heap_size,
                    scores[node] * offer_factors[node, 0], counter, node, 0,
                )  # fmt: skip
        # -- add the best offered candidate
        if heap_size == 0 or n >= size:
            break
        heap_size = _heap_pop(heap_neg, heap_cnt, heap_par, heap_rank, heap_size)
        score, parent, rank = -heap_neg[heap_size], heap_par[heap_size], heap_rank[heap_size]
        node = n
        n += 1
        token = offer_tokens[parent, rank]
        tokens[node], parents[node], depths[node] = token, parent, depths[parent] + 1
        sources[node], scores[node] = offer_sources[parent, rank], score
        probs[node], cells[node] = probs[parent] * offer_probs[parent, rank], offer_cells[parent, rank]
        before1[node] = tokens[parent]
        j = on_suffix[parent]
        on_suffix[node] = j + 1 if (0 <= j < n_suffix and suffix[j] == token) else -1
        if rank + 1 < offer_count[parent]:
            counter += 1
            heap_size = _heap_push(
                heap_neg, heap_cnt, heap_par, heap_rank, heap_size,
                scores[parent] * offer_factors[parent, rank + 1], counter, parent, rank + 1,
            )  # fmt: skip
        if choose:
            expected += probs[node] + (node_value if n - 1 <= valued_nodes else 0.0)
            drafts_expected += probs[node]
            drafts_pay = drafts_pay or drafts_expected / step_costs[n] > plain_rate
            rate = expected / step_costs[n]
            if rate >= best_rate:
                best_rate, keep = rate, n
            if calibrated:  # stop once no bigger tree can win, every further node at most this likely
                improvable = False
                for bigger in range(n + 1, size + 1):
                    rows = node_value * max(0, min(bigger - 1, valued_nodes) - (n - 1))
                    if (expected + probs[node] * (bigger - n) + rows) / step_costs[bigger] >= best_rate or (
                        not drafts_pay
                        and (drafts_expected + probs[node] * (bigger - n)) / step_costs[bigger] > plain_rate
                    ):
                        improvable = True
                        break
                if not improvable:
                    break
        expand = node
    if not choose:
        keep = n
    elif not drafts_pay:  # no tree beat a plain step on its drafts: the rows' worth alone buys none
        keep = 1
    return tokens[:n], parents[:n], depths[:n], sources[:n], scores[:n], probs[:n], cells[:n], keep


@njit
def _layout(
    tokens: np.ndarray,
    parents: np.ndarray,
    sources: np.ndarray,
    probs: np.ndarray,
    cells: np.ndarray,
    keep: int,
    graft: np.ndarray,  # [G] int64
    graft_probs: np.ndarray,  # [G] float64
    graft_cells: np.ndarray,  # [G] int64
):
    """The first ``keep`` nodes plus the graft, depth-first (see the reference ``layout``):
    (tokens, parents, depths, sources, probs, cells) of the laid-out tree."""
    cap = keep + graft.shape[0]
    tok = np.empty(cap, np.int64)
    par = np.empty(cap, np.int64)
    src = np.empty(cap, np.int64)
    prb = np.empty(cap, np.float64)
    cel = np.empty(cap, np.int64)
    first = np.full(cap, -1, np.int64)
    last = np.full(cap, -1, np.int64)
    sibling = np.full(cap, -1, np.int64)
    for i in range(keep):
        tok[i], par[i], src[i], prb[i], cel[i] = tokens[i], parents[i], sources[i], probs[i], cells[i]
        if i > 0:
            p = par[i]
            if last[p] < 0:
                first[p] = i
            else:
                sibling[last[p]] = i
            last[p] = i
    n = keep
    node = 0
    for g in range(graft.shape[0]):
        child = first[node]
        while child >= 0 and tok[child] != graft[g]:
            child = sibling[child]
        if child < 0:
            child = n
            n += 1
            tok[child], par[child], src[child] = graft[g], node, SOURCE_SUFFIX
            prb[child], cel[child] = prb[node] * graft_probs[g], graft_cells[g]
            if last[node] < 0:
                first[node] = child
            else:
                sibling[last[node]] = child
            last[node] = child
        node = child
    out_tok = np.empty(n, np.int64)
    out_par = np.empty(n, np.int64)
    out_dep = np.empty(n, np.int64)
    out_src = np.empty(n, np.int8)
    out_prb = np.empty(n, np.float64)
    out_cel = np.empty(n, np.int64)
    new_index = np.empty(n, np.int64)
    stack = np.empty(n, np.int64)
    reverse = np.empty(n, np.int64)
    top = 1
    stack[0] = 0
    count = 0
    while top > 0:
        top -= 1
        old = stack[top]
        new_index[old] = count
        out_tok[count], out_src[count], out_prb[count], out_cel[count] = tok[old], src[old], prb[old], cel[old]
        if old == 0:
            out_par[count], out_dep[count] = -1, 0
        else:
            out_par[count] = new_index[par[old]]
            out_dep[count] = out_dep[out_par[count]] + 1
        count += 1
        m = 0
        child = first[old]
        while child >= 0:
            reverse[m] = child
            m += 1
            child = sibling[child]
        for i in range(m - 1, -1, -1):
            stack[top] = reverse[i]
            top += 1
    return out_tok, out_par, out_dep, out_src, out_prb, out_cel


def build_tree(
    *,
    root_context: np.ndarray,  # [3] int64: two tokens before the root (-1 where none), the root
    token_memory: tuple,  # (ids [V, k] int32, probs [V, k] float32, kappa [V] float32, filled [V] bool)
    tables: tuple,  # (2-token table, 3-token table), each (keys, ids, probs, kappa, stamps, used)
    use: np.ndarray,  # [4] bool: use[o] key order o; use[0] rows kept from earlier requests
    stamp: int,  # this request's stamp
    now: int = 0,  # the use clock, set on every row read (``TokenMemory.tick``)
    fusion: str,  # one of codes.FUSION_MODES
    specificity: np.ndarray,  # [3] float64, entropy fusion's prior weight of key orders 1, 2, 3
    fallback_tokens: np.ndarray,  # [F] int64, the frequency fallback (empty: off)
    fallback_q: np.ndarray,  # [F] float64
    budget: int,  # draft nodes at most (root excluded)
    max_depth: int,
    max_width: int,
    calibrated: bool,  # calibrated scores (else the paper's hit-mass scores)
    hit_masses: np.ndarray,  # [max_depth] float64
    cell_probs: np.ndarray,  # [N_CELLS] float64
    placeholder_mask: np.ndarray,  # [vocab] bool, tokens never drafted (image placeholders)
    suffix: np.ndarray,  # [S] int64, the suffix-matched continuation (merged only when calibrated)
    suffix_length: int,  # its match length
    step_costs: np.ndarray,  # [budget + 2] float64 seconds per step by tree size, or empty: no choice
    node_value: float = 0.0,  # tokens a verified node's learned rows are counted as worth (the size choice)
    valued_nodes: int = 0,  # the drafted nodes (the first ones) counted so
    rows_need_drafts: bool = False,  # the rows count only where some tree beats a plain step on its drafts alone
) -> BuiltTree:
    """The best-first tree and the size chosen (reference: ``recap.reference.tree_builder.build_tree``)."""
    return BuiltTree(
        *_build_tree(
            root_context, token_memory, tables, use, stamp, now, FUSION_CODES[fusion], specificity, fallback_tokens,
            fallback_q, budget, max_depth, max_width, calibrated, hit_masses, cell_probs, placeholder_mask, suffix,
            suffix_length, step_costs, float(node_value), int(valued_nodes), bool(rows_need_drafts),
        )
    )  # fmt: skip


def layout(
    built: BuiltTree,
    graft: np.ndarray,  # [G] int64, a path to graft from the root (the paper's suffix path)
    graft_probs: np.ndarray,  # [G] float64
    graft_cells: np.ndarray,  # [G] int64
) -> LaidOutTree:
    """The first ``built.keep`` nodes plus the graft, depth-first (reference: ``tree_builder.layout``)."""
    keep = built.keep
    if keep <= 2 and not len(graft):  # the root and at most one child are in depth-first order already
        return LaidOutTree(
            built.tokens[:keep], built.parents[:keep], built.depths[:keep], built.sources[:keep].astype(np.int8),
            built.probs[:keep], built.cells[:keep],
        )  # fmt: skip
    return LaidOutTree(
        *_layout(
            built.tokens, built.parents, built.sources, built.probs, built.cells, built.keep, graft, graft_probs,
            graft_cells,
        )
    )  # fmt: skip


def warm_up() -> None:
    k, vocab = 2, 8
    token_memory = (
        np.zeros((vocab, k), np.int32),
        np.zeros((vocab, k), np.float32),
        np.zeros(vocab, np.float32),
        np.zeros(vocab, np.bool_),
    )
    table = (
        np.full(8, -1, np.int64),
        np.zeros((8, k), np.int32),
        np.zeros((8, k), np.float32),
        np.zeros(8, np.float32),
        np.zeros(8, np.int64),
        np.zeros(8, np.int64),
    )
    empty, one = np.zeros(0, np.int64), np.ones(1, np.int64)
    built = build_tree(
        root_context=np.array([-1, -1, 1]), token_memory=token_memory, tables=(table, table),
        use=np.ones(4, np.bool_), stamp=1, fusion="entropy", specificity=np.ones(3), fallback_tokens=empty,
        fallback_q=np.zeros(0), budget=4, max_depth=3, max_width=2, calibrated=True, hit_masses=np.ones(3),
        cell_probs=np.full(N_CELLS, 0.5), placeholder_mask=np.zeros(vocab, np.bool_), suffix=empty, suffix_length=0,
        step_costs=np.ones(6),
    )  # fmt: skip
    layout(built, one, np.ones(1), one)
