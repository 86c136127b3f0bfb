"""Prompt lookup decoding: an n-gram match in the current context drafts a chain."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..core.accept import Acceptance
from ..core.topk import TopK
from ..core.tree import DraftTree, Source


def lookup_continuation(history: np.ndarray, max_ngram: int, min_ngram: int, num_tokens: int) -> list[int]:
    """Tokens that followed the most recent earlier occurrence of the longest matching
    final n-gram of ``history`` [L] (n from ``max_ngram`` down to ``min_ngram``)."""
    length = len(history)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        # windows starting at 0 .. length-n-1, so that a token follows every match
        windows = sliding_window_view(history[: length - 1], n)
        hits = np.nonzero((windows == history[length - n :]).all(axis=1))[0]
        if hits.size:
            start = int(hits[-1]) + n
            return history[start : start + num_tokens].tolist()
    return []


class PromptLookupDrafter:
    name = "pld"

    def __init__(
        self,
        max_ngram: int = 3,
        min_ngram: int = 1,
        num_tokens: int = 10,
        placeholder_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.max_ngram, self.min_ngram, self.num_tokens = max_ngram, min_ngram, num_tokens
        self.placeholder_ids = placeholder_ids

    def prefill_positions(self, prompt_ids: Sequence[int]) -> list[int]:
        return []

    def begin(self, prompt_ids: Sequence[int], positions: Sequence[int], prompt_topk: TopK | None) -> None:
        pass

    def propose(self, history: Sequence[int]) -> DraftTree:
        chain = lookup_continuation(
            np.asarray(history, dtype=np.int64), self.max_ngram, self.min_ngram, self.num_tokens
        )
        for i, token in enumerate(chain):
            if token in self.placeholder_ids:
                chain = chain[:i]
                break
        n = len(chain)
        return DraftTree.from_lists(
            [history[-1], *chain], list(range(-1, n)), [int(Source.ROOT)] + [int(Source.NGRAM)] * n
        )

    def observe(self, tree: DraftTree, topk: TopK, acceptance: Acceptance, committed: Sequence[int]) -> None:
        pass

    def end(self) -> None:
        pass
