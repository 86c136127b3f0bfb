"""Best-first construction of a draft tree from fused candidates, its truncation to a node
budget, the suffix graft and the depth-first layout.

This is the readable reference; the drafter runs the compiled twin in
``recap.kernels.drafting``, which the tests hold equal to it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core.tree import DraftTree, Source
from ..kernels.cells import cell_index
from .fusion import Fused

CandidateFn = Callable[[tuple[int, ...]], Fused]


@dataclass(frozen=True)
class Scoring:
    """How a candidate edge is scored.

    calibrated: score = the calibrated P(accepted | parent accepted) of its cell (``probs``
                [N_CELLS]); False: the paper's score, ``hit_masses[depth - 1]`` x q.
    Either way each node also gets ``prob``, the calibrated estimate of its whole path being
    accepted (the product of its edges' cell probabilities), from which budgets are chosen.
    """

    calibrated: bool
    hit_masses: np.ndarray  # [max_depth] float64
    probs: np.ndarray  # [N_CELLS] float64


@dataclass
class BuiltTree:
    """A tree in best-first insertion order: node i (i >= 1) is the i-th added, so its first
    B + 1 nodes are exactly the tree a budget of B builds. ``cells`` is each node's calibration
    cell (-1 for the root)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    cells: list[int] = field(default_factory=list)
    keep: int = 0  # the size chosen for verification (all nodes without step costs)

    def __len__(self) -> int:
        return len(self.tokens)


def _edges(
    fused: Fused, depth: int, scoring: Scoring
) -> list[tuple[float, int, int, float, int]]:  # (score factor, token, source, cell prob, cell)
    out = []
    for token, q, source in zip(*fused):
        cell = cell_index(source, depth, q)
        p = float(scoring.probs[cell])
        factor = p if scoring.calibrated else float(scoring.hit_masses[depth - 1]) * q
        out.append((factor, token, source, p, cell))
    return out


def build_tree(
    root_context: tuple[int, ...],
    candidates: CandidateFn,
    *,
    budget: int,
    max_depth: int,
    max_width: int,
    scoring: Scoring,
    placeholder_ids: frozenset[int] | set[int] = frozenset(),
    suffix: Sequence[int] = (),
    suffix_length: int = 0,
    step_costs: np.ndarray | None = None,
    node_value: float = 0.0,
    valued_nodes: int = 0,
    rows_need_drafts: bool = False,
) -> BuiltTree:
    """Grow a tree best-first from the root (the last token of ``root_context``).

    A child's score is score(parent) x its edge factor (see ``Scoring``). Each added node is
    expanded at once: its candidates, from ``candidates(ctx)`` with ctx its last <= 3 tokens,
    are sorted by edge factor (stable), placeholder_ids tokens and edges (a -> b) already on its path
    are dropped, and at most ``max_width`` are kept; only its best child is offered, and a
    sibling only once the previous one is taken. Up to ``budget`` nodes are added besides the
    root, highest score first (ties: the earlier offer), to depth ``max_depth``.

    With calibrated scoring, ``suffix`` (the suffix-matched continuation, whose match was
    ``suffix_length`` tokens long) competes as a candidate: the node on the continuation at
    depth j offers ``suffix[j]`` (source SUFFIX), or raises that candidate's factor to the
    suffix cell's if it is already there with a lower one.

    ``step_costs`` [budget + 2] (seconds of a step verifying s nodes, at index s) makes the
    search choose the size: ``keep`` is the s (root included) with the most expected tokens
    (the sum of the first s nodes' ``probs``, plus ``node_value`` for each of the first
    ``valued_nodes`` drafted nodes: the rows learned from them) per second, the larger on ties.
    ``rows_need_drafts``: the rows count only if some tree beats the plain step on its drafts
    alone; else ``keep`` is 1 (the rows' worth may make a tree that pays bigger, never make one
    where no draft is likely enough to pay). With calibrated scores, probabilities fall in
    insertion order, so the search stops as soon as no larger tree could beat the best so far
    (nor, while none has, the plain step on its drafts alone) even if every further node were as
    likely as the last.
    """
    tree = BuiltTree([root_context[-1]], [-1], [0], [int(Source.ROOT)], [1.0], [1.0], [-1])
    contexts = [tuple(root_context[-3:])]
    on_suffix = [0 if (suffix and scoring.calibrated) else -1]  # position of each node on the continuation
    offers: list[list[tuple[float, int, int, float, int]]] = []
    heap: list[tuple[float, int, int, int]] = []  # (-score, offer counter, parent, rank)
    counter = 0

    def expand(node: int) -> None:
        nonlocal counter
        depth = tree.depths[node] + 1
        edges = _edges(candidates(contexts[node]), depth, scoring)
        j = on_suffix[node]
        if 0 <= j < len(suffix):
            cell = cell_index(int(Source.SUFFIX), depth, suffix_length)
            p = float(scoring.probs[cell])
            at = next((i for i, e in enumerate(edges) if e[1] == suffix[j]), -1)
            if at < 0:
                edges.append((p, suffix[j], int(Source.SUFFIX), p, cell))
            elif p > edges[at][0]:
                edges[at] = (p, suffix[j], int(Source.SUFFIX), p, cell)
        edges.sort(key=lambda e: -e[0])  # stable: ties keep the fused order
        path_edges = set()
        up = node
        while up > 0:
            path_edges.add((tree.tokens[tree.parents[up]], tree.tokens[up]))
            up = tree.parents[up]
        token = tree.tokens[node]
        kept = [e for e in edges if e[1] not in placeholder_ids and (token, e[1]) not in path_edges][:max_width]
        offers.append(kept)
        if kept:
            counter += 1
            heapq.heappush(heap, (-tree.scores[node] * kept[0][0], counter, node, 0))

    expected, best_rate, last = 1.0, 0.0, budget + 1
    drafts_expected, drafts_pay = 1.0, not rows_need_drafts  # the expected tokens without the rows' worth
    if step_costs is not None:
        best_rate = 1.0 / step_costs[1]
        tree.keep = 1
    plain_rate = best_rate
    expand(0)
    while heap and len(tree) <= budget:
        neg_score, _, parent, rank = heapq.heappop(heap)
        factor, token, source, p, cell = offers[parent][rank]
        node = len(tree)
        tree.tokens.append(token)
        tree.parents.append(parent)
        tree.depths.append(tree.depths[parent] + 1)
        tree.sources.append(source)
        tree.scores.append(-neg_score)
        tree.probs.append(tree.probs[parent] * p)
        tree.cells.append(cell)
        contexts.append((contexts[parent] + (token,))[-3:])
        j = on_suffix[parent]
        on_suffix.append(j + 1 if 0 <= j < len(suffix) and suffix[j] == token else -1)
        if rank + 1 < len(offers[parent]):
            counter += 1
            heapq.heappush(heap, (-tree.scores[parent] * offers[parent][rank + 1][0], counter, parent, rank + 1))
        if step_costs is not None:
            size = len(tree)
            expected += tree.probs[node] + (node_value if size - 1 <= valued_nodes else 0.0)
            drafts_expected += tree.probs[node]
            drafts_pay = drafts_pay or drafts_expected / step_costs[size] > plain_rate
            if expected / step_costs[size] >= best_rate:
                best_rate, tree.keep = expected / step_costs[size], size
            # stop once no bigger tree can win, every further node as likely as this one (rows valued),
            # nor, while no tree has, beat the plain step on its drafts alone
            if scoring.calibrated and not any(
                (expected + tree.probs[node] * (bigger - size) + _rows(node_value, valued_nodes, size, bigger))
                / step_costs[bigger]
                >= best_rate
                or (
                    not drafts_pay
                    and (drafts_expected + tree.probs[node] * (bigger - size)) / step_costs[bigger] > plain_rate
                )
                for bigger in range(size + 1, last + 1)
            ):
                break
        if tree.depths[node] < max_depth:
            expand(node)
        else:
            offers.append([])
    if step_costs is None:
        tree.keep = len(tree)
    elif not drafts_pay:  # no tree beat a plain step on its drafts: the rows' worth alone buys none
        tree.keep = 1
    return tree


def _rows(node_value: float, valued_nodes: int, size: int, bigger: int) -> float:
    """The value of the rows a tree of ``bigger`` nodes adds over one of ``size``."""
    return node_value * max(0, min(bigger - 1, valued_nodes) - (size - 1))


def layout(
    tree: BuiltTree,
    keep: int,
    graft: Sequence[int] = (),
    graft_probs: Sequence[float] = (),
    graft_cells: Sequence[int] = (),
) -> tuple[DraftTree, np.ndarray]:
    """The first ``keep`` nodes of ``tree`` (root included) as a ``DraftTree`` in depth-first
    preorder, children in insertion order (the likeliest chain contiguous), after grafting
    ``graft`` below the root: the paper's suffix path, reusing nodes that hold it, new nodes
    (source SUFFIX; the j-th has edge probability ``graft_probs[j]`` and cell ``graft_cells[j]``)
    appended.
    Returns the tree and ``order`` [N]: the insertion index of each laid-out node (new graft
    nodes numbered after the kept ones)."""
    tokens, parents, sources = tree.tokens[:keep], tree.parents[:keep], tree.sources[:keep]
    probs, cells = tree.probs[:keep], tree.cells[:keep]
    children: list[list[int]] = [[] for _ in range(keep)]
    for node in range(1, keep):
        children[parents[node]].append(node)
    node = 0
    for token, graft_prob, graft_cell in zip(graft, graft_probs, graft_cells):
        found = next((c for c in children[node] if tokens[c] == token), -1)
        if found < 0:
            found = len(tokens)
            tokens, parents, sources = [*tokens, token], [*parents, node], [*sources, int(Source.SUFFIX)]
            probs, cells = [*probs, probs[node] * graft_prob], [*cells, graft_cell]
            children[node].append(found)
            children.append([])
        node = found
    order: list[int] = []
    new_index = [0] * len(tokens)
    stack = [0]
    while stack:
        old = stack.pop()
        new_index[old] = len(order)
        order.append(old)
        stack.extend(reversed(children[old]))
    draft = DraftTree.from_lists(
        [tokens[i] for i in order],
        [-1] + [new_index[parents[i]] for i in order[1:]],
        [sources[i] for i in order],
        probs=[probs[i] for i in order],
    )
    return draft, np.asarray([cells[i] for i in order], dtype=np.int64)
