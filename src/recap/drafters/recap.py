"""RECAP: recycled top-k predictions under 1-, 2- and 3-token keys, fused by
entropy-confidence weighting, drafted as a best-first tree plus a suffix continuation.

The hot path (fusion, tree search, layout, memory writes) runs compiled
(``recap.kernels``); ``recap.reference.fusion`` and ``recap.reference.tree_builder`` are its
readable references.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..config import RecapConfig
from ..core.accept import Acceptance
from ..core.memory import ContextTable, TokenMemory
from ..core.step_cost import StepCost
from ..core.suffix import SuffixIndex
from ..core.topk import TopK
from ..core.tree import DraftTree, Source
from ..kernels import drafting, tables
from ..kernels.cells import cell_index


def collapse_runs(tokens: Sequence[int], placeholder_ids: frozenset[int]) -> list[int]:
    """``tokens`` with every run of one placeholder token (an image's) kept once."""
    out: list[int] = []
    for t in tokens:
        if t in placeholder_ids and out and out[-1] == t:
            continue
        out.append(t)
    return out


class FrequentTokens:
    """Counts of a request's text tokens and its ``k`` most frequent ones (the fallback for a
    context no memory knows), kept up to date token by token."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.counts: dict[int, int] = {}
        self.total = 0
        self.top: list[int] = []  # at most k tokens, most frequent first (ties: seen first)
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, tokens: Sequence[int]) -> None:
        counts, top = self.counts, self.top
        for t in tokens:
            counts[t] = c = counts.get(t, 0) + 1
            self.total += 1
            if t in top:
                i = top.index(t)
            elif len(top) < self.k:
                top.append(t)
                i = len(top) - 1
            elif c > counts[top[-1]]:
                top[-1] = t
                i = len(top) - 1
            else:
                continue
            while i > 0 and counts[top[i - 1]] < c:
                top[i - 1], top[i] = top[i], top[i - 1]
                i -= 1
        self._arrays = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens [F] int64, their share of the request's tokens [F] float64)."""
        if self._arrays is None:
            total = self.total or 1
            self._arrays = (
                np.asarray(self.top, dtype=np.int64),
                np.asarray([self.counts[t] / total for t in self.top], dtype=np.float64),
            )
        return self._arrays


class RecapDrafter:
    name = "recap"

    def __init__(
        self,
        config: RecapConfig,
        memory: TokenMemory,
        placeholder_ids: frozenset[int] = frozenset(),
        cost: StepCost | None = None,
    ) -> None:
        if memory.k < config.k:
            raise ValueError(f"the token memory keeps k={memory.k} candidates but the config asks for k={config.k}")
        if memory.vocab_size > tables.MAX_TOKEN + 1:
            raise ValueError(
                f"RECAP's context keys hold token ids below {tables.MAX_TOKEN + 1}; this vocabulary has "
                f"{memory.vocab_size} tokens. Use method='token_recycling' or 'pld'."
            )
        if config.persistent_context:
            rows, per_table = config.node_budget + 1 + config.suffix_tokens, memory.max_context_rows // 2
            if rows > per_table // 2:
                raise ValueError(
                    f"a step of this config writes up to {rows} rows a table but the memory keeps "
                    f"{per_table} a table (max_context_rows={memory.max_context_rows}): give the TokenMemory "
                    f"max_context_rows >= {4 * rows}, or lower node_budget"
                )
        self.config = config
        self.memory = memory
        self.placeholder_ids = placeholder_ids
        self.cost = cost if config.adaptive_budget else None
        # the 2-/3-token rows: the memory's shared tables when rows are kept across requests (this
        # request's rows carry its stamp), else tables of this drafter's own, cleared per request
        if config.persistent_context:
            self.context = memory.context
        else:
            self.context = {2: ContextTable(2, memory.k), 3: ContextTable(3, memory.k)}
        self.stamp = 1
        self.suffix = SuffixIndex()
        self.frequent = FrequentTokens(config.k)
        self._placeholder_mask = np.zeros(memory.vocab_size, dtype=bool)
        self._placeholder_mask[[t for t in placeholder_ids if 0 <= t < memory.vocab_size]] = True
        # use[o]: key order o is used; use[0]: the persistent 2-/3-token rows are
        self._use = np.asarray([config.persistent_context, *(o in config.key_orders for o in (1, 2, 3))])
        self._write = self._use[1:].copy()  # which memories a step writes: the token memory, 2-/3-token tables
        self._specificity = np.asarray(config.specificity, dtype=np.float64)
        self._hit_masses = np.asarray([config.hit_mass(d) for d in range(1, config.max_depth + 1)])
        self._calibrated = config.scoring == "calibrated"
        # rows are learned from every verified node only with the full-tree scope: only then do they count
        self._node_value = config.row_value if config.write_scope == "full-tree" else 0.0
        self._empty = np.zeros(0, dtype=np.int64)
        self._no_costs = np.zeros(0, dtype=np.float64)
        self._root_context = np.full(3, -1, dtype=np.int64)
        self._cells = self._empty  # [N] calibration cell of each node of the last tree

    # -- request lifecycle -------------------------------------------------------------
    def prefill_positions(self, prompt_ids: Sequence[int]) -> list[int]:
        """Prompt positions whose top-k seed the memories: the first occurrence of each
        distinct text token (token memory), or every text position when the contextual
        memories are seeded too."""
        cfg = self.config
        seed_context = cfg.seed_context_from_prefill and bool(self._use[2] or self._use[3])
        if not ((cfg.seed_from_prefill and self._use[1]) or seed_context):
            return []
        seen: set[int] = set()
        positions = []
        for i, t in enumerate(prompt_ids):
            if t in self.placeholder_ids or (t in seen and not seed_context):
                continue
            seen.add(t)
            positions.append(i)
        return positions

    def begin(self, prompt_ids: Sequence[int], positions: Sequence[int], prompt_topk: TopK | None) -> None:
        if self.config.persistent_context:
            self.memory.release_stamp(self.stamp)  # a drafter begun again without ``end``
            self.stamp = self.memory.new_stamp()
        else:
            for table in self.context.values():
                table.clear()
        if not self.config.persistent:
            self.memory.clear()
        if prompt_topk is not None and len(positions):
            ids = np.asarray(prompt_ids, dtype=np.int64)
            at = np.asarray(positions, dtype=np.int64)
            if self.config.seed_from_prefill and self._use[1]:
                self.memory.write(ids[at], prompt_topk)  # first occurrence of each token wins
            if self.config.seed_context_from_prefill:
                self._seed_context(ids, at, prompt_topk)
        self.suffix = SuffixIndex()
        self.suffix.extend(collapse_runs(prompt_ids, self.placeholder_ids))
        self.frequent = FrequentTokens(self.config.k)
        self.frequent.add([t for t in prompt_ids if t not in self.placeholder_ids])
        # the context of the prompt's last token, in case the first verified row is there (vLLM)
        self._set_root(prompt_ids)
        self._cells = self._empty

    def _seed_context(self, ids: np.ndarray, at: np.ndarray, topk: TopK) -> None:
        """Rows of the prompt's text positions under their last 2 and 3 prompt tokens."""
        parents = np.arange(-1, len(ids) - 1, dtype=np.int64)
        keys2, keys3 = tables.node_context_keys(ids, parents, at, np.full(2, -1, np.int64), self._placeholder_mask)
        rows = np.arange(len(at), dtype=np.int64)
        with self.memory.lock:
            now = self.memory.tick()
            for order, keys in ((2, keys2), (3, keys3)):
                if self._use[order]:
                    self.context[order].write_packed(keys, rows, topk, stamp=self.stamp, used=now)

    def end(self) -> None:
        if self.config.persistent_context:
            self.memory.release_stamp(self.stamp)  # its rows now age like any kept row
        else:
            for table in self.context.values():
                table.clear()

    # -- drafting ----------------------------------------------------------------------
    def _suffix_path(self) -> tuple[np.ndarray, int]:
        """The suffix-matched continuation (cut at a placeholder token) and its match length."""
        length, end = self.suffix.longest_repeat()
        if length == 0 or not self.config.suffix_tokens:
            return self._empty, 0
        path = self.suffix.text[end + 1 : end + 1 + self.config.suffix_tokens]
        for i, token in enumerate(path):
            if token in self.placeholder_ids:
                path = path[:i]
                break
        return np.asarray(path, dtype=np.int64), length

    def _set_root(self, history: Sequence[int]) -> None:
        """The root of the next verified tree is ``history[-1]``: keep its last 3 tokens."""
        context = self._root_context
        if len(history) >= 3:  # three scalar writes: a slice assignment from a list costs more in the loop
            context[0], context[1], context[2] = history[-3], history[-2], history[-1]
            return
        context[:] = -1
        tail = history[-3:]
        context[3 - len(tail) :] = tail

    def propose(self, history: Sequence[int]) -> DraftTree:
        cfg = self.config
        self._set_root(history)
        context = self._root_context
        suffix, suffix_length = self._suffix_path()
        fallback_tokens, fallback_q = self.frequent.arrays() if cfg.frequency_fallback else (self._empty, self._empty)
        cell_probs = self.memory.calibration.probabilities()
        budget, step_costs = cfg.node_budget, self._no_costs
        if self.cost is not None:  # the size of this step: forced (probes, exploration) or chosen as built
            forced = self.cost.plan()
            if forced is None:
                step_costs = self.cost.dense()
            else:
                budget = forced - 1
        with self.memory.lock:
            built = drafting.build_tree(
                root_context=context, token_memory=self.memory.arrays,
                tables=(self.context[2].arrays, self.context[3].arrays), use=self._use, stamp=self.stamp,
                now=self.memory.tick(),
                fusion=cfg.fusion, specificity=self._specificity, fallback_tokens=fallback_tokens,
                fallback_q=fallback_q, budget=budget, max_depth=cfg.max_depth, max_width=cfg.max_width,
                calibrated=self._calibrated, hit_masses=self._hit_masses, cell_probs=cell_probs,
                placeholder_mask=self._placeholder_mask, suffix=suffix if self._calibrated else self._empty,
                suffix_length=suffix_length, step_costs=step_costs, node_value=self._node_value,
                valued_nodes=cfg.row_value_nodes, rows_need_drafts=cfg.row_value_needs_drafts,
            )  # fmt: skip
        if self.cost is not None:
            if self.cost.expecting:  # only the start-up probes read it: no sum on every later step
                self.cost.expect(float(built.probs.sum()))
            if len(step_costs):
                self.cost.picked(built.keep)
        if self._calibrated or not len(suffix):
            graft, graft_cells = self._empty, self._empty
        else:
            graft = suffix
            graft_cells = np.asarray(
                [cell_index(int(Source.SUFFIX), depth, suffix_length) for depth in range(1, len(suffix) + 1)]
            )
        graft_probs = cell_probs[graft_cells]
        tree = drafting.layout(built, graft, graft_probs, graft_cells)
        self._cells = tree.cells
        return DraftTree(tokens=tree.tokens, parents=tree.parents, depths=tree.depths, sources=tree.sources,
                         probs=tree.probs)  # fmt: skip

    def best_path(self, tree: DraftTree, max_tokens: int, min_prob: float = 0.0) -> np.ndarray:
        """The node indices (root first) of the path ``best_chain`` returns."""
        n = len(tree)
        score = np.zeros(n, dtype=np.float64)
        ok = np.zeros(n, dtype=bool)
        ok[0] = True
        probs = tree.probs if tree.probs is not None else np.ones(n, dtype=np.float64)
        best = 0
        for i in range(1, n):  # parents precede children
            p = int(tree.parents[i])
            if not ok[p] or tree.depths[i] > max_tokens or probs[i] < min_prob:
                continue
            ok[i] = True
            score[i] = score[p] + probs[i]
            if score[i] > score[best]:
                best = i
        return np.asarray(tree.path(best), dtype=np.int64)

    def best_chain(self, tree: DraftTree, max_tokens: int, min_prob: float = 0.0) -> DraftTree:
        """The one path of ``tree`` (just returned by ``propose``) for an engine that verifies a
        chain per step (vLLM): among root-to-node paths of at most ``max_tokens`` drafts whose
        every node's path probability is at least ``min_prob``, the one with the most expected
        accepted tokens (the sum of its nodes' ``probs``; the first in node order on a tie). A
        chain is a ``DraftTree`` with one path, and ``observe`` learns from it as from a tree."""
        path = self.best_path(tree, max_tokens, min_prob)
        m = len(path)
        if len(self._cells) == len(tree):
            self._cells = self._cells[path]
        return DraftTree(
            tokens=tree.tokens[path],
            parents=np.arange(-1, m - 1, dtype=np.int64),
            depths=np.arange(m, dtype=np.int64),
            sources=tree.sources[path],
            probs=None if tree.probs is None else tree.probs[path],
        )

    def chain_first(self, tree: DraftTree, max_nodes: int, max_chain: int | None = None) -> DraftTree:
        """``tree`` (just returned by ``propose``) for an engine that verifies it in fixed slots
        (vLLM's tree mode): the nodes of ``best_chain(tree, max_chain)`` first, in depth order,
        then the others in their order, cut to ``max_nodes`` drafts (root excluded). Parents
        still precede children, so every prefix of the result is a tree; ``observe`` learns from
        it (or from such a prefix of it) as from the tree."""
        n = len(tree)
        path = self.best_path(tree, int(tree.depths.max()) if max_chain is None else max_chain)[1:]
        on_path = np.zeros(n, dtype=bool)
        on_path[path] = True
        order = np.asarray([0, *path, *np.nonzero(~on_path)[0][1:]], dtype=np.int64)[: max_nodes + 1]
        where = np.full(n, -1, dtype=np.int64)
        where[order] = np.arange(len(order))
        parents = np.where(tree.parents[order] >= 0, where[np.maximum(tree.parents[order], 0)], -1)
        if len(self._cells) == n:
            self._cells = self._cells[order]
        return DraftTree(
            tokens=tree.tokens[order],
            parents=parents,
            depths=tree.depths[order],
            sources=tree.sources[order],
            probs=None if tree.probs is None else tree.probs[order],
        )

    # -- learning ----------------------------------------------------------------------
    def observe(self, tree: DraftTree, topk: TopK, acceptance: Acceptance, committed: Sequence[int]) -> None:
        path = np.asarray(acceptance.path, dtype=np.int64)
        rows = len(path) if self.config.write_scope == "committed" else len(tree)
        cells = self._cells if len(self._cells) == len(tree) else self._empty
        calibration = self.memory.calibration
        pair = (self.context[2], self.context[3])
        with self.memory.lock, calibration.lock:
            for table in pair:
                table.reserve(rows)
            added = tables.learn_tree(
                tree.tokens, tree.parents, path, self.config.write_scope == "committed", self._root_context[:2],
                self._placeholder_mask, self.memory.arrays, (pair[0].arrays, pair[1].arrays), self._write, self.stamp,
                self.memory.clock, topk.ids, topk.probs, cells, calibration.arrays,
            )  # fmt: skip
            pair[0].count += int(added[0])
            pair[1].count += int(added[1])
        text = collapse_runs(committed, self.placeholder_ids)
        self.suffix.extend(text)
        self.frequent.add([t for t in text if t not in self.placeholder_ids])
