"""Memories of recycled predictions: the persistent token memory and the request-local
contextual memories.

A row is the target's top-k next-token candidates at some verified position, with their
full-vocabulary probabilities and the row's concentration kappa = exp(-entropy).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np

from .topk import TopK

METHODS = ("recap", "token_recycling")
Row = tuple[list[int], list[float], float]  # (ids [k] best first, probs [k], kappa); shared, never mutate


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
        self._rows: dict[int, Row] = {}  # the filled rows as Python lists, for fast reads

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
        """The row keyed by ``token``, or None if it was never written. A row is replaced
        whole by a write, so a reader sees it from before or after the write, never half."""
        return self._rows.get(token)

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
        ids, probs, kappa = topk.ids[rows, :k], topk.probs[rows, :k], topk.concentration[rows]
        with self.lock:
            if k < self.k:
                self.ids[keys] = 0
                self.probs[keys] = 0
            self.ids[keys, :k] = ids
            self.probs[keys, :k] = probs
            self.kappa[keys] = kappa
            self.filled[keys] = True
            self._rows.update(zip(keys.tolist(), zip(ids.tolist(), probs.tolist(), kappa.tolist())))

    def clear(self) -> None:
        with self.lock:
            self.ids[:] = 0
            self.probs[:] = 0
            self.kappa[:] = 0
            self.filled[:] = False
            self._rows.clear()

    def copy(self) -> TokenMemory:
        out = TokenMemory(self.vocab_size, self.k, self.method, self.fingerprint)
        with self.lock:
            out.ids[:], out.probs[:], out.kappa[:], out.filled[:] = self.ids, self.probs, self.kappa, self.filled
        out.sync_rows()
        return out

    def sync_rows(self) -> None:
        """Rebuild the readable rows from the arrays after they were set directly (a load)."""
        with self.lock:
            filled = np.nonzero(self.filled)[0]
            rows = zip(self.ids[filled].tolist(), self.probs[filled].tolist(), self.kappa[filled].tolist())
            self._rows = dict(zip(filled.tolist(), rows))

    def save(self, path: str | os.PathLike) -> None:
        """Write this memory to ``path`` atomically (see ``recap.persist.save_memory``)."""
        from .persist import save_memory

        save_memory(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike, expected: object = None) -> TokenMemory:
        """Read and validate a memory file (see ``recap.persist.load_memory``)."""
        from .persist import load_memory

        return load_memory(path, expected)


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
        self.rows.update(zip(reversed(keys), reversed(rows)))

    def clear(self) -> None:
        self.rows.clear()
