"""Token Recycling (Luo et al., ACL 2025), as in its official release.

A zero-initialised [vocab, 8] table of top-8 candidates keyed by one token, never reset
(hot start across requests); a static 80-node template tree walked through the table each
step; after verification every tree node's row is overwritten with its top-8.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources

import numpy as np

from ..core.accept import Acceptance
from ..core.memory import TokenMemory
from ..core.topk import TopK
from ..core.tree import DraftTree, Source

TEMPLATE_FILE = "tr_tree_2.2.2.json"


class Template:
    """A static tree given as top-k rank paths from the root, in breadth-first order.

    parents: [N] int64 (root first), ranks: [N] int64 (rank of each node among its
    parent's candidates; 0 for the root), depths: [N] int64.
    """

    def __init__(self, paths: Sequence[Sequence[int]]) -> None:
        index = {(): 0}
        parents, ranks, depths = [-1], [0], [0]
        for path in paths:
            key = tuple(int(r) for r in path)
            if not key or key[:-1] not in index or key in index:
                raise ValueError(f"template path {list(path)} must extend an earlier path by one rank, once")
            index[key] = len(parents)
            parents.append(index[key[:-1]])
            ranks.append(key[-1])
            depths.append(len(key))
        self.parents = np.asarray(parents, dtype=np.int64)
        self.ranks = np.asarray(ranks, dtype=np.int64)
        self.depths = np.asarray(depths, dtype=np.int64)
        self.levels = [np.nonzero(self.depths == d)[0] for d in range(1, int(self.depths.max()) + 1)]
        self.k = int(self.ranks.max()) + 1

    @staticmethod
    def default() -> Template:
        text = resources.files("recap.data").joinpath(TEMPLATE_FILE).read_text()
        return Template(json.loads(text)["paths"])


class TokenRecyclingDrafter:
    name = "token_recycling"

    def __init__(self, table: TokenMemory, template: Template | None = None) -> None:
        self.table = table
        self.template = template or Template.default()
        if self.template.k > table.k:
            raise ValueError(f"the template uses rank {self.template.k - 1} but the table keeps k={table.k}")
        self._sources = np.full(len(self.template.parents), int(Source.TEMPLATE), dtype=np.int8)
        self._sources[0] = int(Source.ROOT)

    def prefill_positions(self, prompt_ids: Sequence[int]) -> list[int]:
        return []  # the official code does not seed the table from the prompt

    def begin(self, prompt_ids: Sequence[int], positions: Sequence[int], prompt_topk: TopK | None) -> None:
        pass

    def propose(self, history: Sequence[int]) -> DraftTree:
        t = self.template
        tokens = np.empty(len(t.parents), dtype=np.int64)
        tokens[0] = history[-1]
        ids = self.table.ids
        with self.table.lock:
            for level in t.levels:
                tokens[level] = ids[tokens[t.parents[level]], t.ranks[level]]
        return DraftTree(tokens=tokens, parents=t.parents, depths=t.depths, sources=self._sources)

    def observe(self, tree: DraftTree, topk: TopK, acceptance: Acceptance, committed: Sequence[int]) -> None:
        self.table.write(tree.tokens, topk)

    def end(self) -> None:
        pass
