"""The GPU path of tree mode (``tree_attention.two_pass_attention``: FlashAttention over the
prefix with its log-sum-exp, masked attention over the tree block, ``merge_attn_states``)
against dense masked attention. CUDA only: skipped elsewhere. Until these pass on a GPU,
``tree_mode.GPU_TESTED`` stays False and tree mode on a GPU drafts chains."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here (bash scripts/setup-vllm-venv.sh)")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (FlashAttention)"),
]


def _dense(query, keys, values, allowed, scale):
    from recap.vllm.tree_attention import masked_attention

    return masked_attention(query, keys, values, allowed, scale)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("prefix", [1, 37, 300])
def test_two_pass_tree_attention_equals_dense_masked_attention(dtype, prefix) -> None:
    from recap.core.tree import DraftTree
    from recap.vllm.tree_attention import two_pass_attention

    torch.manual_seed(prefix)
    device, heads, kv_heads, head, block_size = "cuda", 8, 2, 64, 16
    tree = DraftTree.from_lists(list(range(9)), [-1, 0, 1, 2, 0, 4, 1, 6, 7])
    n = len(tree)
    mask = torch.from_numpy(tree.ancestor_mask()).to(device)
    total = prefix + n
    blocks = (total + block_size - 1) // block_size
    keys = torch.randn(total, kv_heads, head, device=device, dtype=dtype)
    values = torch.randn(total, kv_heads, head, device=device, dtype=dtype)
    order = torch.randperm(blocks + 3, device=device)[:blocks]  # scattered physical blocks
    key_cache = torch.zeros(blocks + 3, block_size, kv_heads, head, device=device, dtype=dtype)
    value_cache = torch.zeros_like(key_cache)
    for p in range(prefix):
        key_cache[order[p // block_size], p % block_size] = keys[p]
        value_cache[order[p // block_size], p % block_size] = values[p]
    query = torch.randn(n, heads, head, device=device, dtype=dtype)
    out = two_pass_attention(
        query, key_cache, value_cache, order[None].to(torch.int32), torch.tensor([prefix], device=device),
        keys[prefix:], values[prefix:], mask, head**-0.5,
    )  # fmt: skip
    allowed = torch.ones(n, total, dtype=torch.bool, device=device)
    allowed[:, prefix:] = mask
    expected = _dense(query.float(), keys.float(), values.float(), allowed, head**-0.5)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
