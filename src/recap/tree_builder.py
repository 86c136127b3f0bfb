"""Best-first construction of a draft tree from fused candidates, and the suffix graft."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from .fusion import Fused
from .tree import DraftTree, Source

CandidateFn = Callable[[tuple[int, ...]], Fused]
Candidate = tuple[int, float, int]  # token, q, source


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
    Work is lazy: a node's candidates are fetched only when its best possible child could
    still make the budget, and a sibling is offered only when the previous one is taken.
    Returns the tree in depth-first layout.
    """
    tree = TreeLists(root_context[-1])
    contexts = [tuple(root_context[-3:])]
    edges: list[frozenset[tuple[int, int]]] = [frozenset()]
    depths = [0]
    scores = [1.0]
    options: list[list[Candidate]] = [[]]
    # heap entries: (-score, tiebreak, parent, rank); rank -1 marks "expand parent", whose
    # score is an upper bound (q <= 1) of its children's, so expansion waits until needed
    heap: list[tuple[float, int, int, int]] = [(-hit_mass(1), 0, 0, -1)]
    counter = 0

    def push(parent: int, rank: int, q: float) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(heap, (-scores[parent] * hit_mass(depths[parent] + 1) * q, counter, parent, rank))

    while heap and len(tree.tokens) <= budget:
        neg_score, _, parent, rank = heapq.heappop(heap)
        if rank < 0:  # expand: fetch the parent's candidates and offer its best child
            token, path_edges = tree.tokens[parent], edges[parent]
            found: list[Candidate] = []
            for candidate in zip(*candidates(contexts[parent])):
                t = candidate[0]
                if t in blocked or (token, t) in path_edges:
                    continue
                found.append(candidate)
                if len(found) == max_width:
                    break
            options[parent] = found
            if found:
                push(parent, 0, found[0][1])
            continue
        token, _, source = options[parent][rank]
        node = tree.add(parent, token, source)
        contexts.append((contexts[parent] + (token,))[-3:])
        edges.append(edges[parent] | {(tree.tokens[parent], token)})
        depths.append(depths[parent] + 1)
        scores.append(-neg_score)
        options.append([])
        siblings = options[parent]
        if rank + 1 < len(siblings):
            push(parent, rank + 1, siblings[rank + 1][1])
        if depths[node] < max_depth:
            push(node, -1, 1.0)
    return tree.depth_first()
