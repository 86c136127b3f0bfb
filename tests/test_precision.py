"""Precision: float32 and float64 give generate's tokens exactly; in bfloat16 / float16 recap's
tokens may leave generate's, but only where generate's own top two logits are within the
dtype's rounding of each other (a near-tie), never elsewhere. On RECAP_TEST_DEVICE (default cpu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from devices import DEVICE, to_device
from families import tiny_text_config
from near_ties import first_divergence, generate_with_logits

import recap
import recap.zoo
from recap.bench.workloads import suite_requests
from recap.loading import build_inputs

METHODS = ("ar", "pld", "token_recycling", "recap")


def _random_model(model_type: str, class_name: str, dtype: torch.dtype) -> torch.nn.Module:
    config = tiny_text_config(model_type, initializer_range=0.2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return getattr(transformers, class_name)(config).eval().to(DEVICE, dtype)


def _prompts(count: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        ids = torch.tensor([rng.integers(3, 250, size=int(rng.integers(3, 30))).tolist()], device=DEVICE)
        yield {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_float64_gives_identical_tokens() -> None:
    model = _random_model("qwen2", "Qwen2ForCausalLM", torch.float64)
    for inputs in _prompts(4, seed=3):
        expected, _ = generate_with_logits(model, inputs, 80)
        for method in METHODS:
            assert recap.generate(model, inputs, method, 80).token_ids == expected, method


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_divergences_start_at_near_ties_on_random_models(dtype: torch.dtype) -> None:
    divergences = []
    for model_type, class_name in (("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM")):
        model = _random_model(model_type, class_name, dtype)
        for inputs in _prompts(6, seed=1):
            expected, logits = generate_with_logits(model, inputs, 100)
            for method in ("token_recycling", "recap"):
                got = recap.generate(model, inputs, method, 100).token_ids
                divergence = first_divergence(expected, logits, got, dtype)
                if divergence is not None:
                    assert divergence.near_tie, f"{model_type} {dtype} {method}: {divergence} is not a near-tie"
                    divergences.append(divergence)
    if dtype == torch.bfloat16:  # bf16 rounding is coarse enough that some request diverges: the test has power
        assert divergences, "no bfloat16 divergence at all: the near-tie check was never exercised"


@pytest.mark.parametrize("name", ["tiny-qwen2.5-vl", "tiny-llava-next"])
def test_bfloat16_divergences_on_the_embedded_models_are_near_ties(name: str) -> None:
    model, processor = recap.zoo.load(name)
    model = model.to(DEVICE, torch.bfloat16)
    for request in suite_requests("ocr,describe,chart", samples=2, seed=0):
        inputs = to_device(build_inputs(processor, request.prompt, request.image))
        expected, logits = generate_with_logits(model, inputs, 80)
        got = recap.generate(model, inputs, "recap", 80).token_ids
        divergence = first_divergence(expected, logits, got, torch.bfloat16)
        assert divergence is None or divergence.near_tie, f"{name} {request.id}: {divergence}"
