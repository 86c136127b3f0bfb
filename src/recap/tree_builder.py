"""Best-first construction of a draft tree from fused candidates, and the suffix graft."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from .fusion import Candidate
from .tree import DraftTree, Source

CandidateFn = Callable[[tuple[int, ...]], Sequence[Candidate]]


class TreeLists:
    """A tree under construction, as plain lists (node 0 is the root)."""

    __slots__ = ("tokens", "parents", "sources", "children")

    def __init__(self, root: int) -> None:
        self.tokens = [root]
        self.parents = [-1]
        self.sources = [int(Source.ROOT)]
        self.children: list[list[int]] = [[]]

    def add(self, parent: int, token: int, source: int) -> int:
        node = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.sources.append(source)
        self.children.append([])
        self.children[parent].append(node)
        return node

    def depth_first(self) -> TreeLists:
        """The same tree with nodes renumbered in depth-first preorder, children in the
        order they were added (best first), so the likeliest chain is contiguous."""
        order: list[int] = []
        stack = [0]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(reversed(self.children[node]))
        new_index = {old: new for new, old in enumerate(order)}
        out = TreeLists(self.tokens[0])
        for old in order[1:]:
            out.add(new_index[self.parents[old]], self.tokens[old], self.sources[old])
        return out

    def graft(self, path: Sequence[int], source: int = int(Source.SUFFIX)) -> None:
        """Add ``path`` as a chain below the root, reusing nodes that already hold it."""
        node = 0
        for token in path:
            for child in self.children[node]:
                if self.tokens[child] == token:
                    node = child
                    break
            else:
                node = self.add(node, token, source)

    def freeze(self) -> DraftTree:
        return DraftTree.from_lists(self.tokens, self.parents, self.sources)


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
    Siblings are pushed lazily (the next one when the previous is taken), so the heap
    stays small. Returns the tree in depth-first layout.
    """
    tree = TreeLists(root_context[-1])
    contexts = [tuple(root_context[-3:])]
    edges: list[frozenset[tuple[int, int]]] = [frozenset()]
    depths = [0]
    scores = [1.0]
    options: list[list[Candidate]] = [[]]
    heap: list[tuple[float, int, int, int]] = []
    counter = 0

    def expand(node: int) -> None:
        nonlocal counter
        depth = depths[node] + 1
        if depth > max_depth:
            return
        token, path_edges = tree.tokens[node], edges[node]
        found = [c for c in candidates(contexts[node]) if c[0] not in blocked and (token, c[0]) not in path_edges][
            :max_width
        ]
        options[node] = found
        if found:
            counter += 1
            heapq.heappush(heap, (-scores[node] * hit_mass(depth) * found[0][1], counter, node, 0))

    expand(0)
    while heap and len(tree.tokens) <= budget:
        neg_score, _, parent, rank = heapq.heappop(heap)
        token, _, source = options[parent][rank]
        node = tree.add(parent, token, source)
        contexts.append((contexts[parent] + (token,))[-3:])
        edges.append(edges[parent] | {(tree.tokens[parent], token)})
        depths.append(depths[parent] + 1)
        scores.append(-neg_score)
        options.append([])
        siblings = options[parent]
        if rank + 1 < len(siblings):
            counter += 1
            score = scores[parent] * hit_mass(depths[node]) * siblings[rank + 1][1]
            heapq.heappush(heap, (-score, counter, parent, rank + 1))
        expand(node)
    return tree.depth_first()
