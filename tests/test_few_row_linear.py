"""recap.backends.few_row_linear: linear layers over a few rows as W @ X^T inside a tree forward."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from recap.backends import few_row_linear


class _OwnForward(torch.nn.Linear):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return super().forward(input) * 0 + 7


def _layers() -> list[torch.nn.Linear]:
    torch.manual_seed(0)
    return [torch.nn.Linear(96, 160), torch.nn.Linear(96, 160, bias=False)]


def test_rows_first_agrees_with_linear_to_rounding_with_shape_and_layout() -> None:
    few_row_linear.install()
    for layer in _layers():
        for rows in (2, 3, 4, 7, 16, few_row_linear.MAX_ROWS):
            x = torch.randn(1, rows, 96)
            with torch.inference_mode(), few_row_linear.rows_first():
                fast = layer(x)
            plain = F.linear(x, layer.weight, layer.bias)
            assert fast.shape == plain.shape == (1, rows, 160)
            assert fast.is_contiguous()
            torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)
            rows_first = torch.mm(layer.weight, x[0].t()).t()  # the rows-first product itself, bit for bit
            if layer.bias is not None:
                rows_first = torch.addmm(layer.bias.unsqueeze(1), layer.weight, x[0].t()).t()
            assert torch.equal(fast[0], rows_first)


def test_outside_the_context_and_off_its_shapes_the_layer_runs_its_own_forward() -> None:
    few_row_linear.install()
    few_row_linear.install()  # idempotent
    for layer in _layers():
        for rows, inside in ((5, False), (1, True), (few_row_linear.MAX_ROWS + 1, True)):
            x = torch.randn(1, rows, 96)
            with torch.inference_mode(), few_row_linear.rows_first() if inside else torch.inference_mode():
                out = layer(x)
            assert torch.equal(out, F.linear(x, layer.weight, layer.bias))  # bit for bit: the same kernel
        x = torch.randn(1, 4, 96, dtype=torch.float64)
        layer64 = layer.double()
        with torch.inference_mode(), few_row_linear.rows_first():
            assert torch.equal(layer64(x), F.linear(x, layer64.weight, layer64.bias))  # float32 only


def test_a_subclass_with_its_own_forward_is_left_alone() -> None:
    few_row_linear.install()
    layer = _OwnForward(8, 4)
    with torch.inference_mode(), few_row_linear.rows_first():
        assert torch.equal(layer(torch.randn(1, 3, 8)), torch.full((1, 3, 4), 7.0))


def test_the_context_is_per_thread() -> None:
    import threading

    few_row_linear.install()
    seen = []
    with few_row_linear.rows_first():
        thread = threading.Thread(target=lambda: seen.append(few_row_linear._ON.get()))
        thread.start()
        thread.join()
        assert few_row_linear._ON.get()
    assert seen == [False] and not few_row_linear._ON.get()
