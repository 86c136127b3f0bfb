"""Every method returns exactly the tokens of model.generate(do_sample=False), on every
supported architecture (tiny random-weight models, float32; on RECAP_TEST_DEVICE, default cpu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from devices import to_device
from PIL import Image
from tiny_models import BUILDERS, VLM, WORDS, build

import recap
from recap import RecapConfig, TokenMemory
from recap.backends.hf import output_vocab_size

METHODS = ("ar", "pld", "token_recycling", "recap")
LENGTHS = (1, 2, 9, 48, 200, 120, 31)


def make_inputs(arch: str, processor, rng: np.random.Generator):
    words = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 24))).tolist())
    if arch not in VLM:
        return to_device(processor(words, return_tensors="pt"))
    height, width = (int(x) for x in rng.integers(20, 160, size=2))
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": words}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    return to_device(processor(images=image, text=text, return_tensors="pt"))


def reference(model, inputs, n: int, **kwargs) -> list[int]:
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=n, **kwargs)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_every_method_matches_generate(arch: str) -> None:
    model, processor = build(arch)
    rng = np.random.default_rng(sum(map(ord, arch)))
    for i, n in enumerate(LENGTHS):
        inputs = make_inputs(arch, processor, rng)
        expected = reference(model, inputs, n)
        for method in METHODS:
            result = recap.generate(model, inputs, method=method, max_new_tokens=n)
            assert result.token_ids == expected, f"{arch} prompt {i} method {method}: output differs from generate"
            assert 1 + sum(result.stats.accepted_lengths) == len(expected)
            assert result.stats.steps == len(result.stats.accepted_lengths)


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "llava_next", "llama"])
def test_eos_inside_an_accepted_path(arch: str) -> None:
    """Pick EOS tokens that the greedy text reaches mid-way; decoding must stop there."""
    model, processor = build(arch)
    rng = np.random.default_rng(7)
    multi_token_stops = 0
    for _ in range(6):
        inputs = make_inputs(arch, processor, rng)
        free = reference(model, inputs, 80)
        candidates = [t for i, t in enumerate(free) if i >= 4 and t not in free[:i]]
        for eos in candidates[:3]:
            expected = reference(model, inputs, 80, eos_token_id=eos, pad_token_id=eos)
            assert expected[-1] == eos and len(expected) < 80
            for method in METHODS:
                result = recap.generate(model, inputs, method=method, max_new_tokens=80, eos_token_id=eos)
                assert result.token_ids == expected, f"{arch} {method} eos={eos}"
                if result.stats.accepted_lengths and result.stats.accepted_lengths[-1] > 1:
                    multi_token_stops += 1
    assert multi_token_stops > 0, "no EOS was reached inside a multi-token step; the test lost its power"


@pytest.mark.parametrize(
    "changes",
    [
        dict(fusion="fixed"),
        dict(fusion="strict"),
        dict(write_scope="committed"),
        dict(key_orders=(1,)),
        dict(key_orders=(2, 3), suffix_tokens=0),
        dict(node_budget=0),
        dict(node_budget=95, max_depth=16, suffix_tokens=8),
        dict(persistent=False, seed_from_prefill=False),
        dict(frequency_fallback=False),
        dict(adaptive_budget=True),
        dict(seed_context_from_prefill=True),
        dict(k=4, max_width=4),
    ],
)
def test_recap_variants_stay_lossless(changes: dict) -> None:
    config = RecapConfig(**changes)
    rng = np.random.default_rng(11)
    for arch in ("qwen2_5_vl", "llava"):
        model, processor = build(arch)
        memory = TokenMemory(output_vocab_size(model), k=config.k)
        for n in (40, 150):
            inputs = make_inputs(arch, processor, rng)
            expected = reference(model, inputs, n)
            result = recap.generate(model, inputs, "recap", n, config=config, memory=memory)
            assert result.token_ids == expected, f"{arch} {changes}"


def test_cold_and_warm_memory_and_a_memory_shared_between_requests() -> None:
    model, processor = build("qwen2_vl")
    rng = np.random.default_rng(5)
    shared = TokenMemory(output_vocab_size(model))
    table = TokenMemory(output_vocab_size(model), method="token_recycling")
    for _ in range(5):
        inputs = make_inputs("qwen2_vl", processor, rng)
        expected = reference(model, inputs, 64)
        cold = recap.generate(model, inputs, "recap", 64, memory=TokenMemory(output_vocab_size(model)))
        warm = recap.generate(model, inputs, "recap", 64, memory=shared)
        tr = recap.generate(model, inputs, "token_recycling", 64, memory=table)
        assert cold.token_ids == warm.token_ids == tr.token_ids == expected
    assert shared.rows_filled > 0 and table.rows_filled > 0


def test_statistics_are_consistent() -> None:
    model, processor = build("llava_next")
    inputs = make_inputs("llava_next", processor, np.random.default_rng(9))
    result = recap.generate(model, inputs, "recap", 100)
    stats = result.stats
    assert stats.new_tokens == len(result.token_ids)
    assert stats.mean_accepted_length == pytest.approx(sum(stats.accepted_lengths) / stats.steps)
    assert sum(stats.histogram.values()) == stats.steps
    assert sum(stats.accepted_by_source.values()) <= stats.new_tokens - stats.steps
    assert stats.nodes_verified >= stats.steps
    assert stats.time_total >= stats.time_prefill + stats.time_verify
    assert set(stats.to_dict()) >= {"mean_accepted_length", "histogram", "steps", "tokens_per_forward"}
    ar = recap.generate(model, inputs, "ar", 100).stats
    assert ar.mean_accepted_length == 1.0 and ar.nodes_verified == ar.steps
