"""The leaf under the compiled kernels: numba's ``njit`` as recap uses it.

Compiled functions are cached on disk (numba ``cache=True``), so only the first import on a
machine pays the compilation. Without numba installed (or with ``NUMBA_DISABLE_JIT=1``) the
same functions run as plain Python: correct, only slower.
"""

from __future__ import annotations

try:
    import numba

    def njit(function):
        return numba.njit(cache=True, nogil=True)(function)

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - numba is a dependency; this keeps a broken install usable

    def njit(function):
        return function

    HAVE_NUMBA = False
