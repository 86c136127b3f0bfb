"""Unsupported inputs and settings raise errors that say what to do."""

from __future__ import annotations

import pytest
import torch
from families import tiny_text_config
from tiny_models import build
from transformers import LlamaForCausalLM

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


def test_flash_attention_is_refused_with_what_to_do(llama) -> None:
    model, tok = llama
    inputs = tok("the w1 w2", return_tensors="pt")
    model.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(
            UnsupportedModelError, match="'flash_attention_2' cannot take a tree mask.*attn_implementation='sdpa'"
        ):
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


def reference(model, inputs, n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=n)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def test_float_input_ids_are_refused(llama) -> None:
    model, tok = llama
    inputs = tok("the w1 w2", return_tensors="pt")
    with pytest.raises(InputError, match=r"integer token ids, got dtype torch.float32.*input_ids.long\(\)"):
        recap.generate(model, {"input_ids": inputs["input_ids"].float()})


def test_out_of_vocabulary_ids_are_refused(llama) -> None:
    model, tok = llama
    vocab = model.get_input_embeddings().num_embeddings
    for bad in (vocab, vocab + 100, -1):
        with pytest.raises(InputError, match=rf"input_ids\[0, 1\] = {bad} is outside the model's vocabulary"):
            recap.generate(model, {"input_ids": torch.tensor([[5, bad, 6]])})


def test_an_attention_mask_of_another_length_is_refused(llama) -> None:
    model, tok = llama
    inputs = tok("the w1 w2", return_tensors="pt")
    for mask in (torch.ones(1, 2, dtype=torch.long), torch.ones(1, 5, dtype=torch.long), torch.ones(3)):
        with pytest.raises(InputError, match=r"attention_mask has shape .* but input_ids has \(1, 3\)"):
            recap.generate(model, dict(inputs, attention_mask=mask))


def test_user_position_ids_are_honoured_as_generate_does() -> None:
    config = tiny_text_config("llama", initializer_range=0.3)  # weights large enough for positions to matter
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    inputs = {"input_ids": torch.tensor([[9, 4, 5, 6, 14, 18]]), "attention_mask": torch.ones(1, 6, dtype=torch.long)}
    plain = reference(model, inputs, 60)
    for gap in (0, 40, 300):  # positions 0 1 2 then a jump: RoPE sees the gap (a uniform shift it would not)
        positions = torch.tensor([[0, 1, 2, 3 + gap, 4 + gap, 5 + gap]])
        given = dict(inputs, position_ids=positions)
        expected = reference(model, given, 60)
        assert (expected == plain) == (gap == 0), "the gap must change generate's tokens, else the test has no power"
        for method in ("ar", "recap"):
            assert recap.generate(model, given, method, 60).token_ids == expected, (gap, method)
    with pytest.raises(InputError, match=r"position_ids has shape \(1, 2\).*\(1, 6\)"):
        recap.generate(model, dict(inputs, position_ids=torch.arange(2).view(1, -1)))


def _llama_with_dropout() -> tuple[LlamaForCausalLM, dict[str, torch.Tensor]]:
    """A tiny Llama in eval mode whose attention dropout (0.5) would change its tokens in train mode."""
    config = tiny_text_config("llama", initializer_range=0.3, attention_dropout=0.5)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval(), {"input_ids": torch.tensor([[9, 4, 5, 6, 14, 18]])}


def test_a_model_in_train_mode_decodes_in_eval_mode_and_is_restored() -> None:
    model, inputs = _llama_with_dropout()
    expected = reference(model, inputs, 40)
    model.train()
    model.model.layers[0].eval()  # a submodule the user froze stays in eval mode
    with torch.no_grad():  # dropout runs in train mode, so decoding in it would give other tokens
        assert not torch.equal(model(**inputs).logits, model(**inputs).logits)
    for method in ("ar", "recap"):
        assert recap.generate(model, inputs, method, 40).token_ids == expected
    assert model.training and model.model.layers[1].training and model.model.layers[1].self_attn.training
    assert not model.model.layers[0].training and not model.model.layers[0].self_attn.training


def test_one_submodule_in_train_mode_is_found_and_restored() -> None:
    model, inputs = _llama_with_dropout()
    expected = reference(model, inputs, 30)
    model.model.layers[1].self_attn.train()  # only a leaf-level module: the root reads eval
    assert recap.generate(model, inputs, "recap", 30).token_ids == expected
    assert model.model.layers[1].self_attn.training and not model.training and not model.model.layers[1].training
