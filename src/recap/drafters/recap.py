"""RECAP: recycled top-k predictions under 1-, 2- and 3-token keys, fused by
entropy-confidence weighting, drafted as a best-first tree plus a suffix continuation."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from ..accept import Acceptance
from ..config import RecapConfig
from ..fusion import Fused, fuse_rows
from ..memory import ContextMemory, Row, TokenMemory
from ..suffix import SuffixIndex
from ..topk import TopK
from ..tree import DraftTree, Source
from ..tree_builder import build_tree


def collapse_runs(tokens: Sequence[int], blocked: frozenset[int]) -> list[int]:
    """``tokens`` with every run of one blocked token (an image's placeholders) kept once."""
    out: list[int] = []
    for t in tokens:
        if t in blocked and out and out[-1] == t:
            continue
        out.append(t)
    return out


class RecapDrafter:
    name = "recap"

    def __init__(self, config: RecapConfig, memory: TokenMemory, blocked: frozenset[int] = frozenset()) -> None:
        if memory.k < config.k:
            raise ValueError(f"the token memory keeps k={memory.k} candidates but the config asks for k={config.k}")
        self.config = config
        self.memory = memory
        self.blocked = blocked
        self.context = {2: ContextMemory(2), 3: ContextMemory(3)}
        self.suffix = SuffixIndex()
        self._use = set(config.key_orders)
        self._use1, self._use2, self._use3 = (o in self._use for o in (1, 2, 3))
        self._root_context: tuple[int, ...] = ()
        self._counts: Counter[int] = Counter()  # text tokens of this request (prompt + output)
        self._fallback: Fused | None = None  # cached until the next commit
        self.node_budget = config.node_budget  # set per step by the decode loop when the budget adapts

    # -- request lifecycle -------------------------------------------------------------
    def prefill_positions(self, prompt_ids: Sequence[int]) -> list[int]:
        """Prompt positions whose top-k seed the memories: the first occurrence of each
        distinct text token (token memory), or every text position when the contextual
        memories are seeded too."""
        cfg = self.config
        seed_context = cfg.seed_context_from_prefill and (self._use2 or self._use3)
        if not ((cfg.seed_from_prefill and self._use1) or seed_context):
            return []
        seen: set[int] = set()
        positions = []
        for i, t in enumerate(prompt_ids):
            if t in self.blocked or (t in seen and not seed_context):
                continue
            seen.add(t)
            positions.append(i)
        return positions

    def begin(self, prompt_ids: Sequence[int], positions: Sequence[int], prompt_topk: TopK | None) -> None:
        for memory in self.context.values():
            memory.clear()
        if not self.config.persistent:
            self.memory.clear()
        if prompt_topk is not None and len(positions):
            ids = np.asarray(prompt_ids, dtype=np.int64)
            at = np.asarray(positions, dtype=np.int64)
            if self.config.seed_from_prefill and self._use1:
                self.memory.write(ids[at], prompt_topk)  # first occurrence of each token wins
            if self.config.seed_context_from_prefill:
                self._seed_context(ids, at, prompt_topk)
        self.suffix = SuffixIndex()
        self.suffix.extend(collapse_runs(prompt_ids, self.blocked))
        self._counts = Counter(t for t in prompt_ids if t not in self.blocked)
        self._fallback = None

    def _seed_context(self, ids: np.ndarray, at: np.ndarray, topk: TopK) -> None:
        """Rows of the prompt's text positions under their last 2 and 3 prompt tokens."""
        rows = list(zip(topk.ids.tolist(), topk.probs.tolist(), topk.concentration.tolist()))
        text = [int(t) not in self.blocked for t in ids]
        tokens = ids.tolist()
        for order in (2, 3):
            if order not in self._use:
                continue
            keys, kept = [], []
            for row, i in zip(rows, at.tolist()):
                if i + 1 >= order and all(text[i - order + 1 : i + 1]):
                    keys.append(tuple(tokens[i - order + 1 : i + 1]))
                    kept.append(row)
            self.context[order].write_many(keys, kept)

    def end(self) -> None:
        for memory in self.context.values():
            memory.clear()

    # -- drafting ----------------------------------------------------------------------
    def candidates(self, context: tuple[int, ...]) -> Fused:
        """Fused candidates for a node whose last (up to 3) tokens are ``context``."""
        rows: list[tuple[int, Row]] = []
        if self._use3 and len(context) == 3:
            row = self.context[3].get(context)
            if row is not None:
                rows.append((3, row))
        if self._use2 and len(context) >= 2:
            row = self.context[2].get(context[-2:])
            if row is not None:
                rows.append((2, row))
        if self._use1:
            row = self.memory.row(context[-1])
            if row is not None:
                rows.append((1, row))
        if not rows and self.config.frequency_fallback:
            return self.frequent_tokens()
        return fuse_rows(rows, self.config.fusion, self.config.specificity)

    def frequent_tokens(self) -> Fused:
        """The fallback for a context no memory knows: the request's ``k`` most frequent text
        tokens, q = their share. Drafting them also gives those nodes rows once verified,
        which is how coverage grows from a cold start."""
        if self._fallback is None:
            total = sum(self._counts.values()) or 1
            top = self._counts.most_common(self.config.k)
            self._fallback = (
                [t for t, _ in top],
                [c / total for _, c in top],
                [int(Source.FREQUENCY)] * len(top),
            )
        return self._fallback

    def propose(self, history: Sequence[int]) -> DraftTree:
        cfg = self.config
        self._root_context = tuple(history[-3:])
        lists = build_tree(
            self._root_context,
            self.candidates,
            budget=self.node_budget,
            max_depth=cfg.max_depth,
            max_width=cfg.max_width,
            hit_mass=cfg.hit_mass,
            blocked=self.blocked,
        )
        if cfg.suffix_tokens:
            path = self.suffix.continuation(cfg.suffix_tokens)
            for i, token in enumerate(path):
                if token in self.blocked:
                    path = path[:i]
                    break
            lists.graft(path)
        return lists.freeze()

    # -- learning ----------------------------------------------------------------------
    def observe(self, tree: DraftTree, topk: TopK, acceptance: Acceptance, committed: Sequence[int]) -> None:
        if self.config.write_scope == "committed":
            nodes = np.asarray(acceptance.path, dtype=np.int64)
        else:
            nodes = np.arange(len(tree), dtype=np.int64)
        tokens = tree.tokens
        if 1 in self._use:
            self.memory.write(tokens[nodes], topk, rows=nodes)
        if self._use & {2, 3}:
            self._write_context(tree, topk, nodes)
        self.suffix.extend(collapse_runs(committed, self.blocked))
        self._counts.update(t for t in committed if t not in self.blocked)
        self._fallback = None

    def _write_context(self, tree: DraftTree, topk: TopK, nodes: np.ndarray) -> None:
        """Write each node's row under its last 2 and 3 tokens along its own path."""
        tokens, parents = tree.tokens, tree.parents
        ctx = self._root_context
        prev1 = np.empty_like(tokens)
        prev2 = np.empty_like(tokens)
        prev1[0] = ctx[-2] if len(ctx) >= 2 else -1
        prev2[0] = ctx[-3] if len(ctx) >= 3 else -1
        prev1[1:] = tokens[parents[1:]]
        prev2[1:] = prev1[parents[1:]]
        rows = list(zip(topk.ids[nodes].tolist(), topk.probs[nodes].tolist(), topk.concentration[nodes].tolist()))
        t0, t1, t2 = tokens[nodes], prev1[nodes], prev2[nodes]
        invalid1 = t1 < 0
        if self.blocked:
            blocked = np.fromiter(self.blocked, dtype=np.int64)
            invalid1 |= np.isin(t1, blocked) | np.isin(t0, blocked)
            invalid2 = invalid1 | (t2 < 0) | np.isin(t2, blocked)
        else:
            invalid2 = invalid1 | (t2 < 0)
        for order, invalid, key_columns in ((2, invalid1, (t1, t0)), (3, invalid2, (t2, t1, t0))):
            if order not in self._use:
                continue
            keys = list(zip(*(column.tolist() for column in key_columns)))
            kept = rows
            if invalid.any():
                valid = np.nonzero(~invalid)[0].tolist()
                keys = [keys[j] for j in valid]
                kept = [rows[j] for j in valid]
            self.context[order].write_many(keys, kept)
