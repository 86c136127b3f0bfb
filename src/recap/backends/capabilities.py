"""What tree verification needs from a transformers model, checked before any work.

A draft tree of N nodes is verified in one forward of the model's own code: recap passes a
4-D additive mask (who may attend to whom), explicit ``position_ids`` (each node at its
depth) and a ``DynamicCache``, then keeps the accepted nodes' keys and values by re-indexing
and cropping the cache. So the model must

- return logits (an lm_head) and be a decoder-only model with loaded weights;
- take a 4-D additive mask: ``sdpa`` or ``eager`` attention (not flash or flex attention);
- place tokens by ``position_ids`` (its forward takes them, as ``generate`` passes them);
  M-RoPE models (Qwen2-VL and kin) qualify: ``generate``'s own position rule is used;
- keep per-token keys and values that can be cropped and re-indexed: no recurrent state
  (Mamba, linear attention, conv layers), no sparse-attention indexer;
- have no ALiBi bias computed from cache slots and no cross-attention layers;
- multi-head latent attention (DeepSeek-V2/V3, MiniCPM3, ...): ``num_key_value_heads`` equal
  to ``num_attention_heads`` (its keys and values have every head; the checkpoints are built so).

Sliding-window and chunked layers are supported: recap keeps all their entries and applies
the window in its own mask, so requests may run past the window.
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass

import torch

from ..errors import UnsupportedModelError

TREE_ATTENTION = ("sdpa", "eager")
# cache layer types (transformers' DYNAMIC_LAYER_TYPE_MAPPING) and what recap does with them
MASKED_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")
RECURRENT_LAYER_TYPES = ("linear_attention", "conv", "hybrid", "hybrid_sliding", "mamba", "recurrent")
NO_CACHE_LAYER_TYPES = ("dummy", "moe", "mlp")


@dataclass(frozen=True)
class AttentionKind:
    """How one group of layers masks its keys: ``window`` is the sliding window or chunk size."""

    layer_type: str  # "full_attention", "sliding_attention" or "chunked_attention"
    window: int | None = None


@dataclass(frozen=True)
class TreeSupport:
    """What the backend needs to know about a model that passed the checks.

    kinds: the distinct attention kinds of the decoder's layers; with more than one, the
    mask is passed as a dict keyed by layer type (transformers' per-layer-type masks).
    """

    kinds: tuple[AttentionKind, ...]

    @property
    def by_type(self) -> bool:
        return len(self.kinds) > 1


USE_GENERATE = "Use model.generate for this model."


def _refuse(model_or_config, lacks: str, todo: str) -> UnsupportedModelError:
    config = getattr(model_or_config, "config", model_or_config)
    name = type(model_or_config).__name__ if isinstance(model_or_config, torch.nn.Module) else "this model"
    model_type = getattr(config, "model_type", None)
    return UnsupportedModelError(f"{name} (model type {model_type!r}) cannot verify draft trees: {lacks}. {todo}")


def _text_config(config):
    """The decoder's config (the text model's, for a vision-language model)."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def text_config(model: torch.nn.Module):
    return _text_config(model.config)


def _attention_implementation(model: torch.nn.Module) -> str:
    for config in (text_config(model), model.config):
        value = getattr(config, "_attn_implementation", None)
        if value:
            return value
    return "eager"


@functools.cache
def _module_builds_alibi(model_class: type) -> bool:
    """A module of the class or its bases defines an alibi builder (a class's modules do not change)."""
    modules = {sys.modules.get(cls.__module__) for cls in model_class.__mro__}
    return any(module is not None and any("alibi" in name.lower() for name in vars(module)) for module in modules)


def forward_parameters(model: torch.nn.Module) -> frozenset[str]:
    """The names of the parameters of ``model.forward`` (read once per forward function)."""
    forward = model.forward
    function = getattr(forward, "__func__", None)
    if function is None or "forward" in vars(model):  # a wrapped instance forward (e.g. a hook): read it each time
        return frozenset(inspect.signature(forward).parameters)
    return _function_parameters(function)


@functools.cache
def _function_parameters(function) -> frozenset[str]:
    return frozenset(list(inspect.signature(function).parameters)[1:])  # without self


def _uses_alibi(model: torch.nn.Module) -> bool:
    """ALiBi: the model's module defines an alibi builder, and no config flag turns it off."""
    if not _module_builds_alibi(type(model)):
        return False
    config = text_config(model)
    for holder in (config, getattr(config, "attn_config", None)):
        flag = getattr(holder, "alibi", None)
        if isinstance(flag, bool):
            return flag
    return True


def _attention_kinds(model) -> tuple[AttentionKind, ...]:
    from transformers.cache_utils import get_layer_types_and_kwargs

    config = _text_config(getattr(model, "config", model))
    try:
        layer_types, layer_kwargs = get_layer_types_and_kwargs(config)
    except (AttributeError, TypeError, ValueError) as exc:
        raise _refuse(model, f"its layers' cache types cannot be read from its config ({exc})", USE_GENERATE) from exc
    if isinstance(layer_kwargs, dict):  # transformers < 5.19: one dict of kwargs shared by every layer
        layer_kwargs = [layer_kwargs] * len(layer_types)
    kinds: dict[str, AttentionKind] = {}
    for layer_type, kwargs in zip(layer_types, layer_kwargs):
        if layer_type in NO_CACHE_LAYER_TYPES:
            continue
        if layer_type in RECURRENT_LAYER_TYPES:
            raise _refuse(
                model,
                f"it has {layer_type!r} layers, whose recurrent state (Mamba / linear attention / convolution) "
                "cannot be rolled back to one branch of a tree",
                USE_GENERATE,
            )
        if layer_type == "indexed_attention":
            raise _refuse(
                model,
                "its sparse-attention indexer (DSA) selects keys itself, ignoring a tree mask",
                USE_GENERATE,
            )
        if layer_type not in MASKED_LAYER_TYPES:
            lacks = f"its cache has layers of type {layer_type!r}, which recap does not know"
            raise _refuse(model, lacks, USE_GENERATE)
        window = kwargs.get("sliding_window") if layer_type != "full_attention" else None
        kind = AttentionKind(layer_type, int(window) if window is not None else None)
        if kinds.setdefault(layer_type, kind) != kind:
            raise _refuse(
                model,
                f"its {layer_type} layers have different windows ({kinds[layer_type].window} and {kind.window})",
                USE_GENERATE,
            )
    if not kinds:
        raise _refuse(model, "it has no attention layers with a key/value cache", USE_GENERATE)
    return tuple(kinds.values())


def tree_support(model: torch.nn.Module) -> TreeSupport:
    """Check every capability tree verification needs; raise ``UnsupportedModelError``
    naming the first one missing and what to do."""
    if not isinstance(model, torch.nn.Module) or not hasattr(getattr(model, "config", None), "model_type"):
        raise UnsupportedModelError(
            f"expected a transformers model (a torch.nn.Module with a config), got {type(model).__name__}"
        )
    parameter = next(model.parameters(), None)
    if parameter is not None and parameter.is_meta:
        raise _refuse(
            model,
            "its weights are on the 'meta' device (not loaded)",
            "Load the weights first (e.g. from_pretrained(...) without device_map='meta', or model.to_empty() "
            "and load_state_dict), then move the model to a real device.",
        )
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or not hasattr(head, "weight"):
        raise _refuse(
            model,
            "it has no lm_head (output embeddings)",
            "Pass the *ForCausalLM or *ForConditionalGeneration model, not the base model.",
        )
    attention = _attention_implementation(model)
    if attention not in TREE_ATTENTION:
        raise _refuse(
            model,
            f"attention implementation {attention!r} cannot take a tree mask",
            "Load the model with attn_implementation='sdpa' (or 'eager').",
        )
    _check_decoder_only(model.config, model)
    if _uses_alibi(model):
        raise _refuse(
            model,
            "it uses ALiBi, a bias the model computes from cache slots or a 2-D mask, which gives the nodes of "
            "a tree's side branches the distances of their slots instead of their positions",
            USE_GENERATE,
        )
    if "position_ids" not in forward_parameters(model):
        raise _refuse(
            model,
            "its forward takes no position_ids, so draft-tree nodes cannot be placed at their depth",
            USE_GENERATE,
        )
    return check_config(model.config, model)


def check_config(config, model: torch.nn.Module | None = None) -> TreeSupport:
    """The checks a config alone answers (run before loading weights, and again on the model)."""
    owner = model if model is not None else config
    _check_decoder_only(config, owner)
    _check_latent_attention(config, owner)
    return TreeSupport(kinds=_attention_kinds(owner))


def _field(config, name: str):
    try:
        return getattr(config, name, None)
    except Exception:  # e.g. a per-layer (heterogeneous) config with no single value
        return None


def _check_latent_attention(config, owner) -> None:
    """Multi-head latent attention builds keys and values for every query head, but attention
    repeats them ``num_attention_heads // num_key_value_heads`` times: a config where the two
    differ fails in attention under a 4-D mask (a shape error in SDPA; generate too, given a mask)."""
    text = _text_config(config)
    if not _field(text, "kv_lora_rank"):
        return
    heads, kv_heads = _field(text, "num_attention_heads"), _field(text, "num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv_heads, int) and heads != kv_heads:
        raise _refuse(
            owner,
            f"it uses multi-head latent attention (kv_lora_rank={text.kv_lora_rank}) with num_key_value_heads="
            f"{kv_heads} but num_attention_heads={heads}: its keys and values have all {heads} heads, so "
            "attention under a mask fails on their shapes",
            f"Set config.num_key_value_heads = config.num_attention_heads (= {heads}) before building the model, "
            "as the published checkpoints have it (the weights do not change).",
        )


def _check_decoder_only(config, owner) -> None:
    if getattr(config, "is_encoder_decoder", False):
        raise _refuse(owner, "it is an encoder-decoder model; recap verifies decoder-only models", USE_GENERATE)
    text = _text_config(config)
    if getattr(text, "cross_attention_layers", None) or getattr(text, "add_cross_attention", False):
        raise _refuse(
            owner,
            "it has cross-attention layers, whose cache and per-step cross-attention mask recap's tree "
            "forward does not handle",
            USE_GENERATE,
        )
