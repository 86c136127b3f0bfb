"""Compiled hot paths of the drafters (numba), each with a pure-Python reference elsewhere in
the package that the tests hold it equal to.

- ``tables``: the request-local 2-/3-token memories as open-addressing hash tables, and the
  writes of verified top-k rows into them and into the dense token memory
  (reference: ``recap.memory.ContextMemory`` and ``TokenMemory.write``).
- ``drafting``: fusion of the rows found for a context, the best-first tree and its
  depth-first layout (reference: ``recap.fusion`` and ``recap.tree_builder``).
- ``verify``: greedy acceptance and the calibration counts (reference: ``recap.accept``).

Compiled functions are cached on disk (numba ``cache=True``), so only the first import on a
machine pays the compilation; ``warm_up()`` compiles everything up front and says how long
it took. Without numba installed (or with ``NUMBA_DISABLE_JIT=1``) the same functions run as
plain Python: correct, only slower.
"""

from __future__ import annotations

import threading
import time

try:
    import numba

    def njit(function):
        return numba.njit(cache=True, nogil=True)(function)

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - numba is a dependency; this keeps a broken install usable

    def njit(function):
        return function

    HAVE_NUMBA = False


_ready_seconds: float | None = None
_ready_lock = threading.Lock()


def warm_up() -> float:
    """Compile (or load from the on-disk cache) every kernel; returns the seconds it took."""
    from . import drafting, tables, verify

    start = time.perf_counter()
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
