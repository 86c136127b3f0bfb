"""Models that lack what tree verification needs are refused up front, naming what they lack
and what to do; models that have it are accepted whatever their name."""

from __future__ import annotations

import pytest
import torch
import transformers
from families import tiny_text_config

import recap
from recap import UnsupportedModelError
from recap.backends.capabilities import check_config, tree_support

PROMPT = {"input_ids": torch.tensor([[5, 6, 7, 8]])}


def _model(model_type: str, class_name: str, **overrides) -> torch.nn.Module:
    config = tiny_text_config(model_type, **overrides)
    cls = getattr(transformers, class_name)
    config._attn_implementation = "sdpa" if cls._supports_sdpa else "eager"
    torch.manual_seed(0)
    return cls(config).eval()


@pytest.mark.parametrize(
    ("model_type", "class_name", "overrides", "reason"),
    [
        ("qwen3_next", "Qwen3NextForCausalLM", {}, r"'linear_attention' layers, whose recurrent state"),
        ("falcon_h1", "FalconH1ForCausalLM", {}, r"'hybrid' layers, whose recurrent state"),
        ("mamba", "MambaForCausalLM", {}, r"forward takes no position_ids"),
        ("deepseek_v32", "DeepseekV32ForCausalLM", {}, r"sparse-attention indexer \(DSA\)"),
        ("falcon", "FalconForCausalLM", {"alibi": True}, r"uses ALiBi"),
        ("gpt2", "GPT2LMHeadModel", {"add_cross_attention": True}, r"cross-attention layers"),
    ],
)
def test_models_without_a_tree_capability_are_refused(model_type, class_name, overrides, reason) -> None:
    model = _model(model_type, class_name, **overrides)
    with pytest.raises(UnsupportedModelError, match=rf"{class_name} \(model type '{model_type}'\).*{reason}.*generate"):
        recap.generate(model, PROMPT, max_new_tokens=4)


@pytest.mark.parametrize(
    ("model_type", "class_name"),
    [
        ("deepseek_v2", "DeepseekV2ForCausalLM"),
        ("deepseek_v3", "DeepseekV3ForCausalLM"),
        ("minicpm3", "MiniCPM3ForCausalLM"),
    ],
)
def test_latent_attention_with_fewer_key_value_heads_is_refused_clearly(model_type, class_name) -> None:
    """Built with num_key_value_heads != num_attention_heads, these crashed inside SDPA with a shape
    error; now they are refused naming the fix, and built as the checkpoints are they decode."""
    model = _model(model_type, class_name, num_key_value_heads=2)  # num_attention_heads=4
    fix = r"Set config.num_key_value_heads = config.num_attention_heads \(= 4\)"
    with pytest.raises(UnsupportedModelError, match=rf"{class_name} .*latent attention.*num_key_value_heads=2.*{fix}"):
        recap.generate(model, PROMPT, max_new_tokens=4)
    with pytest.raises(UnsupportedModelError, match="latent attention"):
        check_config(model.config)
    model = _model(model_type, class_name)  # num_key_value_heads = num_attention_heads, as tests/families.py builds
    with torch.inference_mode():
        expected = model.generate(**PROMPT, do_sample=False, max_new_tokens=8)[0, 4:].tolist()
    assert recap.generate(model, PROMPT, max_new_tokens=8).token_ids == expected


def test_a_config_is_checked_before_weights_are_loaded() -> None:
    with pytest.raises(UnsupportedModelError, match="recurrent state"):
        check_config(tiny_text_config("qwen3_next"))
    with pytest.raises(UnsupportedModelError, match="encoder-decoder model"):
        check_config(tiny_text_config("bart"))
    assert check_config(tiny_text_config("llama")).kinds[0].layer_type == "full_attention"


def test_a_model_on_the_meta_device_is_refused() -> None:
    config = tiny_text_config("llama")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    with pytest.raises(UnsupportedModelError, match="'meta' device.*Load the weights first"):
        recap.generate(model, PROMPT, max_new_tokens=4)


def test_a_model_that_replaces_the_cache_is_refused_before_any_token() -> None:
    model = _model("openai-gpt", "OpenAIGPTLMHeadModel")  # keeps no cache at all
    with pytest.raises(UnsupportedModelError, match="instead of the cache recap passes"):
        recap.generate(model, PROMPT, max_new_tokens=4)


@pytest.mark.parametrize(
    ("model_type", "class_name"),
    [("gpt2", "GPT2LMHeadModel"), ("gemma2", "Gemma2ForCausalLM"), ("mixtral", "MixtralForCausalLM")],
)
def test_models_outside_the_old_allow_list_are_accepted(model_type, class_name) -> None:
    model = _model(model_type, class_name)
    assert tree_support(model).kinds
    with torch.inference_mode():
        expected = model.generate(**PROMPT, do_sample=False, max_new_tokens=20)[0, 4:].tolist()
    assert recap.generate(model, PROMPT, max_new_tokens=20).token_ids == expected
