"""The leaf under the compiled kernels: numba's ``njit`` as recap uses it.

Compiled functions are cached on disk (numba ``cache=True``), so only the first import on a
machine pays the compilation. Without numba installed (or with ``NUMBA_DISABLE_JIT=1``) the
same functions run as plain Python: correct, only slower.
"""

from __future__ import annotations

# reassociate sums and contract multiply-adds, but keep NaN and infinity semantics (no nnan/ninf)
FAST_SUM_FLAGS = frozenset({"reassoc", "contract", "afn"})

try:
    import numba

    def njit(function):
        return numba.njit(cache=True, nogil=True)(function)

    def njit_fast_sum(function):
        """``njit`` whose floating-point sums may be reordered (vectorized): for sums of many
        terms whose order does not matter to the result's use, never for a decision."""
        return numba.njit(cache=True, nogil=True, fastmath=set(FAST_SUM_FLAGS))(function)

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - numba is a dependency; this keeps a broken install usable

    def njit(function):
        return function

    njit_fast_sum = njit

    HAVE_NUMBA = False
