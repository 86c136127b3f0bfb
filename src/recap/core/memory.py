"""Memories of recycled predictions: the persistent token memory and the request-local
contextual memories.

A row is the target's top-k next-token candidates at some verified position, with their
full-vocabulary probabilities and the row's concentration kappa = exp(-entropy).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..codes import EMPTY, PERSISTENT_METHODS
from ..kernels import tables
from . import persist
from .calibration import Calibration
from .topk import TopK

PERSISTENT_CONTEXT_KEYS = 1 << 16  # keys per persistent 2-/3-token table before it starts afresh
Row = tuple[list[int], list[float], float]  # (ids [k] best first, probs [k], kappa); shared, never mutate


class TokenMemory:
    """Dense [vocab, k] table keyed by one token; persists across requests.

    Owned by the caller: pass one to ``recap.generate(memory=...)`` to share it between
    models of the same vocabulary, threads or processes (``save`` / ``load``). Every read
    and write of a row holds ``lock``, so a row is never seen half-written. It also carries
    the drafter's ``calibration`` (how often drafts of each kind were accepted), which is
    learned alongside the rows.

    ids:    [vocab, k] int32, candidates, best first
    probs:  [vocab, k] float32, their probabilities (0 where the row was never written)
    kappa:  [vocab] float32, concentration of each row
    filled: [vocab] bool, whether the row was ever written
    """

    def __init__(self, vocab_size: int, k: int = 8, method: str = "recap", fingerprint: str = "") -> None:
        if vocab_size < 1 or k < 1:
            raise ValueError(f"TokenMemory needs vocab_size >= 1 and k >= 1, got {vocab_size} and {k}")
        if method not in PERSISTENT_METHODS:
            raise ValueError(f"TokenMemory method {method!r}: choose one of {', '.join(PERSISTENT_METHODS)}")
        self.vocab_size = int(vocab_size)
        self.k = int(k)
        self.method = method
        self.fingerprint = fingerprint
        self.ids = np.zeros((vocab_size, k), dtype=np.int32)
        self.probs = np.zeros((vocab_size, k), dtype=np.float32)
        self.kappa = np.zeros(vocab_size, dtype=np.float32)
        self.filled = np.zeros(vocab_size, dtype=bool)
        self.lock = threading.Lock()
        self.calibration = Calibration()
        # RECAP's 2-/3-token rows when they are kept across requests (RecapConfig.persistent_context):
        # each request stamps the rows it writes with its own stamp (``new_stamp``); bounded
        self.context = {order: ContextTable(order, k, max_keys=PERSISTENT_CONTEXT_KEYS) for order in (2, 3)}
        self._stamp = 0

    def __repr__(self) -> str:
        return (
            f"TokenMemory(method={self.method!r}, vocab_size={self.vocab_size}, k={self.k}, "
            f"rows_filled={self.rows_filled})"
        )

    @property
    def rows_filled(self) -> int:
        return int(self.filled.sum())

    def new_stamp(self) -> int:
        """A stamp no request on this memory had before (rows loaded from a file have 0)."""
        with self.lock:
            self._stamp += 1
            return self._stamp

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes + self.probs.nbytes + self.kappa.nbytes + self.filled.nbytes

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids, probs, kappa, filled), as the compiled drafters take them (read under ``lock``)."""
        return self.ids, self.probs, self.kappa, self.filled

    def row(self, token: int) -> Row | None:
        """The row keyed by ``token``, or None if it was never written. A row is replaced
        whole by a write, so a reader sees it from before or after the write, never half."""
        if not 0 <= token < self.vocab_size:
            return None
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
        rows = np.arange(len(keys), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        with self.lock:
            tables.write_token_rows(*self.arrays, keys, rows, topk.ids, topk.probs, topk.concentration)

    def clear(self) -> None:
        """Forget every row (the calibration is kept: it describes the model, not the rows)."""
        with self.lock:
            self.ids[:] = 0
            self.probs[:] = 0
            self.kappa[:] = 0
            self.filled[:] = False
            for table in self.context.values():
                table.clear()

    def copy(self) -> TokenMemory:
        out = TokenMemory(self.vocab_size, self.k, self.method, self.fingerprint)
        with self.lock:
            out.ids[:], out.probs[:], out.kappa[:], out.filled[:] = self.ids, self.probs, self.kappa, self.filled
            for order, table in self.context.items():
                out.context[order] = table.copy()
            out._stamp = self._stamp  # the copy's next stamps stay clear of its rows' stamps
        out.calibration.set_counts(*self.calibration.counts())
        return out

    def snapshot(self) -> dict[str, np.ndarray]:
        """Copies of every array a memory file holds (``recap.core.persist``), taken under the lock."""
        with self.lock:
            tensors = {
                "ids": np.array(self.ids, dtype=np.int32, copy=True),
                "probs": np.array(self.probs, dtype=np.float32, copy=True),
                "kappa": np.array(self.kappa, dtype=np.float32, copy=True),
                "filled": np.array(self.filled, dtype=np.uint8, copy=True),
            }
            tensors["calibration_trials"], tensors["calibration_accepted"] = self.calibration.counts()
            for order, table in self.context.items():
                used = table.keys != EMPTY
                for part, array in zip(("keys", "ids", "probs", "kappa"), table.arrays[:4]):
                    tensors[f"context{order}_{part}"] = array[used].copy()
        return tensors

    def save(self, path: str | os.PathLike) -> None:
        """Write this memory to ``path`` atomically: a consistent snapshot taken under the lock
        (other threads may keep decoding), then ``recap.core.persist.write_file``. A crash leaves
        the previous file intact; a memory that would not load back is refused (``ValueError``)."""
        tensors = self.snapshot()
        header = persist.header_for(self.method, self.k, self.vocab_size, self.fingerprint, tensors)
        persist.write_file(path, tensors, header)

    @classmethod
    def load(cls, path: str | os.PathLike, expected: Any = None) -> TokenMemory:
        """Read and validate a memory file (``recap.core.persist.read_file``: every problem is a
        ``MemoryFileError`` naming the file). ``expected``: the model (vocabulary size) or the
        tokenizer / processor (fingerprint) it will be used with, checked against the file."""
        header, arrays = persist.read_file(path, expected)
        memory = cls(header["vocab_size"], header["k"], header["method"], header["fingerprint"])
        memory.ids[:] = arrays["ids"]
        memory.probs[:] = arrays["probs"]
        memory.kappa[:] = arrays["kappa"]
        memory.filled[:] = arrays["filled"].astype(bool)
        if "calibration_trials" in arrays:  # version 2 files
            memory.calibration.set_counts(arrays["calibration_trials"], arrays["calibration_accepted"])
            for order, table in memory.context.items():
                keys, ids, probs, kappa = (
                    arrays[f"context{order}_{part}"] for part in ("keys", "ids", "probs", "kappa")
                )
                table.write_packed(np.array(keys), np.arange(len(keys)), TopK(ids, probs), kappa=np.array(kappa))
        return memory


def save_memory(memory: TokenMemory, path: str | os.PathLike) -> None:
    """Write ``memory`` to ``path`` atomically (``TokenMemory.save``)."""
    if not isinstance(memory, TokenMemory):
        raise TypeError(f"save_memory needs a recap.TokenMemory, got {type(memory).__name__}")
    memory.save(path)


def load_memory(path: str | os.PathLike, expected: Any = None) -> TokenMemory:
    """Read and validate a memory file written by ``save_memory`` (``TokenMemory.load``)."""
    return TokenMemory.load(path, expected)


class ContextTable:
    """Rows keyed by the last ``order`` tokens (2 or 3) in an open-addressing hash table; lives
    for one request. The compiled twin of ``recap.reference.context_memory.ContextMemory`` (same reads
    and writes); token ids
    must be below 2**21.

    keys: [cap] int64 packed keys (``EMPTY`` where free); ids [cap, k] int32, probs
    [cap, k] float32, kappa [cap] float32; stamps [cap] int64, the stamp of the request that
    wrote each row (``TokenMemory.new_stamp``). Grows (doubling) before it is half full; with
    ``max_keys``, a write that would pass it clears the table first (a bounded memory that
    starts afresh rather than grow without end).
    """

    def __init__(self, order: int, k: int, capacity: int = 1024, max_keys: int | None = None) -> None:
        if order not in (2, 3):
            raise ValueError(f"a context table has keys of 2 or 3 tokens, not {order}")
        self.order, self.k, self.max_keys = order, k, max_keys
        self.count = 0
        self._allocate(max(16, 1 << (capacity - 1).bit_length()))

    def _allocate(self, capacity: int) -> None:
        self.keys = np.full(capacity, EMPTY, dtype=np.int64)
        self.ids = np.zeros((capacity, self.k), dtype=np.int32)
        self.probs = np.zeros((capacity, self.k), dtype=np.float32)
        self.kappa = np.zeros(capacity, dtype=np.float32)
        self.stamps = np.zeros(capacity, dtype=np.int64)

    def __len__(self) -> int:
        return self.count

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.keys, self.ids, self.probs, self.kappa, self.stamps

    def pack(self, key: Sequence[int]) -> int:
        if len(key) != self.order:
            raise ValueError(f"a key of this table has {self.order} tokens, got {tuple(key)}")
        return int(tables.pack_key(-1 if self.order == 2 else key[0], key[-2], key[-1]))

    def get(self, key: Sequence[int]) -> Row | None:
        slot = tables.find(self.keys, self.pack(key))
        if slot < 0:
            return None
        return self.ids[slot].tolist(), self.probs[slot].tolist(), float(self.kappa[slot])

    def copy(self) -> ContextTable:
        out = ContextTable(self.order, self.k, max_keys=self.max_keys)
        out.count = self.count
        out.keys, out.ids, out.probs, out.kappa, out.stamps = (a.copy() for a in self.arrays)
        return out

    def reserve(self, extra: int) -> None:
        """Grow so that ``extra`` more keys keep the table at most half full."""
        if self.max_keys is not None and self.count + extra > self.max_keys:
            self.clear()
        capacity = self.keys.shape[0]
        if 2 * (self.count + extra) <= capacity:
            return
        while 2 * (self.count + extra) > capacity:
            capacity *= 2
        old = self.arrays
        self._allocate(capacity)
        tables.rehash(*old, *self.arrays)

    def write_packed(
        self, keys: np.ndarray, rows: np.ndarray, topk: TopK, kappa: np.ndarray | None = None, stamp: int = 0
    ) -> None:
        """Write top-k rows ``rows`` [M] under packed ``keys`` [M] (EMPTY skips), stamped
        ``stamp``; within one call the first occurrence of a key wins. ``kappa`` [N]: the rows'
        concentrations, if known (else computed from ``topk``)."""
        self.reserve(len(keys))
        kappa = topk.concentration if kappa is None else np.ascontiguousarray(kappa, dtype=np.float32)
        self.count += tables.write_context_rows(*self.arrays, keys, rows, topk.ids, topk.probs, kappa, stamp)

    def write_many(self, keys: Sequence[Sequence[int]], rows: Sequence[Row], stamp: int = 0) -> None:
        """The reference ``ContextMemory.write_many``'s form: rows as (ids, probs, kappa) under token keys."""
        if not keys:
            return
        ids = np.asarray([r[0] for r in rows], dtype=np.int64)
        probs = np.asarray([r[1] for r in rows], dtype=np.float32)
        kappa = np.asarray([r[2] for r in rows], dtype=np.float32)
        packed = np.asarray([self.pack(key) for key in keys], dtype=np.int64)
        self.reserve(len(packed))
        index = np.arange(len(packed), dtype=np.int64)
        self.count += tables.write_context_rows(*self.arrays, packed, index, ids, probs, kappa, stamp)

    def clear(self) -> None:
        if self.count:
            self.keys.fill(EMPTY)
            self.count = 0
