"""Compiled hot paths of the drafters (numba), each held equal by the tests to a readable
Python reference in ``recap.reference``.

- ``cells``: the calibration cell of a candidate and the one update rule of a cell's counts.
- ``tables``: row concentrations, the 2-/3-token memories as open-addressing hash tables, and
  the writes of verified top-k rows into them and into the dense token memory, with one step's
  learning in one call (references: ``recap.reference.context_memory``, ``TokenMemory.write``).
- ``drafting``: fusion of the rows found for a context, the best-first tree and its
  depth-first layout (references: ``recap.reference.fusion`` and ``recap.reference.tree_builder``).
- ``verify``: greedy acceptance and the tree's ancestor mask (reference: ``recap.reference.verify``).

Kernels import only the leaves ``recap.jit`` (``njit``) and ``recap.codes`` (shared constants).
Compiled functions are cached on disk, so only the first import on a machine pays the
compilation; ``warm_up()`` compiles everything up front and says how long it took.
"""

from __future__ import annotations

import threading
import time

_ready_seconds: float | None = None
_ready_lock = threading.Lock()


def warm_up() -> float:
    """Compile (or load from the on-disk cache) every kernel; returns the seconds it took."""
    from . import cells, drafting, tables, verify

    start = time.perf_counter()
    cells.warm_up()
    tables.warm_up()
    drafting.warm_up()
    verify.warm_up()
    return time.perf_counter() - start


def ensure_ready() -> float:
    """``warm_up`` once per process (later calls return at once): the decode loop calls it
    before its first request, so that no kernel compiles in the middle of a later one (e.g. the
    context tables' rehash, first needed when a table grows). Returns the seconds the first
    call took."""
    global _ready_seconds
    if _ready_seconds is None:
        with _ready_lock:
            if _ready_seconds is None:
                _ready_seconds = warm_up()
    return _ready_seconds
