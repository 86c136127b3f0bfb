"""Memories of recycled predictions: the persistent token memory and the request-local
contextual memories.

A row is the target's top-k next-token candidates at some verified position, with their
full-vocabulary probabilities and the row's concentration kappa = exp(-entropy).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from .topk import TopK

METHODS = ("recap", "token_recycling")
Row = tuple[list[int], list[float], float]  # (ids [k], probs [k], kappa)


class TokenMemory:
    """Dense [vocab, k] table keyed by one token; persists across requests.

    Owned by the caller: pass one to ``recap.generate(memory=...)`` to share it between
    models of the same vocabulary, threads or processes (``save`` / ``load``). Every read
    and write of a row holds a lock, so a row is never seen half-written.

    ids:    [vocab, k] int32, candidates, best first
    probs:  [vocab, k] float32, their probabilities (0 where the row was never written)
    kappa:  [vocab] float32, concentration of each row
    filled: [vocab] bool, whether the row was ever written
    """

    def __init__(self, vocab_size: int, k: int = 8, method: str = "recap", fingerprint: str = "") -> None:
        if vocab_size < 1 or k < 1:
            raise ValueError(f"TokenMemory needs vocab_size >= 1 and k >= 1, got {vocab_size} and {k}")
        if method not in METHODS:
            raise ValueError(f"TokenMemory method {method!r}: choose one of {', '.join(METHODS)}")
        self.vocab_size = int(vocab_size)
        self.k = int(k)
        self.method = method
        self.fingerprint = fingerprint
        self.ids = np.zeros((vocab_size, k), dtype=np.int32)
        self.probs = np.zeros((vocab_size, k), dtype=np.float32)
        self.kappa = np.zeros(vocab_size, dtype=np.float32)
        self.filled = np.zeros(vocab_size, dtype=bool)
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"TokenMemory(method={self.method!r}, vocab_size={self.vocab_size}, k={self.k}, "
            f"rows_filled={self.rows_filled})"
        )

    @property
    def rows_filled(self) -> int:
        return int(self.filled.sum())

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes + self.probs.nbytes + self.kappa.nbytes + self.filled.nbytes

    def row(self, token: int) -> Row | None:
        """The row keyed by ``token``, or None if it was never written."""
        with self.lock:
            if not self.filled[token]:
                return None
            return self.ids[token].tolist(), self.probs[token].tolist(), float(self.kappa[token])

    def write(self, keys: np.ndarray, topk: TopK, rows: np.ndarray | None = None) -> None:
        """Write ``topk`` rows (all, or those indexed by ``rows``) under ``keys`` [M].

        Within one call a repeated key keeps its first occurrence; across calls the latest
        write wins. Keys outside the vocabulary are ignored.
        """
        keys = np.asarray(keys, dtype=np.int64)
        if rows is None:
            rows = np.arange(len(keys))
        valid = (keys >= 0) & (keys < self.vocab_size)
        keys, rows = keys[valid], np.asarray(rows)[valid]
        if keys.size == 0:
            return
        keys, first = np.unique(keys, return_index=True)
        rows = rows[first]
        k = min(self.k, topk.k)
        kappa = topk.concentration()[rows]
        with self.lock:
            self.ids[keys, :k] = topk.ids[rows, :k]
            self.probs[keys, :k] = topk.probs[rows, :k]
            self.kappa[keys] = kappa
            self.filled[keys] = True

    def clear(self) -> None:
        with self.lock:
            self.ids[:] = 0
            self.probs[:] = 0
            self.kappa[:] = 0
            self.filled[:] = False

    def copy(self) -> TokenMemory:
        out = TokenMemory(self.vocab_size, self.k, self.method, self.fingerprint)
        with self.lock:
            out.ids[:], out.probs[:], out.kappa[:], out.filled[:] = self.ids, self.probs, self.kappa, self.filled
        return out


class ContextMemory:
    """Rows keyed by the last ``order`` tokens (2 or 3); lives for one request."""

    def __init__(self, order: int) -> None:
        self.order = order
        self.rows: dict[tuple[int, ...], Row] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, key: tuple[int, ...]) -> Row | None:
        return self.rows.get(key)

    def write_many(self, keys: Sequence[tuple[int, ...]], rows: Sequence[Row]) -> None:
        """Write rows under keys; within one call the first occurrence of a key wins."""
        store = self.rows
        for key, row in zip(reversed(keys), reversed(rows)):
            store[key] = row

    def clear(self) -> None:
        self.rows.clear()
