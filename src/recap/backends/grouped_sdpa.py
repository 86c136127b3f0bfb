"""Tree verification on a CPU without copying the KV cache into every query head.

transformers' ``sdpa`` attention hands grouped-query attention (fewer KV heads than query heads)
to PyTorch's ``enable_gqa`` only when there is no attention mask: with a mask it assumes the CUDA
kernels, which fall back to the slow math kernel for grouped heads and a mask. So every layer of
a tree forward, which needs a mask, first expands the whole KV cache to all query heads
(``repeat_kv``, a copy of the context per layer per step). PyTorch's CPU flash kernel takes a mask
and grouped heads together: the same logits bit for bit, without the copy (on the embedded
models a tree forward of 8-32 nodes took 5-13% less time, more with longer contexts).

``grouped()`` turns that on for the forwards run inside it, in this thread or task only; the
model and every other caller of transformers' ``sdpa`` see the function they had. Outside CPU
tensors, without a mask, for a single query row, or with options the plain call would not
handle the same way (position bias, softcap, attention weights), it is transformers' own call.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import torch

_ON = contextvars.ContextVar("recap_grouped_sdpa", default=False)


def _grouped_sdpa(
    original: Callable[..., Any],
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, Q, D]
    key: torch.Tensor,  # [B, H_kv, K, D]
    value: torch.Tensor,  # [B, H_kv, K, D]
    attention_mask: torch.Tensor | None,  # [B, 1, Q, K] additive or bool
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    if (
        _ON.get()
        and attention_mask is not None
        and query.device.type == "cpu"
        and query.shape[2] > 1
        and getattr(module, "num_key_value_groups", 1) > 1
        and key.shape[-1] == value.shape[-1]
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and not kwargs.get("output_attentions", False)
    ):
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False,
            enable_gqa=True,
        )  # fmt: skip
        return out.transpose(1, 2).contiguous(), None  # [B, Q, H, D]
    return original(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )


def install() -> None:
    """Wrap transformers' ``sdpa`` attention once (idempotent); the wrapper changes nothing
    outside ``grouped()``."""
    from transformers.modeling_utils import AttentionInterface

    current = AttentionInterface._global_mapping.get("sdpa")
    if current is None or getattr(current, "__recap_grouped__", False):
        return

    def sdpa(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        return _grouped_sdpa(current, *args, **kwargs)

    sdpa.__recap_grouped__ = True  # type: ignore[attr-defined]
    sdpa.__wrapped__ = current  # type: ignore[attr-defined]
    AttentionInterface.register("sdpa", sdpa)


@contextlib.contextmanager
def grouped() -> Iterator[None]:
    """Forwards inside run grouped-query attention with a mask on the CPU without ``repeat_kv``."""
    token = _ON.set(True)
    try:
        yield
    finally:
        _ON.reset(token)
