"""Sliding-window models decode exactly like generate up to and across their window: recap keeps
every cache entry and applies each layer kind's window in the tree mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from families import tiny_text_config

import recap
from recap.backends import hf

WINDOW = 8
METHODS = ("ar", "pld", "token_recycling", "recap")
CASES = {
    # every layer sliding: one mask tensor
    "mistral": ("MistralForCausalLM", dict(sliding_window=WINDOW)),
    # full and sliding layers mixed: a mask per layer type
    "qwen2": ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "gemma2": ("Gemma2ForCausalLM", dict(sliding_window=WINDOW)),
    # chunked attention (llama4): keys only from the query's own chunk
    "llama4_text": ("Llama4ForCausalLM", dict(attention_chunk_size=WINDOW, no_rope_layers=[1, 0])),
}


def _model(model_type: str) -> torch.nn.Module:
    class_name, overrides = CASES[model_type]
    config = tiny_text_config(model_type, initializer_range=0.3, **overrides)
    cls = getattr(transformers, class_name)
    config._attn_implementation = "sdpa" if cls._supports_sdpa else "eager"
    torch.manual_seed(0)
    return cls(config).eval()


def _cases(model, seed: int):
    rng = np.random.default_rng(seed)
    for length, new in ((3, 40), (WINDOW - 1, 6), (WINDOW, 30), (25, 60)):
        ids = torch.tensor([rng.integers(3, 200, size=length).tolist()])
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new
            )
        yield {"input_ids": ids}, new, out[0, length:].tolist()


@pytest.mark.parametrize("model_type", list(CASES))
def test_sliding_window_models_match_generate_across_the_window(model_type: str) -> None:
    model = _model(model_type)
    kinds = {kind.layer_type: kind.window for kind in hf.check_supported(model).kinds}
    assert WINDOW in kinds.values(), kinds
    for inputs, new, expected in _cases(model, seed=1):
        for method in METHODS:
            got = recap.generate(model, inputs, method, new).token_ids
            assert got == expected, f"{model_type} {method} prompt {inputs['input_ids'].shape[1]} + {new}"


def test_the_window_in_the_tree_mask_is_what_keeps_them_exact(monkeypatch) -> None:
    """Without the window in the tree mask, a request past the window goes wrong: the test has power."""
    model = _model("mistral")
    cases = list(_cases(model, seed=1))
    monkeypatch.setattr(hf, "_kind_blocked", lambda kind, query, key: None)
    wrong = sum(recap.generate(model, inputs, "recap", new).token_ids != expected for inputs, new, expected in cases)
    assert wrong > 0
