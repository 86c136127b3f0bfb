"""Tree forwards on the CPU run grouped-query attention with a mask without ``repeat_kv``
(``recap.backends.grouped_sdpa``): the same logits as transformers' own path, and nothing
changes outside a verify."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_lossless import make_inputs
from tiny_models import build

from recap.backends import grouped_sdpa
from recap.backends.hf import HFTarget
from recap.core.tree import DraftTree


class _Grouped(torch.nn.Module):
    num_key_value_groups = 3


def _attention_inputs(rng_seed: int = 0):
    g = torch.Generator().manual_seed(rng_seed)
    query = torch.randn(1, 6, 5, 16, generator=g)  # [B, H, Q, D]
    key = torch.randn(1, 2, 40, 16, generator=g)  # [B, H_kv, K, D]
    value = torch.randn(1, 2, 40, 16, generator=g)
    mask = torch.zeros(1, 1, 5, 40)
    mask[..., 37:] = torch.finfo(torch.float32).min  # the last keys hidden from every query
    mask[..., 2, 38] = 0.0
    return query, key, value, mask


def test_grouped_attention_equals_transformers_sdpa_with_repeated_heads():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    query, key, value, mask = _attention_inputs()

    def must_not_run(*args, **kwargs):
        raise AssertionError("the grouped path fell back to transformers' sdpa")

    with grouped_sdpa.grouped():
        fast, _ = grouped_sdpa._grouped_sdpa(must_not_run, _Grouped(), query, key, value, mask, scaling=0.25)
    reference, _ = sdpa_attention_forward(_Grouped(), query, key, value, mask, scaling=0.25)  # repeat_kv
    assert fast.shape == reference.shape == (1, 5, 6, 16)
    torch.testing.assert_close(fast, reference, rtol=1e-6, atol=1e-6)


def test_outside_a_verify_and_for_other_inputs_it_is_transformers_own_call():
    query, key, value, mask = _attention_inputs()
    calls = []

    def original(*args, **kwargs):
        calls.append(kwargs)
        return "transformers", None

    def call(**kwargs):
        return grouped_sdpa._grouped_sdpa(original, _Grouped(), query, key, value, mask, **kwargs)[0]

    assert call() == "transformers"  # not inside grouped()
    with grouped_sdpa.grouped():
        assert grouped_sdpa._grouped_sdpa(original, _Grouped(), query[:, :, :1], key, value, mask)[0] == "transformers"
        assert grouped_sdpa._grouped_sdpa(original, _Grouped(), query, key, value, None)[0] == "transformers"
        assert call(softcap=30.0) == "transformers"
        assert call(position_bias=torch.zeros(1, 6, 5, 40)) == "transformers"
        single = type("Single", (torch.nn.Module,), {"num_key_value_groups": 1})()
        assert grouped_sdpa._grouped_sdpa(original, single, query, key, value, mask)[0] == "transformers"
    assert len(calls) == 6
    assert grouped_sdpa._ON.get() is False


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "llava_next", "qwen3"])
def test_a_tree_verify_gives_the_same_logits_with_and_without_repeated_kv(arch):
    model, processor = build(arch)
    if model.device.type != "cpu":
        pytest.skip("the grouped path is for CPU tensors")
    assert model.config.get_text_config().num_key_value_heads < model.config.get_text_config().num_attention_heads
    inputs = make_inputs(arch, processor, np.random.default_rng(3))
    target = HFTarget(model, k=4)
    target.prefill(inputs, [])
    rng = np.random.default_rng(0)
    text = [t for t in inputs["input_ids"][0].tolist() if t not in target.placeholder_ids]
    for size in (2, 7, 24):
        parents = [-1] + [int(rng.integers(0, i)) for i in range(1, size)]
        tree = DraftTree.from_lists(rng.choice(text, size=size).tolist(), parents)
        logits = []
        for grouped in (False, True):
            target._grouped = grouped
            logits.append(target.verify(tree).logits.clone())
            target.commit([])
        torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)
