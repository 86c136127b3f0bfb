"""Tree verification on a CPU: each linear layer over a few rows with the faster of two kernels.

A tree forward runs every linear layer of the model over a few rows (one per node). Which BLAS
kernel is fast for such shapes differs by machine, library and shape, and the gap is large:
- ``F.linear`` (``X @ W^T``): on an AMD EPYC (Zen 5) with this project's torch, 4 rows of one
  896 x 4864 layer cost 1.0 ms against 0.26-0.48 ms for 1 row; on an Intel Xeon (Sapphire Rapids,
  MKL) 1 to 3 rows cost what one row costs (0.30 ms in a quiet moment) and 4 rows twice that.
- rows-first, ``(W @ X^T)^T``, makes the rows the kernel's short side: 0.44 ms for 4 rows and
  0.85 ms for 16 on the AMD; 0.75-0.90 ms for 2 to 16 rows on the Intel (F.linear: 1.3 ms for 16).

So inside ``fastest()`` a linear layer over 2 to ``MAX_ROWS`` rows learns, per (weight shape, bias,
rows, torch threads), which kernel is faster where it runs: the first calls of a new shape take
the two kernels in turn, each timed inside the real forward (other layers' weights in between, as
always: a kernel timed twice in a row on one weight finds it in cache and can win there and lose
in a forward), and once each has ``TRIALS`` timed calls after an untimed first one, the lower
minimum wins (``choices()`` shows the table, ``forget()`` clears it). After ``REVISIT`` more calls
of the shape the two are timed again, so a choice made while something else slowed the machine
does not last for the rest of the process (re-timing costs a few calls of the slower kernel in
4096). The layers of a model share a few shapes, so timing takes one or two tree forwards per size
(``restore`` takes the choices of an earlier process instead: ``recap generate`` keeps them beside its
step times).
Only ``torch.nn.Linear`` modules (not subclasses with a forward of their own, e.g. quantized
layers) whose weight and bias are plain parameters (not parametrized, not buffers), on float32 CPU
tensors, take part; everything else, and every forward outside
``fastest()``, is ``Linear``'s own forward. The two kernels agree to float rounding, as any two
kernels do (``F.linear`` over 4 rows and over 1 row differ as much); the tokens are checked against
generate's by the lossless tests. The step-cost model (``recap.core.step_cost``) learns each tree
size's real price on top of it, from forwards that are no longer timing kernels (``Scope.timing``).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator, Mapping

import torch
import torch.nn.functional as F

MAX_ROWS = 64  # beyond this many rows the plain kernel is efficient
TRIALS = 3  # timed calls of each kernel for a new shape, after an untimed first one
REVISIT = 4096  # calls of a decided shape after which its kernels are timed again

Key = tuple[torch.Size, bool, int, int]  # (weight shape [out, in], has bias, rows, torch threads)

_ON: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("recap_few_row_linear", default=None)
_ORIGINAL = torch.nn.Linear.forward
_ROWS_FIRST: dict[Key, bool] = {}  # decided shapes: rows-first is the faster kernel
_TIMES: dict[Key, tuple[list[float], list[float]]] = {}  # shapes being timed: seconds of (F.linear, rows-first)
_USES: dict[Key, int] = {}  # calls of each decided shape since its decision (none yet: absent)
_LOCK = threading.Lock()


class Scope:
    """One ``fastest()`` block (what it yields): torch's thread count there, the few-row linear calls
    inside and how many of them timed a kernel (a new or revisited shape, run with either kernel)."""

    __slots__ = ("threads", "calls", "timed")

    def __init__(self, threads: int) -> None:
        self.threads, self.calls, self.timed = threads, 0, 0

    @property
    def timing(self) -> bool:
        """Whether more than 1 in 8 of the calls timed a kernel: then the block took longer than it will
        once the kernels are chosen (some layers ran the slower one, all of them were timed), so its time
        is no measure of what such a forward costs. (A model's first forward at a new row count times
        every layer; later ones may time a layer that runs once per forward, e.g. the LM head, which
        takes 8 forwards to decide and costs little.)"""
        return self.timed * 8 > self.calls


def _linear(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight, bias)  # [rows, out]


def _rows_first(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    if bias is None:
        out = torch.mm(weight, x.t())  # [out, rows]
    else:
        out = torch.addmm(bias.unsqueeze(1), weight, x.t())
    return out.t().contiguous()  # [rows, out]


def _explore(key: Key, weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor, scope: Scope) -> torch.Tensor:
    """A call of a shape not decided yet: run the kernel with fewer calls so far, timed; decide
    once both have ``TRIALS`` timed calls (the first call of each is set-up, not timed)."""
    scope.timed += 1
    with _LOCK:
        times = _TIMES.setdefault(key, ([], []))
        rows_first = len(times[1]) < len(times[0])
    kernel = _rows_first if rows_first else _linear
    start = time.perf_counter()
    out = kernel(weight, bias, x)
    elapsed = time.perf_counter() - start
    with _LOCK:
        times[rows_first].append(elapsed)
        if key not in _ROWS_FIRST and min(map(len, times)) > TRIALS:
            _ROWS_FIRST[key] = min(times[1][1:]) < min(times[0][1:])
            _TIMES.pop(key, None)
    return out


def _decided(key: Key) -> bool | None:
    """The kernel decided for ``key`` (True: rows-first), or None while it is (again) being timed."""
    rows_first = _ROWS_FIRST.get(key)
    if rows_first is not None:
        uses = _USES[key] = _USES.get(key, 0) + 1
        if uses > REVISIT:  # time both again
            with _LOCK:
                _ROWS_FIRST.pop(key, None)
                _USES.pop(key, None)
            return None
    return rows_first


def _forward(self: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:
    # the lean path first: this runs for every linear layer of every forward inside ``fastest()``, so
    # it reads the parameters from their dict (``self.weight`` goes through Module.__getattr__) and
    # the thread count from the context
    scope = _ON.get()
    if scope is None or input.dtype is not torch.float32 or not input.is_cpu:
        return _ORIGINAL(self, input)
    shape = input.shape
    width = shape[-1] if len(shape) >= 2 else 0
    rows = input.numel() // width if width else 0
    parameters = self._parameters
    weight = parameters.get("weight")  # [out, in]; None where it is not a plain parameter (e.g. parametrized)
    if not 2 <= rows <= MAX_ROWS or weight is None or weight.dtype is not torch.float32 or "bias" not in parameters:
        return _ORIGINAL(self, input)
    bias = parameters["bias"]  # [out] or None
    scope.calls += 1
    key = (weight.shape, bias is not None, rows, scope.threads)
    rows_first = _decided(key)
    if rows_first is False:
        return F.linear(input, weight, bias)  # the same product as on the [rows, in] view
    x = input.reshape(rows, width)  # [rows, in]
    out = _rows_first(weight, bias, x) if rows_first else _explore(key, weight, bias, x, scope)
    return out.view(*shape[:-1], weight.shape[0])


def install() -> None:
    """Route ``torch.nn.Linear.forward`` through the kernel choice inside ``fastest()``
    (idempotent); outside it every layer runs its own forward unchanged."""
    if torch.nn.Linear.forward is not _forward:
        torch.nn.Linear.forward = _forward  # type: ignore[method-assign]


@contextlib.contextmanager
def fastest() -> Iterator[Scope]:
    """Linear layers inside run a few rows with the kernel found faster for their shape; yields the
    block's ``Scope`` (whether it is still timing kernels)."""
    scope = Scope(torch.get_num_threads())
    token = _ON.set(scope)
    try:
        yield scope
    finally:
        _ON.reset(token)


def choices() -> dict[tuple[int, int, bool, int, int], str]:
    """The kernel chosen so far per (out, in, has bias, rows, threads): "rows-first" or "linear"."""
    with _LOCK:
        decided = sorted(_ROWS_FIRST.items())
    return {
        (*shape, bias, rows, threads): "rows-first" if value else "linear"
        for (shape, bias, rows, threads), value in decided
    }


def checked(decided: Mapping[tuple[int, int, bool, int, int], str]) -> dict[Key, bool]:
    """Kernel choices as ``restore`` takes them ({(out, in, bias, rows, threads): "rows-first" | "linear"}), as
    this table's keys -> rows-first. An entry that is no shape of this table (sizes, rows within 2 to
    ``MAX_ROWS``, threads at least 1, kernel "rows-first" or "linear"): ValueError."""
    entries = {}
    for key, kernel in decided.items():
        out, width, bias, rows, threads = key
        if (
            kernel not in ("rows-first", "linear")
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in (out, width, rows, threads))
            or not isinstance(bias, bool)
            or min(out, width, threads) < 1
            or not 2 <= rows <= MAX_ROWS
        ):
            raise ValueError(f"kernel choice {key} -> {kernel!r} is none this table holds")
        entries[(torch.Size((out, width)), bias, rows, threads)] = kernel == "rows-first"
    return entries


def restore(decided: Mapping[tuple[int, int, bool, int, int], str]) -> int:
    """Take kernel choices made before (``choices()``, e.g. by an earlier process on this machine) for
    the shapes not decided here yet, so that their first forwards run the chosen kernel instead of timing
    both: each new row count's first forward otherwise runs half its layers on the slower kernel (a
    32-token request at a 0.5B shape on two cores, four tree sizes, took 0.3 s less of 5-6 s on average
    over 6 pairs). Returns how many were taken. An entry that is no shape of this table (``checked``):
    ValueError, and nothing is taken."""
    entries = checked(decided)
    with _LOCK:
        new = {key: rows_first for key, rows_first in entries.items() if key not in _ROWS_FIRST and key not in _TIMES}
        _ROWS_FIRST.update(new)
    return len(new)


def forget() -> None:
    """Drop every choice and timing: each shape is timed again when next met."""
    with _LOCK:
        _ROWS_FIRST.clear()
        _TIMES.clear()
        _USES.clear()
