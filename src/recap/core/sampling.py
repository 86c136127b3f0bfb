"""Sample-then-walk: the tokens plain decoding would emit, read off a verified draft tree.

Drafts recycled from a memory are point masses, so the lossless rule is simple: at the root, pick
the next token exactly as plain decoding would (processors applied to that node's own prefix, then
argmax or one multinomial draw); if a child of the node holds that token, move to it and pick again
from its logits; stop at the first pick that no child holds: that pick is the bonus token. Every
emitted token is picked from the target's distribution given the emitted prefix, one pick per token
in sequence order, so with the same random stream the output equals plain decoding's token for
token (``generate(do_sample=True)`` under the same seed), and greedy with processors is exact too.
The probability of accepting a child is the target's probability of its token: no lossless rule
does better with point-mass drafts.
"""

from __future__ import annotations

from collections.abc import Callable

from .accept import Acceptance
from .tree import DraftTree


def children_by_token(tree: DraftTree) -> dict[tuple[int, int], int]:
    """(node, token) -> the child of ``node`` holding ``token``.

    Duplicate siblings (the same token twice under one parent, as a fused tree can hold) share a
    prefix: the first in node order stands for all of them, and the children of the others are
    found under it, so the walk can follow the deepest continuation whichever copy holds it.
    """
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    canonical = list(range(len(tokens)))
    children: dict[tuple[int, int], int] = {}
    for i in range(1, len(tokens)):
        key = (canonical[parents[i]], tokens[i])
        canonical[i] = children.setdefault(key, i)
    return children


def walk(tree: DraftTree, choose: Callable[[int], int], push: Callable[[int], bool]) -> tuple[Acceptance, bool]:
    """Emit tokens along ``tree`` as plain decoding would.

    ``choose(node)``: the next token after ``node``'s path (its logits processed with the prefix so
    far, then argmax or a draw); ``push(token)``: append it to the sequence, True if generation stops
    with it. Returns (acceptance, stopped): the path of nodes whose tokens were emitted (root first;
    the real parent chain, usable for the KV-cache commit) and the bonus, the last token emitted,
    which no child on the path holds or with which generation stopped. The tokens emitted are those
    of the path after the root, then the bonus.
    """
    children = children_by_token(tree)
    node = 0
    while True:
        token = choose(node)
        if push(token):
            return Acceptance(path=tree.path(node), bonus=token), True
        child = children.get((node, token))
        if child is None:
            return Acceptance(path=tree.path(node), bonus=token), False
        node = child
