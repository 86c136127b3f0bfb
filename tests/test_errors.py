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


def test_sampling_and_beams_are_refused(llama) -> None:
    model, tok = llama
    inputs = tok("the w1 w2", return_tensors="pt")
    with pytest.raises(UnsupportedGenerationError, match="do_sample=True is not supported"):
        recap.generate(model, inputs, do_sample=True)
    with pytest.raises(UnsupportedGenerationError, match="num_beams=4"):
        recap.generate(model, inputs, num_beams=4)


def test_generation_config_that_changes_greedy_output_is_refused(llama) -> None:
    model, tok = llama
    inputs = tok("the w1 w2", return_tensors="pt")
    model.generation_config.repetition_penalty = 1.05
    try:
        with pytest.raises(UnsupportedGenerationError, match=r"repetition_penalty=1.05.*Set model.generation_config"):
            recap.generate(model, inputs)
    finally:
        model.generation_config.repetition_penalty = 1.0


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
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
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
