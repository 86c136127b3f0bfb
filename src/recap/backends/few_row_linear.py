"""Tree verification on a CPU: a linear layer over a few rows as ``W @ X^T``.

A tree forward runs every linear layer of the model over a few rows (one per node). For such
shapes the CPU BLAS kernel behind ``F.linear`` (``X @ W^T``) is far from the one-row kernel a plain
step gets: measured on this project's 2-core CPUs, 4 rows cost 2-4x one row (896 x 4864 at the
0.5B shape: 1.0 ms for 4 rows, 0.26-0.48 ms for 1), so a small tree costs much more than the step
it replaces. The same product computed the other way round, ``(W @ X^T)^T``, makes the rows the
BLAS kernel's short side, where it is fast: 0.44 ms for 4 rows, 0.85 ms for 16 (1.3 ms with
``F.linear``). The results agree to float rounding, as any two kernels do (``F.linear`` over 4 rows
and over 1 row differ as much); the tokens are checked against generate's by the lossless tests.

``rows_first()`` turns it on for the forwards run inside it, in this thread or task only, for
``torch.nn.Linear`` modules (not their subclasses with a forward of their own, e.g. quantized
layers) on float32 CPU tensors with 2 to ``MAX_ROWS`` rows; everything else is ``Linear``'s own
forward. Which row counts gain is the BLAS library's business and differs by machine and shape;
the step-cost model (``recap.core.step_cost``) learns each tree size's real price either way.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

MAX_ROWS = 64  # beyond this many rows the plain kernel is efficient

_ON = contextvars.ContextVar("recap_few_row_linear", default=False)
_ORIGINAL = torch.nn.Linear.forward


def _forward(self: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:
    if _ON.get() and input.device.type == "cpu" and input.dtype == torch.float32 and input.dim() >= 2:
        width = input.shape[-1]
        rows = input.numel() // width if width else 0
        weight = self.weight  # [out, in]
        if 2 <= rows <= MAX_ROWS and weight.dtype == torch.float32 and weight.dim() == 2:
            x = input.reshape(rows, width)  # [rows, in]
            if self.bias is None:
                out = torch.mm(weight, x.t())  # [out, rows]
            else:
                out = torch.addmm(self.bias.unsqueeze(1), weight, x.t())
            return out.t().contiguous().view(*input.shape[:-1], weight.shape[0])
    return _ORIGINAL(self, input)


def install() -> None:
    """Route ``torch.nn.Linear.forward`` through the rows-first product inside ``rows_first()``
    (idempotent); outside it every layer runs its own forward unchanged."""
    if torch.nn.Linear.forward is not _forward:
        torch.nn.Linear.forward = _forward  # type: ignore[method-assign]


@contextlib.contextmanager
def rows_first() -> Iterator[None]:
    """Linear layers inside run a few rows as ``W @ X^T`` on the CPU."""
    token = _ON.set(True)
    try:
        yield
    finally:
        _ON.reset(token)
