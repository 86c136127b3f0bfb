"""Best-first construction of a draft tree from fused candidates, and the suffix graft."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np

from .fusion import Fused
from .tree import DraftTree, Source

CandidateFn = Callable[[tuple[int, ...]], Fused]
Candidate = tuple[int, float, int]  # token, q, source


class TreeLists:
    """A tree under construction, as plain lists (node 0 is the root)."""

    __slots__ = ("tokens", "parents", "depths", "sources", "ranks", "children")

    def __init__(self, root: int) -> None:
        self.tokens = [root]
        self.parents = [-1]
        self.depths = [0]
        self.sources = [int(Source.ROOT)]
        self.ranks = [-1]  # best-first insertion order (-1: drafted at any budget)
        self.children: list[list[int]] = [[]]

    def add(self, parent: int, token: int, source: int) -> int:
        node = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.sources.append(source)
        self.ranks.append(-1)
        self.children.append([])
        self.children[parent].append(node)
        return node

    def depth_first(self) -> TreeLists:
        """The same tree with nodes renumbered in depth-first preorder, children in the
        order they were added (best first), so the likeliest chain is contiguous."""
        children, tokens, sources, ranks = self.children, self.tokens, self.sources, self.ranks
        out = TreeLists(tokens[0])
        out_tokens, out_parents, out_depths, out_sources, out_ranks, out_children = (
            out.tokens,
            out.parents,
            out.depths,
            out.sources,
            out.ranks,
            out.children,
        )
        stack = [(child, 0) for child in reversed(children[0])]  # (old node, new parent)
        while stack:
            old, parent = stack.pop()
            node = len(out_tokens)
            out_tokens.append(tokens[old])
            out_parents.append(parent)
            out_depths.append(out_depths[parent] + 1)
            out_sources.append(sources[old])
            out_ranks.append(ranks[old])
            out_children.append([])
            out_children[parent].append(node)
            stack.extend((child, node) for child in reversed(children[old]))
        return out

    def graft(self, path: Sequence[int], source: int = int(Source.SUFFIX)) -> None:
        """Add ``path`` as a chain below the root, reusing nodes that already hold it (which
        then count as drafted at any budget, like the path's new nodes)."""
        node = 0
        for token in path:
            for child in self.children[node]:
                if self.tokens[child] == token:
                    node = child
                    self.ranks[node] = -1
                    break
            else:
                node = self.add(node, token, source)

    def freeze(self) -> DraftTree:
        return DraftTree(
            tokens=np.asarray(self.tokens, dtype=np.int64),
            parents=np.asarray(self.parents, dtype=np.int64),
            depths=np.asarray(self.depths, dtype=np.int64),
            sources=np.asarray(self.sources, dtype=np.int8),
            ranks=np.asarray(self.ranks, dtype=np.int64),
        )


def build_tree(
    root_context: tuple[int, ...],
    candidates: CandidateFn,
    *,
    budget: int,
    max_depth: int,
    max_width: int,
    hit_mass: Callable[[int], float],
    blocked: frozenset[int] | set[int] = frozenset(),
) -> TreeLists:
    """Grow a tree best-first from the root (the last token of ``root_context``).

    A child's score is score(parent) * hit_mass(depth) * q(child), q from ``candidates(ctx)``,
    ctx the node's last <= 3 tokens. Up to ``budget`` nodes besides the root are added, the
    highest score first; each node has at most ``max_width`` children and depth <=
    ``max_depth``. Skipped: tokens in ``blocked`` and an edge (a -> b) already on the path.
    Work is lazy: a node's candidates are fetched only when its best possible child could
    still make the budget, and a sibling is offered only when the previous one is taken.
    Returns the tree in depth-first layout; ``ranks`` holds each node's insertion order, so
    the nodes of rank < B are exactly the tree a budget of B would have built.
    """
    tree = TreeLists(root_context[-1])
    tokens, parents, depths, sources, ranks = tree.tokens, tree.parents, tree.depths, tree.sources, tree.ranks
    children = tree.children
    masses = [hit_mass(d) for d in range(1, max_depth + 1)]  # masses[d - 1]: hit mass at depth d
    # per node, filled when it is expanded: its last <= 3 tokens and the edges on its path
    size = budget + 1
    contexts: list[tuple[int, ...]] = [()] * size
    contexts[0] = tuple(root_context[-3:])
    edges: list[frozenset[tuple[int, int]]] = [frozenset()] * size
    bases = [0.0] * size  # per expanded node: -(its score x the hit mass of its children's depth)
    options: list[list[Candidate]] = [[]] * size
    # heap entries: (-score, tiebreak, parent, rank); rank -1 marks "expand parent", whose
    # score is an upper bound (q <= 1) of its children's, so expansion waits until needed
    heap: list[tuple[float, int, int, int]] = [(-masses[0], 0, 0, -1)]
    counter = 0
    push, pop = heapq.heappush, heapq.heappop

    while heap and len(tokens) < size:
        neg_score, _, parent, rank = pop(heap)
        if rank < 0:  # expand: fetch the parent's candidates and offer its best child
            if parent:
                up = parents[parent]
                contexts[parent] = (contexts[up] + (tokens[parent],))[-3:]
                edges[parent] = edges[up] | {(tokens[up], tokens[parent])}
            token, path_edges = tokens[parent], edges[parent]
            found: list[Candidate] = []
            for candidate in zip(*candidates(contexts[parent])):
                t = candidate[0]
                if t in blocked or (token, t) in path_edges:
                    continue
                found.append(candidate)
                if len(found) == max_width:
                    break
            options[parent] = found
            bases[parent] = neg_score
            if found:
                counter += 1
                push(heap, (neg_score * found[0][1], counter, parent, 0))
            continue
        siblings = options[parent]
        token, _, source = siblings[rank]
        node = len(tokens)
        depth = depths[parent] + 1
        tokens.append(token)
        parents.append(parent)
        depths.append(depth)
        sources.append(source)
        ranks.append(node - 1)
        children.append([])
        children[parent].append(node)
        if rank + 1 < len(siblings):
            counter += 1
            push(heap, (bases[parent] * siblings[rank + 1][1], counter, parent, rank + 1))
        if depth < max_depth:
            counter += 1
            push(heap, (neg_score * masses[depth], counter, node, -1))
    return tree.depth_first()
