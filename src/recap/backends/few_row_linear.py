"""Tree verification on a CPU: each linear layer over a few rows with the faster of two kernels.

A tree forward runs every linear layer of the model over a few rows (one per node). Which BLAS
kernel is fast for such shapes differs by machine, library and shape, and the gap is large:
- ``F.linear`` (``X @ W^T``): on an AMD EPYC (Zen 5) with this project's torch, 4 rows of one
  896 x 4864 layer cost 1.0 ms against 0.26-0.48 ms for 1 row; on an Intel Xeon (Sapphire Rapids,
  MKL) 1 to 3 rows cost the same as one (0.47-0.50 ms) and 4 rows twice that.
- rows-first, ``(W @ X^T)^T``, makes the rows the kernel's short side: 0.44 ms for 4 rows and
  0.85 ms for 16 on the AMD, but 1.0-1.2 ms for 2-8 rows on the Intel (where it wins from 8-16 rows).

So inside ``fastest()`` a linear layer over 2 to ``MAX_ROWS`` rows times both kernels on its real
input the first time it meets that (out, in, bias, rows, threads) shape in this process (one
untimed call each, then ``TRIALS`` alternating timed calls, the lower minimum wins) and uses the
winner from then on (``choices()`` shows the table). Only ``torch.nn.Linear`` modules (not
subclasses with a forward of their own, e.g. quantized layers) on float32 CPU tensors take part;
everything else, and every forward outside ``fastest()``, is ``Linear``'s own forward. The two
kernels agree to float rounding, as any two kernels do (``F.linear`` over 4 rows and over 1 row
differ as much); the tokens are checked against generate's by the lossless tests. The step-cost
model (``recap.core.step_cost``) learns each tree size's real price on top of it.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

MAX_ROWS = 64  # beyond this many rows the plain kernel is efficient
TRIALS = 3  # timed calls of each kernel for a new shape

_ON = contextvars.ContextVar("recap_few_row_linear", default=False)
_ORIGINAL = torch.nn.Linear.forward
# (weight shape [out, in], has bias, rows, torch threads) -> rows-first is the faster kernel
_ROWS_FIRST: dict[tuple[torch.Size, bool, int, int], bool] = {}
_LOCK = threading.Lock()


def _linear(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight, bias)  # [rows, out]


def _rows_first(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    if bias is None:
        out = torch.mm(weight, x.t())  # [out, rows]
    else:
        out = torch.addmm(bias.unsqueeze(1), weight, x.t())
    return out.t().contiguous()  # [rows, out]


Kernel = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor], torch.Tensor]


def _race(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> tuple[bool, torch.Tensor]:
    """Time both kernels on ``x``; (rows-first won, the winner's output)."""
    kernels: tuple[Kernel, Kernel] = (_linear, _rows_first)
    best = [float("inf"), float("inf")]
    outputs = [kernel(weight, bias, x) for kernel in kernels]  # untimed: first-call set-up
    for _ in range(TRIALS):
        for index, kernel in enumerate(kernels):
            start = time.perf_counter()
            outputs[index] = kernel(weight, bias, x)
            best[index] = min(best[index], time.perf_counter() - start)
    rows_first = best[1] < best[0]
    return rows_first, outputs[int(rows_first)]


def _first_call(
    key: tuple[torch.Size, bool, int, int], weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor
) -> torch.Tensor:
    """A shape met for the first time: race the kernels (one shape at a time), keep the winner."""
    with _LOCK:
        known = _ROWS_FIRST.get(key)  # another thread may have timed it meanwhile
        if known is not None:
            return (_rows_first if known else _linear)(weight, bias, x)
        _ROWS_FIRST[key], out = _race(weight, bias, x)
        return out


def _forward(self: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:
    # the lean path first: this runs for every linear layer of every forward inside ``fastest()``
    if not _ON.get() or not input.is_cpu or input.dtype is not torch.float32 or input.dim() < 2:
        return _ORIGINAL(self, input)
    weight, bias = self.weight, self.bias  # [out, in], [out] or None
    width = input.shape[-1]
    rows = input.numel() // width if width else 0
    if not 2 <= rows <= MAX_ROWS or weight.dtype is not torch.float32:
        return _ORIGINAL(self, input)
    key = (weight.shape, bias is not None, rows, torch.get_num_threads())
    rows_first = _ROWS_FIRST.get(key)
    if rows_first is False:
        return F.linear(input, weight, bias)  # the same product as on the [rows, in] view
    x = input.reshape(rows, width)  # [rows, in]
    out = _rows_first(weight, bias, x) if rows_first else _first_call(key, weight, bias, x)
    return out.view(*input.shape[:-1], weight.shape[0])


def install() -> None:
    """Route ``torch.nn.Linear.forward`` through the kernel choice inside ``fastest()``
    (idempotent); outside it every layer runs its own forward unchanged."""
    if torch.nn.Linear.forward is not _forward:
        torch.nn.Linear.forward = _forward  # type: ignore[method-assign]


@contextlib.contextmanager
def fastest() -> Iterator[None]:
    """Linear layers inside run a few rows with the kernel found faster for their shape."""
    token = _ON.set(True)
    try:
        yield
    finally:
        _ON.reset(token)


def choices() -> dict[tuple[int, int, bool, int, int], str]:
    """The kernel chosen so far per (out, in, has bias, rows, threads): "rows-first" or "linear"."""
    return {
        (*shape, bias, rows, threads): "rows-first" if value else "linear"
        for (shape, bias, rows, threads), value in sorted(_ROWS_FIRST.items())
    }


def forget() -> None:
    """Drop every choice: the next tree forward of each shape times both kernels again."""
    _ROWS_FIRST.clear()
