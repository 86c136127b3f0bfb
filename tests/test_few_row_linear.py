"""recap.backends.few_row_linear: linear layers over a few rows with the faster of two kernels inside a
tree forward, chosen per shape by timing both in turn on its first calls."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.nn.functional as F

from recap.backends import few_row_linear


class _OwnForward(torch.nn.Linear):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return super().forward(input) * 0 + 7


def _layers() -> list[torch.nn.Linear]:
    torch.manual_seed(0)
    return [torch.nn.Linear(96, 160), torch.nn.Linear(96, 160, bias=False)]


def _kernel_output(layer: torch.nn.Linear, x: torch.Tensor, choice: str) -> torch.Tensor:
    kernel = few_row_linear._rows_first if choice == "rows-first" else few_row_linear._linear
    return kernel(layer.weight, layer.bias, x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], -1)


CALLS_TO_DECIDE = 2 * (few_row_linear.TRIALS + 1)  # each kernel: one untimed call, then TRIALS timed


def test_each_shape_takes_both_kernels_in_turn_then_runs_the_one_it_chose() -> None:
    few_row_linear.install()
    few_row_linear.forget()
    for layer in _layers():
        for rows in (2, 3, 4, 7, 16, few_row_linear.MAX_ROWS):
            key = (160, 96, layer.bias is not None, rows, torch.get_num_threads())
            ran = []
            for call in range(CALLS_TO_DECIDE + 2):
                assert (key in few_row_linear.choices()) == (call >= CALLS_TO_DECIDE)
                x = torch.randn(1, rows, 96)
                with torch.inference_mode(), few_row_linear.fastest():
                    fast = layer(x)
                plain = F.linear(x, layer.weight, layer.bias)
                assert fast.shape == plain.shape == (1, rows, 160)
                assert fast.is_contiguous()
                torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)
                kernel = [k for k in ("linear", "rows-first") if torch.equal(fast, _kernel_output(layer, x, k))]
                assert kernel, "the output is one of the two kernels', bit for bit"
                ran.append(kernel)
            chosen = few_row_linear.choices()[key]
            assert all(chosen in k for k in ran[CALLS_TO_DECIDE:])  # decided: the chosen kernel from then on
    assert len(few_row_linear.choices()) == 2 * 6
    few_row_linear.forget()
    assert few_row_linear.choices() == {}


def test_choices_taken_from_an_earlier_process_run_at_once_without_timing() -> None:
    """``restore`` takes choices made before (``choices()``, as ``recap generate`` keeps them beside its step
    times): a restored shape's first forward runs its kernel and times nothing, so its step time is a price at
    once; a shape decided here keeps its own choice; a malformed entry is refused and nothing is taken."""
    few_row_linear.install()
    few_row_linear.forget()
    layer = _layers()[0]
    threads = torch.get_num_threads()
    saved = {(160, 96, True, 4, threads): "rows-first", (160, 96, True, 5, threads): "linear"}
    for bad in ({(160, 96, True, 4, threads): "fast"}, {(160, 96, True, 1, threads): "linear"},
                {(160, 96, "yes", 4, threads): "linear"}, {(160, 0, True, 4, threads): "linear"}):  # fmt: skip
        with pytest.raises(ValueError, match="none this table holds"):
            few_row_linear.restore({**saved, **bad})
        assert few_row_linear.choices() == {}
    assert few_row_linear.restore(saved) == 2
    assert few_row_linear.choices() == saved
    for rows, kernel in ((4, "rows-first"), (5, "linear")):
        x = torch.randn(1, rows, 96)
        with torch.inference_mode(), few_row_linear.fastest() as scope:
            out = layer(x)
        assert scope.calls == 1 and scope.timed == 0 and not scope.timing
        assert torch.equal(out, _kernel_output(layer, x, kernel))
    assert few_row_linear.restore({(160, 96, True, 4, threads): "linear"}) == 0  # decided here: kept
    assert few_row_linear.choices()[(160, 96, True, 4, threads)] == "rows-first"
    few_row_linear.forget()


@pytest.mark.parametrize("slow", ["linear", "rows-first"])
def test_the_faster_kernel_in_the_forward_is_kept(monkeypatch: pytest.MonkeyPatch, slow: str) -> None:
    few_row_linear.install()
    few_row_linear.forget()
    name = "_linear" if slow == "linear" else "_rows_first"
    kernel = getattr(few_row_linear, name)

    def slowed(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)
        return kernel(weight, bias, x)

    monkeypatch.setattr(few_row_linear, name, slowed)
    layer = _layers()[0]
    for _ in range(CALLS_TO_DECIDE):
        with torch.inference_mode(), few_row_linear.fastest():
            layer(torch.randn(1, 5, 96))
    (choice,) = few_row_linear.choices().values()
    assert choice == ("rows-first" if slow == "linear" else "linear")
    monkeypatch.undo()
    x = torch.randn(1, 5, 96)
    with torch.inference_mode(), few_row_linear.fastest():
        assert torch.equal(layer(x), _kernel_output(layer, x, choice))
    few_row_linear.forget()


def test_a_decided_shape_is_timed_again_after_revisit_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A choice made while the machine was slowed does not last: after REVISIT calls both kernels
    are timed again, and a kernel that became the slower one loses the new race."""
    few_row_linear.install()
    few_row_linear.forget()
    monkeypatch.setattr(few_row_linear, "REVISIT", 5)
    layer, x = _layers()[0], torch.randn(1, 5, 96)
    slowed = {"name": "_rows_first"}
    kernels = {name: getattr(few_row_linear, name) for name in ("_linear", "_rows_first")}

    def kernel_for(name: str):
        def run(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
            if slowed["name"] == name:
                time.sleep(0.002)
            return kernels[name](weight, bias, x)

        return run

    for name in kernels:
        monkeypatch.setattr(few_row_linear, name, kernel_for(name))

    def call() -> None:
        with torch.inference_mode(), few_row_linear.fastest():
            layer(x)

    for _ in range(CALLS_TO_DECIDE):
        call()
    assert list(few_row_linear.choices().values()) == ["linear"]
    slowed["name"] = "_linear"  # the machine changed: F.linear is now the slow one
    for _ in range(few_row_linear.REVISIT):
        call()
    assert list(few_row_linear.choices().values()) == ["linear"]  # still the old choice
    call()  # one call past REVISIT: timed again
    assert few_row_linear.choices() == {}
    for _ in range(CALLS_TO_DECIDE - 1):
        call()
    assert list(few_row_linear.choices().values()) == ["rows-first"]
    few_row_linear.forget()


def test_outside_the_context_and_off_its_shapes_the_layer_runs_its_own_forward() -> None:
    few_row_linear.install()
    few_row_linear.install()  # idempotent
    few_row_linear.forget()
    for layer in _layers():
        for rows, inside in ((5, False), (1, True), (few_row_linear.MAX_ROWS + 1, True)):
            x = torch.randn(1, rows, 96)
            with torch.inference_mode(), few_row_linear.fastest() if inside else torch.inference_mode():
                out = layer(x)
            assert torch.equal(out, F.linear(x, layer.weight, layer.bias))  # bit for bit: the same kernel
        x = torch.randn(1, 4, 96, dtype=torch.float64)
        layer64 = layer.double()
        with torch.inference_mode(), few_row_linear.fastest():
            assert torch.equal(layer64(x), F.linear(x, layer64.weight, layer64.bias))  # float32 only
    assert few_row_linear.choices() == {}  # nothing was timed


class _Doubled(torch.nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * 2


def test_a_layer_whose_weight_or_bias_is_not_a_plain_parameter_runs_its_own_forward() -> None:
    """The lean path reads the parameters from their dict; a parametrized weight, or a bias kept as a
    buffer, is not there, and the layer's own forward (which reads the attributes) must run."""
    few_row_linear.install()
    few_row_linear.forget()
    parametrized, buffered = _layers()
    torch.nn.utils.parametrize.register_parametrization(parametrized, "weight", _Doubled())
    del buffered.bias
    buffered.register_buffer("bias", torch.randn(160))
    x = torch.randn(1, 4, 96)
    for layer in (parametrized, buffered):
        with torch.inference_mode(), few_row_linear.fastest():
            out = layer(x)
        assert torch.equal(out, F.linear(x, layer.weight, layer.bias))
    assert few_row_linear.choices() == {}  # neither went through the kernel choice


def test_a_subclass_with_its_own_forward_is_left_alone() -> None:
    few_row_linear.install()
    layer = _OwnForward(8, 4)
    with torch.inference_mode(), few_row_linear.fastest():
        assert torch.equal(layer(torch.randn(1, 3, 8)), torch.full((1, 3, 4), 7.0))


def test_the_context_is_per_thread() -> None:
    few_row_linear.install()
    seen = []
    with few_row_linear.fastest():
        thread = threading.Thread(target=lambda: seen.append(few_row_linear._ON.get()))
        thread.start()
        thread.join()
        assert few_row_linear._ON.get() is not None
    assert seen == [None] and few_row_linear._ON.get() is None


def test_a_block_counts_as_timing_while_a_real_share_of_its_calls_time_kernels() -> None:
    """``fastest()`` yields its scope: a forward whose layers are still being timed (some ran the slower
    kernel) is no measure of its size's price, and the decode loop does not record it; a layer that runs
    once per forward (an LM head) takes 8 forwards to decide and does not count once the others are set."""
    few_row_linear.install()
    few_row_linear.forget()
    torch.manual_seed(0)
    blocks = [torch.nn.Linear(96, 96) for _ in range(CALLS_TO_DECIDE)]  # one shape, decided in one forward
    head = torch.nn.Linear(96, 40)  # another shape, once per forward
    x = torch.randn(1, 4, 96)

    def forward() -> few_row_linear.Scope:
        with torch.inference_mode(), few_row_linear.fastest() as scope:
            h = x
            for block in blocks:
                h = block(h)
            head(h)
        return scope

    first = forward()
    assert first.calls == len(blocks) + 1 and first.timed == first.calls and first.timing
    for _ in range(CALLS_TO_DECIDE - 1):  # the blocks' shape is decided; the head is still timed
        scope = forward()
        assert scope.timed == 1 and not scope.timing
    assert len(few_row_linear.choices()) == 2  # both shapes decided
    assert forward().timed == 0
    with few_row_linear.fastest() as idle:  # no few-row call at all
        pass
    assert idle.calls == idle.timed == 0 and not idle.timing
    few_row_linear.forget()
