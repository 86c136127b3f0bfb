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

from ..codes import EMPTY, MIN_CONTEXT_ROWS, PERSISTENT_METHODS
from ..kernels import tables
from . import persist
from .calibration import Calibration
from .topk import TopK

DEFAULT_CONTEXT_ROWS = 1 << 17  # kept 2-/3-token rows (both tables together) of a TokenMemory by default
EVICT_TO = 0.75  # a full kept table evicts its least recently used rows down to this share of its budget
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

    def __init__(
        self,
        vocab_size: int,
        k: int = 8,
        method: str = "recap",
        fingerprint: str = "",
        max_context_rows: int = DEFAULT_CONTEXT_ROWS,
    ) -> None:
        if vocab_size < 1 or k < 1:
            raise ValueError(f"TokenMemory needs vocab_size >= 1 and k >= 1, got {vocab_size} and {k}")
        check_context_rows(max_context_rows)
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
        # each request stamps the rows it writes with its own stamp (``new_stamp``); at most
        # ``max_context_rows`` rows in all, half a table: a full table evicts its least recently used rows
        self.max_context_rows = int(max_context_rows)
        self._active: set[int] = set()  # stamps of the requests under way: their own rows are evicted last
        self.context = {
            order: ContextTable(order, k, max_keys=self.max_context_rows // 2, protected=self._active)
            for order in (2, 3)
        }
        self._stamp = 0
        self.clock = 0  # the use clock: advanced once per drafting step (``tick``); rows read or written carry it

    def __repr__(self) -> str:
        return (
            f"TokenMemory(method={self.method!r}, vocab_size={self.vocab_size}, k={self.k}, "
            f"rows_filled={self.rows_filled}, context_rows={self.context_rows}/{self.max_context_rows})"
        )

    @property
    def context_rows(self) -> int:
        """Kept 2-/3-token rows now (both tables)."""
        return sum(len(table) for table in self.context.values())

    @property
    def context_nbytes(self) -> int:
        """Bytes the kept 2-/3-token tables hold now (at most ``context_budget_nbytes``)."""
        return sum(table.nbytes for table in self.context.values())

    @property
    def context_budget_nbytes(self) -> int:
        """The most bytes the kept 2-/3-token tables can hold under ``max_context_rows``."""
        return sum(table.max_nbytes for table in self.context.values())

    @staticmethod
    def context_rows_for_bytes(nbytes: int, k: int = 8) -> int:
        """The largest ``max_context_rows`` whose tables fit in ``nbytes`` (for a byte budget)."""
        slot = ContextTable.slot_nbytes(k)
        rows, per_table = 0, MIN_CONTEXT_ROWS // 2
        while 2 * ContextTable.capacity_for(per_table) * slot <= nbytes:
            rows, per_table = 2 * per_table, 2 * per_table
        if rows == 0:
            raise ValueError(
                f"{nbytes} bytes cannot hold the smallest kept-row budget ({MIN_CONTEXT_ROWS} rows need "
                f"{2 * ContextTable.capacity_for(MIN_CONTEXT_ROWS // 2) * slot} bytes at k={k})"
            )
        return rows

    @property
    def rows_filled(self) -> int:
        return int(self.filled.sum())

    def new_stamp(self) -> int:
        """A stamp no request on this memory had before (rows loaded from a file have 0). The
        request is under way until ``release_stamp``: while it is, its own rows are evicted
        only when a table's budget holds nothing else."""
        with self.lock:
            self._stamp += 1
            self._active.add(self._stamp)
            return self._stamp

    def release_stamp(self, stamp: int) -> None:
        """The request of ``stamp`` is over: its rows age like any other kept row."""
        with self.lock:
            self._active.discard(stamp)

    def tick(self) -> int:
        """Advance the use clock and return it; the caller holds ``lock``."""
        self.clock += 1
        return self.clock

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
        out = TokenMemory(self.vocab_size, self.k, self.method, self.fingerprint, self.max_context_rows)
        with self.lock:
            out.ids[:], out.probs[:], out.kappa[:], out.filled[:] = self.ids, self.probs, self.kappa, self.filled
            for order, table in self.context.items():
                out.context[order] = table.copy(protected=out._active)
            out._stamp = self._stamp  # the copy's next stamps stay clear of its rows' stamps
            out.clock = self.clock
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
                # least recently used first: the order is the rows' recency when the file loads
                slots = np.nonzero(table.keys != EMPTY)[0]
                slots = slots[np.argsort(table.used[slots], kind="stable")]
                for part, array in zip(("keys", "ids", "probs", "kappa"), table.arrays[:4]):
                    tensors[f"context{order}_{part}"] = array[slots].copy()
        return tensors

    def save(self, path: str | os.PathLike) -> None:
        """Write this memory to ``path`` atomically: a consistent snapshot taken under the lock
        (other threads may keep decoding), then ``recap.core.persist.write_file``. A crash leaves
        the previous file intact; a memory that would not load back is refused (``ValueError``)."""
        tensors = self.snapshot()
        header = persist.header_for(self.method, self.k, self.vocab_size, self.fingerprint, tensors)
        header["max_context_rows"] = self.max_context_rows
        persist.write_file(path, tensors, header)

    @classmethod
    def load(cls, path: str | os.PathLike, expected: Any = None, max_context_rows: int | None = None) -> TokenMemory:
        """Read and validate a memory file (``recap.core.persist.read_file``: every problem is a
        ``MemoryFileError`` naming the file). ``expected``: the model (vocabulary size) or the
        tokenizer / processor (fingerprint) it will be used with, checked against the file.
        ``max_context_rows``: the kept-row budget (default: the file's, else the default); a
        file holding more rows keeps its most recently used ones."""
        if max_context_rows is not None:
            check_context_rows(max_context_rows)
        header, arrays = persist.read_file(path, expected)
        budget = max_context_rows or header.get("max_context_rows") or DEFAULT_CONTEXT_ROWS
        memory = cls(header["vocab_size"], header["k"], header["method"], header["fingerprint"], budget)
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
                # rows are stored least recently used first: their rank is their use time; over the
                # budget, the most recently used ones are kept
                start = max(0, len(keys) - table.max_keys)
                kept = np.arange(start, len(keys))
                table.load_rows(np.array(keys[kept]), TopK(ids[kept], probs[kept]), np.array(kappa[kept]))
            memory.clock = max(len(table) for table in memory.context.values())
        return memory


def save_memory(memory: TokenMemory, path: str | os.PathLike) -> None:
    """Write ``memory`` to ``path`` atomically (``TokenMemory.save``)."""
    if not isinstance(memory, TokenMemory):
        raise TypeError(f"save_memory needs a recap.TokenMemory, got {type(memory).__name__}")
    memory.save(path)


def load_memory(path: str | os.PathLike, expected: Any = None) -> TokenMemory:
    """Read and validate a memory file written by ``save_memory`` (``TokenMemory.load``)."""
    return TokenMemory.load(path, expected)


def check_context_rows(rows: object) -> None:
    """``max_context_rows`` must be an integer >= ``MIN_CONTEXT_ROWS``."""
    if not isinstance(rows, (int, np.integer)) or isinstance(rows, bool) or rows < MIN_CONTEXT_ROWS:
        raise ValueError(
            f"max_context_rows={rows!r}: the kept 2-/3-token rows need a budget of at least {MIN_CONTEXT_ROWS} rows "
            "(an integer; about 2 x (28 + 8k) bytes a row). To keep no rows across requests, use "
            "RecapConfig(persistent_context=False)"
        )


class ContextTable:
    """Rows keyed by the last ``order`` tokens (2 or 3) in an open-addressing hash table. The
    compiled twin of ``recap.reference.context_memory.ContextMemory`` (same reads and writes);
    token ids must be below 2**21.

    keys: [cap] int64 packed keys (``EMPTY`` where free); ids [cap, k] int32, probs [cap, k]
    float32, kappa [cap] float32; stamps [cap] int64, the stamp of the request that wrote each
    row (``TokenMemory.new_stamp``); used [cap] int64, the use clock when the row was last read
    by drafting or written (``TokenMemory.tick``). Grows (doubling) before it is half full.

    ``max_keys`` (the kept tables of a ``TokenMemory``): a write that would pass it first evicts
    the least recently used rows down to ``EVICT_TO`` of it (``tables.evict_least_used``); rows of
    the requests under way (stamps in ``protected``) go only when nothing else is left. Without
    ``max_keys`` (a request's own tables) it grows until the request ends.
    """

    def __init__(
        self, order: int, k: int, capacity: int = 1024, max_keys: int | None = None, protected: set[int] | None = None
    ) -> None:
        if order not in (2, 3):
            raise ValueError(f"a context table has keys of 2 or 3 tokens, not {order}")
        self.order, self.k, self.max_keys = order, k, max_keys
        self.protected = protected if protected is not None else set()
        self.count = 0
        self.evictions = 0  # eviction passes so far
        self.evicted = 0  # rows evicted so far
        start = max(16, 1 << (capacity - 1).bit_length())
        if max_keys is not None:
            start = min(start, self.capacity_for(max_keys))
        self._allocate(start)

    @staticmethod
    def slot_nbytes(k: int) -> int:
        """Bytes of one slot: key, k ids, k probs, kappa, stamp, use time."""
        return 8 + 4 * k + 4 * k + 4 + 8 + 8

    @staticmethod
    def capacity_for(keys: int) -> int:
        """The capacity a table of ``keys`` keys reaches (a power of two, at least twice the keys)."""
        return max(16, 1 << (2 * keys - 1).bit_length())

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    @property
    def max_nbytes(self) -> int:
        """The bytes this table can reach (unbounded tables: their current size)."""
        if self.max_keys is None:
            return self.nbytes
        return self.capacity_for(self.max_keys) * self.slot_nbytes(self.k)

    def _allocate(self, capacity: int) -> None:
        self.keys = np.full(capacity, EMPTY, dtype=np.int64)
        self.ids = np.zeros((capacity, self.k), dtype=np.int32)
        self.probs = np.zeros((capacity, self.k), dtype=np.float32)
        self.kappa = np.zeros(capacity, dtype=np.float32)
        self.stamps = np.zeros(capacity, dtype=np.int64)
        self.used = np.zeros(capacity, dtype=np.int64)

    def __len__(self) -> int:
        return self.count

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(keys, ids, probs, kappa, stamps, used), as the compiled code takes a table."""
        return self.keys, self.ids, self.probs, self.kappa, self.stamps, self.used

    def pack(self, key: Sequence[int]) -> int:
        if len(key) != self.order:
            raise ValueError(f"a key of this table has {self.order} tokens, got {tuple(key)}")
        return int(tables.pack_key(-1 if self.order == 2 else key[0], key[-2], key[-1]))

    def get(self, key: Sequence[int]) -> Row | None:
        slot = tables.find(self.keys, self.pack(key))
        if slot < 0:
            return None
        return self.ids[slot].tolist(), self.probs[slot].tolist(), float(self.kappa[slot])

    def copy(self, protected: set[int] | None = None) -> ContextTable:
        out = ContextTable(self.order, self.k, max_keys=self.max_keys, protected=protected)
        out.count, out.evictions, out.evicted = self.count, self.evictions, self.evicted
        out.keys, out.ids, out.probs, out.kappa, out.stamps, out.used = (a.copy() for a in self.arrays)
        return out

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more keys: evict down to the budget (bounded tables), then grow
        so that the table stays at most half full."""
        if self.max_keys is not None and self.count + extra > self.max_keys:
            self.evict(min(int(EVICT_TO * self.max_keys), self.max_keys - extra))
        capacity = self.keys.shape[0]
        if 2 * (self.count + extra) <= capacity:
            return
        while 2 * (self.count + extra) > capacity:
            capacity *= 2
        old = self.arrays
        self._allocate(capacity)
        tables.rehash(*old, *self.arrays)

    def evict(self, keep: int) -> None:
        """Keep the ``keep`` most useful rows (``tables.evict_least_used``): the rows of requests
        under way, then the most recently used; the table is rebuilt without the others."""
        keep = max(0, keep)
        if self.count <= keep:
            return
        protected = np.fromiter(sorted(self.protected), dtype=np.int64, count=len(self.protected))
        dropped = tables.evict_least_used(*self.arrays, protected, keep)
        self.count -= dropped
        self.evicted += dropped
        self.evictions += 1

    def _chunks(self, n: int) -> list[slice]:
        """Slices of a write of ``n`` keys, last first, each small enough for the budget."""
        step = n if self.max_keys is None else max(1, self.max_keys // 4)
        return [slice(start, min(n, start + step)) for start in reversed(range(0, max(n, 1), step))]

    def write_packed(
        self,
        keys: np.ndarray,
        rows: np.ndarray,
        topk: TopK,
        kappa: np.ndarray | None = None,
        stamp: int = 0,
        used: int = 0,
    ) -> None:
        """Write top-k rows ``rows`` [M] under packed ``keys`` [M] (EMPTY skips), stamped
        ``stamp`` and used at ``used``; within one call the first occurrence of a key wins.
        ``kappa`` [N]: the rows' concentrations, if known (else computed from ``topk``)."""
        kappa = topk.concentration if kappa is None else np.ascontiguousarray(kappa, dtype=np.float32)
        keys, rows = np.asarray(keys, dtype=np.int64), np.asarray(rows, dtype=np.int64)
        for part in self._chunks(len(keys)):  # the last keys first: the first occurrence is written last
            self.reserve(part.stop - part.start)
            self.count += tables.write_context_rows(
                *self.arrays, keys[part], rows[part], topk.ids, topk.probs, kappa, stamp, used
            )

    def load_rows(self, keys: np.ndarray, topk: TopK, kappa: np.ndarray) -> None:
        """Distinct rows from a memory file, least recently used first (each one's rank becomes its
        use time), into an empty table with room for them."""
        self.reserve(len(keys))
        index = np.arange(len(keys), dtype=np.int64)
        self.count += tables.write_context_rows(*self.arrays, keys, index, topk.ids, topk.probs, kappa, 0, 0)
        for rank, key in enumerate(keys.tolist(), start=1):
            self.used[tables.find(self.keys, key)] = rank

    def write_many(self, keys: Sequence[Sequence[int]], rows: Sequence[Row], stamp: int = 0, used: int = 0) -> None:
        """The reference ``ContextMemory.write_many``'s form: rows as (ids, probs, kappa) under token keys."""
        if not keys:
            return
        ids = np.asarray([r[0] for r in rows], dtype=np.int64)
        probs = np.asarray([r[1] for r in rows], dtype=np.float32)
        kappa = np.asarray([r[2] for r in rows], dtype=np.float32)
        packed = np.asarray([self.pack(key) for key in keys], dtype=np.int64)
        self.write_packed(packed, np.arange(len(packed), dtype=np.int64), TopK(ids, probs), kappa, stamp, used)

    def clear(self) -> None:
        if self.count:
            self.keys.fill(EMPTY)
            self.count = 0
