"""Tree attention for vLLM's tree mode: the CPU backend, the KV move, and the GPU two-pass path.

One verify step of a request in tree mode holds, after its root (the last committed token),
the tree's nodes in topological order, best chain first (``tree_mode``). Each node may
attend to the request's committed prefix and to its own ancestors in the step's block, not
to its siblings. vLLM's attention is causal: row ``j`` of the block sees rows ``0..j``. Rows
of the first chain (``parents[i] == i - 1`` up to ``j``) see exactly their ancestors, so
causal attention is already right there, and those rows keep the native kernel's output bit
for bit. Only the other rows ("off-chain") are recomputed, with their ancestor mask.

CPU: ``RecapTreeCPUBackend`` replaces the class behind ``AttentionBackendEnum.CPU_ATTN`` (the
only backend the CPU platform picks). Its ``forward`` runs the native kernel for every row,
then, for the off-chain rows of the step's trees, reads the request's K/V back from the cache
and computes masked attention with torch. The CPU cache's block interior is packed per ISA;
``layout_maps`` learns where the writer puts each element by writing a known pattern into a
scratch block with the backend's own writer (``cpu_attn_reshape_and_cache``), so nothing here
depends on that layout.

KV: after acceptance the accepted path's node ``path[i]`` must sit in slot ``i`` of the block
(what the next step's prefix reads). ``move_accepted`` reads those K/V and writes them with
the backend's writer (``do_kv_cache_update``); nothing moves when the path is the first chain.

GPU: ``two_pass_attention`` is FlashAttention over the prefix (with its log-sum-exp), a small
masked attention over the block, and ``merge_attn_states``: no kernel change. It is tested only
on CUDA (``tests/in_vllm/test_tree_gpu.py``); until those tests have passed on a GPU, tree mode
on a GPU falls back to the chain (``tree_mode.engine_fallback_reason``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger("recap.vllm")


@dataclass
class TreeRequest:
    """One request's tree in this step: its batch row, where its block starts among the step's
    tokens, its ancestor mask and off-chain rows (block indices)."""

    req_id: str
    row: int
    start: int  # index of the root among the step's scheduled tokens
    parents: Any  # numpy [n + 1], -1 at the root
    depths: Any  # numpy [n + 1]
    mask: torch.Tensor  # [n + 1, n + 1] bool, ancestor-or-self
    off_chain: torch.Tensor  # [r] int64, block indices whose attention is not causal

    @property
    def size(self) -> int:
        return len(self.parents)


@dataclass
class TreeStep:
    """The trees of one forward (set before the model runs, cleared after sampling)."""

    requests: list[TreeRequest]
    slot_mapping: torch.Tensor | None = None  # the step's slots, read at the first decoder layer
    layers: dict[int, tuple[Any, Any, torch.Tensor]] = field(default_factory=dict)  # ptr -> (impl, layer, cache)
    broken: str | None = None  # why the off-chain rows of this step are not right (accept the chain only)
    computed_rows: int = 0


class _Recorder(list):
    """``CHECK = _Recorder()`` (tests): per tree and layer, max |torch - native kernel| over the
    first chain's rows, where both compute the same attention."""


CHECK: _Recorder | None = None


STEP: TreeStep | None = None  # this process's current step (one engine per process in tree mode)


# -- the CPU cache layout ------------------------------------------------------------------
_MAPS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def layout_maps(impl: Any, layer: Any, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([block_size, kv_heads, head] int64 offsets of each key element in a block's flat view,
    the same for values), learned once per cache shape from the backend's own writer."""
    num_blocks, kv_heads, block_size, two_head = kv_cache.shape
    head = two_head // 2
    key = (kv_cache.dtype, kv_heads, block_size, head, getattr(layer, "isa", None), impl.kv_cache_dtype)
    if key in _MAPS:
        return _MAPS[key]
    total = block_size * kv_heads * head
    exact = {torch.float32: 1 << 23, torch.float16: 1 << 10, torch.bfloat16: 1 << 7}.get(kv_cache.dtype, 1 << 7)
    base = min(exact, total)
    digits = max(1, math.ceil(math.log(total, base))) if total > 1 else 1
    codes = torch.arange(total, dtype=torch.int64)
    slots = torch.arange(block_size, dtype=torch.int64)
    maps = []
    for which in (0, 1):  # keys, then values
        where = torch.zeros(kv_heads * block_size * two_head, dtype=torch.int64)
        found = torch.zeros_like(where, dtype=torch.bool)
        for d in range(digits):
            digit = (codes // base**d) % base + 1  # 1..base: exact in the cache's dtype
            pattern = digit.to(kv_cache.dtype).view(block_size, kv_heads, head)
            zeros = torch.zeros_like(pattern)
            scratch = torch.zeros((1, kv_heads, block_size, two_head), dtype=kv_cache.dtype)
            pair = (pattern, zeros) if which == 0 else (zeros, pattern)
            impl.do_kv_cache_update(layer, pair[0], pair[1], scratch, slots)
            flat = scratch.reshape(-1).to(torch.int64)
            found |= flat > 0
            where += (flat - 1).clamp(min=0) * base**d
        if int(found.sum()) != total:
            raise RuntimeError("recap.vllm tree mode: the CPU KV writer is not a permutation of its input")
        inverse = torch.empty(total, dtype=torch.int64)
        inverse[where[found]] = torch.nonzero(found).flatten()
        maps.append(inverse.view(block_size, kv_heads, head))
    _MAPS[key] = (maps[0], maps[1])
    logger.info(
        "recap.vllm tree mode: learned the CPU KV cache layout (%s, block %d, %d KV heads, head %d)",
        key[0], block_size, kv_heads, head,
    )  # fmt: skip
    return _MAPS[key]


def read_kv(impl: Any, layer: Any, kv_cache: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [len(slots), kv_heads, head] at cache slots ``slots``."""
    kmap, vmap = layout_maps(impl, layer, kv_cache)
    block_size = kv_cache.shape[2]
    flat = kv_cache.view(kv_cache.shape[0], -1)
    blocks, offsets = (slots // block_size)[:, None, None], slots % block_size
    return flat[blocks, kmap[offsets]], flat[blocks, vmap[offsets]]


def masked_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """[r, heads, head] attention of ``query`` over ``keys``/``values`` [L, kv_heads, head] where
    ``allowed`` [r, L] (grouped-query heads repeated), in float32."""
    heads, kv_heads = query.shape[1], keys.shape[1]
    q = query.float().transpose(0, 1)  # [heads, r, head]
    k = keys.float().repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1)  # [heads, L, head]
    v = values.float().repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1)
    scores = torch.matmul(q, k.transpose(1, 2)) * scale
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v).transpose(0, 1).to(query.dtype)


def _unsupported(impl: Any) -> str | None:
    if getattr(impl, "sliding_window", -1) not in (-1, None):
        return "a sliding window"
    if getattr(impl, "alibi_slopes", None) is not None:
        return "ALiBi"
    if getattr(impl, "logits_soft_cap", 0):
        return "a logits soft cap"
    if getattr(impl, "sinks", None) is not None:
        return "attention sinks"
    if getattr(impl, "is_fp8_kv_cache", False):
        return "a quantized KV cache"
    return None


def tree_forward(impl: Any, layer: Any, query: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: Any, output):
    """Recompute the off-chain rows of ``STEP``'s trees in ``output`` (after the native kernel)."""
    step = STEP
    if step is None or step.broken or attn_metadata is None or kv_cache.numel() == 0:
        return
    why = _unsupported(impl)
    if why:
        step.broken = f"the attention layer has {why}"
        return
    if step.slot_mapping is None:
        step.slot_mapping = attn_metadata.slot_mapping[: attn_metadata.num_actual_tokens].clone()
    step.layers.setdefault(kv_cache.data_ptr(), (impl, layer, kv_cache))
    block_size = kv_cache.shape[2]
    out = output[: attn_metadata.num_actual_tokens].view(-1, impl.num_heads, impl.head_size)
    seq_lens = attn_metadata.seq_lens
    for tree in step.requests:
        check = CHECK is not None
        if not len(tree.off_chain) and not check:
            continue
        length = int(seq_lens[tree.row])
        size = tree.size
        first = length - size  # the root's position
        positions = torch.arange(length, dtype=torch.int64)
        blocks = attn_metadata.block_table[tree.row, positions // block_size].to(torch.int64)
        keys, values = read_kv(impl, layer, kv_cache, blocks * block_size + positions % block_size)
        if check:  # the same computation on the first chain's rows, against the native kernel's output there
            chain = torch.arange(0, size - len(tree.off_chain), dtype=torch.int64)
            allowed = torch.ones((len(chain), length), dtype=torch.bool)
            allowed[:, first:] = tree.mask[chain]
            mine = masked_attention(query[tree.start + chain], keys, values, allowed, impl.scale)
            CHECK.append(float((mine - out[tree.start + chain]).abs().max()))
        if not len(tree.off_chain):
            continue
        allowed = torch.ones((len(tree.off_chain), length), dtype=torch.bool)
        allowed[:, first:] = tree.mask[tree.off_chain]
        rows = tree.start + tree.off_chain
        out[rows] = masked_attention(query[rows], keys, values, allowed, impl.scale)
        step.computed_rows += len(rows)


def move_accepted(step: TreeStep, moves: list[tuple[int, int]]) -> None:
    """Copy K/V from step token ``src`` to step token ``dst``'s slot, every layer, for each
    (src, dst) in ``moves`` (in order: the accepted path's node ``path[i]`` to block slot ``i``)."""
    if not moves or step.slot_mapping is None:
        return
    src = step.slot_mapping[torch.tensor([s for s, _ in moves])].to(torch.int64)
    dst = step.slot_mapping[torch.tensor([d for _, d in moves])].to(torch.int64)
    for impl, layer, kv_cache in step.layers.values():
        keys, values = read_kv(impl, layer, kv_cache, src)
        impl.do_kv_cache_update(layer, keys.contiguous(), values.contiguous(), kv_cache, dst)


def cpu_backend_class() -> type:
    """``RecapTreeCPUBackend``: vLLM's CPU backend whose impl adds the tree rows."""
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

    class RecapTreeCPUAttentionImpl(CPUAttentionBackendImpl):
        def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
            result = super().forward(layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
            if STEP is not None and self.attn_type == AttentionType.DECODER:
                tree_forward(self, layer, query, kv_cache, attn_metadata, output)
            return result

    class RecapTreeCPUBackend(CPUAttentionBackend):
        @staticmethod
        def get_impl_cls():
            return RecapTreeCPUAttentionImpl

    return RecapTreeCPUBackend


_BACKEND: type | None = None


def __getattr__(name: str) -> Any:
    # the class vLLM imports by path (``recap.vllm.tree_attention.RecapTreeCPUBackend``)
    global _BACKEND
    if name == "RecapTreeCPUBackend":
        if _BACKEND is None:
            _BACKEND = cpu_backend_class()
        return _BACKEND
    raise AttributeError(f"module 'recap.vllm.tree_attention' has no attribute {name!r}")


# -- GPU: FlashAttention in two passes, no kernel change -------------------------------------
def two_pass_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    block_keys: torch.Tensor,
    block_values: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Tree attention of one request's block on a GPU.

    query [n, heads, head] (the block's rows), key/value_cache vLLM's paged FlashAttention cache
    [blocks, block_size, kv_heads, head], block_table [1, max_blocks], prefix_lens [1] int32
    (the committed tokens before the root), block_keys/values [n, kv_heads, head] (the block's
    own K/V), mask [n, n] bool ancestor-or-self. Pass 1: FlashAttention over the prefix,
    non-causal, with its log-sum-exp. Pass 2: masked attention over the block (n is small).
    Then ``merge_attn_states`` combines them, as FlashAttention's cascade path does."""
    from vllm.v1.attention.backends.fa_utils import flash_attn_varlen_func, get_flash_attn_version
    from vllm.v1.attention.ops.merge_attn_states import merge_attn_states

    n, heads, head = query.shape
    device = query.device
    cu_q = torch.tensor([0, n], dtype=torch.int32, device=device)
    prefix_out, prefix_lse = flash_attn_varlen_func(
        q=query, k=key_cache, v=value_cache, cu_seqlens_q=cu_q, max_seqlen_q=n,
        seqused_k=prefix_lens.to(torch.int32), max_seqlen_k=int(prefix_lens.max()), softmax_scale=scale,
        causal=False, block_table=block_table, return_softmax_lse=True, fa_version=get_flash_attn_version(),
    )  # fmt: skip
    kv_heads = block_keys.shape[1]
    q = query.float().transpose(0, 1)
    k = block_keys.float().repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1)
    v = block_values.float().repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1)
    scores = (torch.matmul(q, k.transpose(1, 2)) * scale).masked_fill(~mask[None], float("-inf"))
    block_lse = torch.logsumexp(scores, dim=-1)  # [heads, n]
    block_out = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(0, 1).to(query.dtype)
    out = torch.empty_like(query)
    merge_attn_states(out, prefix_out, prefix_lse, block_out, block_lse.to(prefix_lse.dtype))
    return out
