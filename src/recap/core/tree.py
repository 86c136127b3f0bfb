"""The one draft-tree type shared by drafters, backends and tests."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from .. import codes
from ..kernels.verify import ancestor_mask


class Source(IntEnum):
    """Where a draft node came from (for statistics); the codes are ``recap.codes.SOURCE_*``."""

    ROOT = codes.SOURCE_ROOT
    ORDER1 = codes.SOURCE_ORDER1  # the persistent token memory (1-token key)
    ORDER2 = codes.SOURCE_ORDER2  # the request-local 2-token memory
    ORDER3 = codes.SOURCE_ORDER3  # the request-local 3-token memory
    SUFFIX = codes.SOURCE_SUFFIX  # the suffix-matched continuation
    TEMPLATE = codes.SOURCE_TEMPLATE  # Token Recycling's static template
    NGRAM = codes.SOURCE_NGRAM  # prompt lookup
    FREQUENCY = codes.SOURCE_FREQUENCY  # RECAP's fallback: the request's most frequent tokens
    PERSISTENT2 = codes.SOURCE_PERSISTENT2  # the persistent 2-token memory (where the request has no row)
    PERSISTENT3 = codes.SOURCE_PERSISTENT3  # the persistent 3-token memory (likewise)


_KEY_ORDERS = {Source.ORDER1: 1, Source.ORDER2: 2, Source.ORDER3: 3, Source.PERSISTENT2: 2, Source.PERSISTENT3: 3}


def key_order(source: int) -> int:
    """The number of tokens in the key of a memory source (ORDER1/2/3, PERSISTENT2/3)."""
    return _KEY_ORDERS[source]


@dataclass(frozen=True)
class DraftTree:
    """A draft tree; node 0 is the root: the last committed token, not yet in the cache.

    tokens:  [N] int64, token of each node
    parents: [N] int64, parent index (-1 for the root), parents[i] < i
    depths:  [N] int64, root depth 0
    sources: [N] int8, ``Source`` of each node
    probs:   [N] float64 or None, the drafter's estimate that the path to each node is
             accepted (1 at the root); their sum is the tokens it expects the step to commit
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    sources: np.ndarray
    probs: np.ndarray | None = None

    @staticmethod
    def from_lists(
        tokens: list[int], parents: list[int], sources: list[int] | None = None, probs: list[float] | None = None
    ) -> DraftTree:
        """Build and validate a tree from plain lists (depths are derived)."""
        n = len(tokens)
        if n == 0 or len(parents) != n or parents[0] != -1:
            raise ValueError("a DraftTree needs a root (parent -1) and one parent per node")
        depths = [0] * n
        for i in range(1, n):
            p = parents[i]
            if not 0 <= p < i:
                raise ValueError(f"node {i} has parent {p}; parents must precede their children")
            depths[i] = depths[p] + 1
        if sources is None:
            sources = [int(Source.ROOT)] * n
        return DraftTree(
            tokens=np.asarray(tokens, dtype=np.int64),
            parents=np.asarray(parents, dtype=np.int64),
            depths=np.asarray(depths, dtype=np.int64),
            sources=np.asarray(sources, dtype=np.int8),
            probs=None if probs is None else np.asarray(probs, dtype=np.float64),
        )

    @property
    def expected_tokens(self) -> float | None:
        """Tokens the drafter expects this step to commit (the bonus included), if it estimates."""
        return None if self.probs is None else float(self.probs.sum())

    @staticmethod
    def root_only(token: int) -> DraftTree:
        return DraftTree.from_lists([token], [-1])

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def ancestor_mask(self) -> np.ndarray:
        """[N, N] bool: row i is True at i and at each ancestor of i (who node i may attend to)."""
        return ancestor_mask(self.parents)

    def path(self, node: int) -> list[int]:
        """Node indices from the root to ``node``, both included."""
        out = []
        while node >= 0:
            out.append(node)
            node = int(self.parents[node])
        return out[::-1]
