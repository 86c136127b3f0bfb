"""Every decoder-only and image-text architecture of transformers, built tiny and offline.

Shared by ``scripts/model_families.py`` (the survey that writes the README's table) and
``tests/test_families.py`` (the parametrised lossless test).
"""

from __future__ import annotations

import dataclasses
import traceback

import numpy as np
import torch
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
)

VOCAB = 256
SLIDING_WINDOW = 12  # small, so that requests cross the window

TEXT_SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    # mixture of experts
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    moe_num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    # multi-head latent attention
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=16,
)


def _fields(config_cls) -> set[str]:
    names = {f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls) else set()
    return names | set(getattr(config_cls, "attribute_map", {}))


def tiny_text_config(model_type: str, **overrides):
    """The config of ``model_type`` with tiny sizes (only the fields it has)."""
    config_cls = CONFIG_MAPPING[model_type]
    fields = _fields(config_cls)
    default = config_cls()
    kwargs = {k: v for k, v in TEXT_SIZES.items() if k in fields}
    if getattr(default, "sliding_window", None) is not None and "sliding_window" in fields:
        kwargs["sliding_window"] = SLIDING_WINDOW
    layer_types = getattr(default, "layer_types", None)
    if isinstance(layer_types, (list, tuple)) and len(set(layer_types)) > 1:
        kinds = list(dict.fromkeys(layer_types))
        kwargs["layer_types"] = kinds if len(kinds) > 1 else kinds * 2
        kwargs["num_hidden_layers"] = len(kwargs["layer_types"])
    for name, value in (("pad_token_id", 0), ("bos_token_id", 1), ("eos_token_id", 2)):
        if name in fields:
            kwargs[name] = value
    if "kv_lora_rank" in fields:  # multi-head latent attention: keys have every head
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", 4)
    if "is_decoder" in fields:
        kwargs["is_decoder"] = True
    kwargs.update(overrides)
    config = config_cls(**kwargs)
    return config


@dataclasses.dataclass
class Family:
    model_type: str
    class_name: str
    kind: str  # "text" or "image-text"


def all_families() -> list[Family]:
    out = [Family(t, c, "text") for t, c in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items())]
    out += [Family(t, c, "image-text") for t, c in sorted(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.items())]
    return out


def build_text(family: Family, attn: str = "sdpa"):
    config = tiny_text_config(family.model_type)
    cls = getattr(transformers, family.class_name)
    torch.manual_seed(0)
    try:
        config._attn_implementation = attn
        model = cls(config).eval()
    except ValueError as exc:
        if "does not support an attention implementation" not in str(exc):
            raise
        config._attn_implementation = "eager"
        model = cls(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def reference(model, inputs, n: int, **kwargs) -> list[int]:
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=n, **kwargs)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def text_inputs(rng: np.random.Generator) -> dict:
    ids = torch.tensor([rng.integers(3, VOCAB, size=int(rng.integers(3, 30))).tolist()])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


METHODS = ("ar", "pld", "token_recycling", "recap")


def check_text(family: Family, lengths=(40, 100), seed=0) -> tuple[str, str]:
    import recap
    from recap.errors import UnsupportedModelError

    try:
        model = build_text(family)
    except Exception as exc:  # noqa: BLE001
        return "build-failed", f"{type(exc).__name__}: {exc}"[:300]
    rng = np.random.default_rng(seed)
    try:
        inputs = text_inputs(rng)
        reference(model, inputs, 4)
    except Exception as exc:  # noqa: BLE001
        return "generate-failed", f"{type(exc).__name__}: {exc}"[:300]
    try:
        for n in lengths:
            inputs = text_inputs(rng)
            expected = reference(model, inputs, n)
            cases = [(None, expected)]
            fresh = [t for i, t in enumerate(expected) if i >= 4 and t not in expected[:i]]
            if fresh:
                eos = fresh[0]
                cases.append((eos, reference(model, inputs, n, eos_token_id=eos, pad_token_id=eos)))
            for eos, want in cases:
                for method in METHODS:
                    got = recap.generate(model, inputs, method=method, max_new_tokens=n, eos_token_id=eos).token_ids
                    if got != want:
                        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                        return "mismatch", f"{method} n={n} eos={eos} first diff at {first}"
    except UnsupportedModelError as exc:
        return "refused", str(exc)
    except Exception as exc:  # noqa: BLE001
        tb = traceback.extract_tb(exc.__traceback__)[-1]
        return "crash", f"{type(exc).__name__}: {str(exc)[:200]} @ {tb.filename.split('/')[-1]}:{tb.lineno}"
    return "pass", ""
