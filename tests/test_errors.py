"""Unsupported inputs and settings raise errors that say what to do."""

from __future__ import annotations

import pytest
import torch
from tiny_models import build
from transformers import GPT2Config, GPT2LMHeadModel

import recap
from recap import InputError, TokenMemory, UnsupportedGenerationError, UnsupportedModelError


@pytest.fixture(scope="module")
def llama():
    return build("llama")


def test_batch_size_above_one_is_refused(llama) -> None:
    model, tok = llama
    inputs = tok(["the w1 w2", "a w3 w4"], return_tensors="pt")
    with pytest.raises(InputError, match="batch size 2 is not supported.*once per prompt"):
        recap.generate(model, inputs)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(num_beams=4), UnsupportedGenerationError, r"beam search \(num_beams > 1\).*num_beams=4"),
        (dict(num_beams=2, do_sample=True), UnsupportedGenerationError, "beam sampling"),
        (dict(penalty_alpha=0.6, top_k=4), UnsupportedGenerationError, "contrastive search"),
        (dict(prompt_lookup_num_tokens=3), UnsupportedGenerationError, "recap is itself the speculative decoder"),
        (dict(guidance_scale=1.5), UnsupportedGenerationError, "guidance_scale=1.5"),
        (dict(num_return_sequences=2, do_sample=True), InputError, "num_return_sequences=2"),
        (dict(return_dict_in_generate=True, output_scores=True), UnsupportedGenerationError, "output_scores"),
        (dict(cache_implementation="static"), UnsupportedGenerationError, "cache_implementation='static'"),
        (dict(stop_strings=["w3"]), UnsupportedGenerationError, "stop_strings needs the model's tokenizer"),
    ],
)
def test_settings_generate_has_but_recap_does_not_reproduce_are_refused(llama, kwargs, error, message) -> None:
    model, tok = llama
    inputs = tok("the w1 w2", return_tensors="pt")
    with pytest.raises(error, match=message):
        recap.generate(model, inputs, max_new_tokens=4, **kwargs)
    if "stop_strings" not in kwargs:  # generate itself cannot hand stop strings' tokenizer to custom_generate
        with pytest.raises(error, match=message):
            model.generate(**inputs, max_new_tokens=4, custom_generate=recap.speculative, **kwargs)


def test_an_assistant_model_is_refused_through_both_entries(llama) -> None:
    model, tok = llama
    inputs = tok("the w1 w2", return_tensors="pt")
    with pytest.raises(UnsupportedGenerationError, match="recap is itself the speculative decoder"):
        model.generate(**inputs, max_new_tokens=4, custom_generate=recap.speculative, assistant_model=model)
    with pytest.raises(UnsupportedGenerationError, match="recap is itself the speculative decoder"):
        recap.generate(model, inputs, max_new_tokens=4, assistant_model=model)


def test_unsupported_architecture_and_attention_are_refused(llama) -> None:
    config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50)
    gpt2 = GPT2LMHeadModel(config).eval()
    inputs = {"input_ids": torch.tensor([[1, 2, 3]])}
    with pytest.raises(UnsupportedModelError, match="'gpt2'.*not supported.*qwen2_5_vl"):
        recap.generate(gpt2, inputs)
    model, _ = llama
    model.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(UnsupportedModelError, match="attn_implementation='sdpa'"):
            recap.generate(model, inputs)
    finally:
        model.config._attn_implementation = "sdpa"


def test_bad_arguments(llama) -> None:
    model, tok = llama
    inputs = tok("the w1 w2", return_tensors="pt")
    with pytest.raises(ValueError, match="unknown method 'medusa'"):
        recap.generate(model, inputs, method="medusa")
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer or None"):
        recap.generate(model, inputs, max_new_tokens=0)
    padded = dict(inputs, attention_mask=torch.tensor([[0, 1, 1]]))
    with pytest.raises(InputError, match="padding"):
        recap.generate(model, padded)
    with pytest.raises(InputError, match="input_ids"):
        recap.generate(model, {"pixel_values": torch.zeros(1)})


def test_memory_of_another_method_or_vocabulary_is_refused(llama) -> None:
    model, tok = llama
    inputs = tok("the w1 w2", return_tensors="pt")
    vocab = model.get_output_embeddings().weight.shape[0]
    with pytest.raises(ValueError, match="made for method 'token_recycling'"):
        recap.generate(model, inputs, memory=TokenMemory(vocab, method="token_recycling"))
    with pytest.raises(ValueError, match="vocabulary of 7 tokens"):
        recap.generate(model, inputs, memory=TokenMemory(7))
