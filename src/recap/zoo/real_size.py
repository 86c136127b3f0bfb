"""The embedded models at real shapes: trained-tiny predictions at real-shape compute (a bench instrument).

``load("tiny-qwen2.5-vl@7b")`` builds, on the fly, a model whose text side has a real model's shape
(hidden size, layers, MLP width, attention heads) and whose every output equals the tiny model's: the
tiny weights sit in the top-left blocks and everything else is zero. It costs what a model of that
shape costs per step, so ``recap bench --model tiny-qwen2.5-vl@7b`` shows what speculative decoding
gains at that size, while the tokens (and so the acceptance) stay the tiny model's.

Why the outputs are unchanged (h, H the tiny and the new hidden size):

- Residual stream: embeddings, attention outputs (o_proj) and MLP outputs (down_proj) write zeros into
  the H - h new dimensions (zero columns / rows, zero biases), so the stream is [x, 0].
- RMSNorm: the mean square of [x, 0] is (h/H) ms(x), so with eps' = eps h/H the normalised vector is
  [x, 0] / sqrt((h/H) (ms(x) + eps)) = sqrt(H/h) [x / sqrt(ms(x) + eps), 0]; weight' = weight sqrt(h/H)
  undoes the factor: the tiny model's norm on the first h dimensions, 0 on the rest (up to float rounding).
- Attention: head_dim stays 64 (so the scaling, RoPE and M-RoPE sections are unchanged). The tiny q
  heads of kv head j keep their kv head: with g tiny and G new q heads per kv head, tiny q head i goes
  to (i // g) G + i % g. New heads have zero q / k / v and their o_proj columns are zero: no output.
- MLP: new intermediate units have zero gate / up rows and zero down_proj columns.
- New layers (appended after the tiny ones) have zero o_proj and down_proj (and zero weights
  elsewhere, norms of ones): each adds exactly zero to the stream, yet costs a full layer.
- Vision: untouched; only its projection into the text stream (Qwen2.5-VL's merger output, LLaVA's
  multi_modal_projector, LLaVA-NeXT's image_newline) gets zero rows for the new dimensions.
- lm_head: zero columns for the new dimensions. The vocabulary stays the tiny one (2048 tokens), so
  the lm_head and the softmax cost much less than a real model's (a real vocabulary has ~150k tokens).

Real models with head_dim 128 (Qwen2.5-1.5B/3B/7B, Mistral-7B) are matched with twice the heads of
head_dim 64: the q / k / v / o projections have exactly the real shapes (and so the KV cache's size);
only the split of attention into heads differs. The tiny LLaVA-NeXT's text model is a Llama with
biased attention projections (real Mistral / Qwen2 text models have none or q / k / v biases only).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

LABEL = "trained-tiny predictions at real-shape compute"


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    like: str = ""  # the real model whose shape it is


SHAPES: dict[str, dict[str, Shape]] = {
    "tiny-qwen2.5-vl": {
        "0.5b": Shape(896, 24, 4864, 14, 2, "Qwen2.5-0.5B (14 / 2 heads of 64, as the real one)"),
        "1.5b": Shape(1536, 28, 8960, 24, 4, "Qwen2.5-1.5B (real: 12 / 2 heads of 128)"),
        "3b": Shape(2048, 36, 11008, 32, 4, "Qwen2.5-VL-3B's text model (real: 16 / 2 heads of 128)"),
        "7b": Shape(3584, 28, 18944, 56, 8, "Qwen2.5-VL-7B's text model (real: 28 / 4 heads of 128)"),
    },
    "tiny-llava-next": {
        "0.5b": Shape(896, 24, 4864, 14, 2, "LLaVA-OneVision-0.5B's text model, Qwen2-0.5B (14 / 2 heads of 64)"),
        "7b": Shape(4096, 32, 14336, 64, 16, "llava-v1.6-mistral-7b's Mistral-7B (real: 32 / 8 heads of 128)"),
    },
}


def split(name: str) -> tuple[str, str] | None:
    """(embedded model, shape) of a name such as ``tiny-qwen2.5-vl@7b``; None for other names."""
    if "@" not in name:
        return None
    base, shape = name.split("@", 1)
    return (base, shape) if base in SHAPES else None


def names() -> list[str]:
    return [f"{base}@{shape}" for base, shapes in SHAPES.items() for shape in shapes]


def _text_config(config: Any) -> Any:
    return getattr(config, "text_config", config)


def widened_config(config: Any, shape: Shape) -> Any:
    """The tiny model's config with the text model at ``shape`` (eps rescaled, vision projection widened)."""
    text = _text_config(config)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    h, H = text.hidden_size, shape.hidden
    g, G = text.num_attention_heads // text.num_key_value_heads, shape.heads // shape.kv_heads
    problems = []
    if shape.heads * head_dim != H:
        problems.append(f"{shape.heads} heads of {head_dim} do not make a hidden size of {H}")
    if shape.heads % shape.kv_heads or G < g or shape.kv_heads < text.num_key_value_heads:
        problems.append(
            f"{shape.heads} / {shape.kv_heads} heads cannot hold the tiny {text.num_attention_heads} / "
            f"{text.num_key_value_heads} grouping"
        )
    if H < h or shape.layers < text.num_hidden_layers or shape.intermediate < text.intermediate_size:
        problems.append("a shape can only widen and deepen the tiny model")
    if problems:
        raise ValueError(f"cannot widen to {shape}: " + "; ".join(problems))
    out = copy.deepcopy(config)
    new = _text_config(out)
    new.hidden_size, new.num_hidden_layers, new.intermediate_size = H, shape.layers, shape.intermediate
    new.num_attention_heads, new.num_key_value_heads = shape.heads, shape.kv_heads
    if hasattr(new, "head_dim"):
        new.head_dim = head_dim
    new.rms_norm_eps = text.rms_norm_eps * h / H
    if getattr(new, "layer_types", None):
        new.layer_types = [new.layer_types[0]] * shape.layers
    vision = getattr(out, "vision_config", None)
    if vision is not None and hasattr(vision, "out_hidden_size"):  # Qwen2.5-VL's merger writes the text width
        vision.out_hidden_size = H
    return out


class _Placer:
    """Puts each tiny tensor into the top-left block of its widened twin (see the module's docstring)."""

    def __init__(self, tiny: Any, wide: Any) -> None:
        t, w = _text_config(tiny), _text_config(wide)
        self.h, self.H = t.hidden_size, w.hidden_size
        self.d = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
        g, G = t.num_attention_heads // t.num_key_value_heads, w.num_attention_heads // w.num_key_value_heads
        self.q_heads = [(j // g) * G + j % g for j in range(t.num_attention_heads)]  # tiny q head -> new q head
        self.norm_scale = math.sqrt(self.h / self.H)

    def _head_rows(self, new: torch.Tensor, old: torch.Tensor) -> None:
        """q_proj weight [heads d, H] or bias [heads d]: tiny q head j's rows go to head q_heads[j]."""
        for j, target in enumerate(self.q_heads):
            _top_left(new[target * self.d : (target + 1) * self.d], old[j * self.d : (j + 1) * self.d])

    def place(self, name: str, new: torch.Tensor, old: torch.Tensor | None) -> None:
        """Fill ``new`` (zeros, the widened shape) from ``old`` (the tiny tensor, or None in a new layer)."""
        if old is None:  # a new layer: zeros (o_proj and down_proj above all), norms of ones
            if name.endswith("norm.weight"):
                new.fill_(1.0)
            return
        if ".language_model." not in name and not name.startswith("lm_head"):  # vision and its projection
            if new.shape != old.shape and not any(part in name for part in WIDENED_OUTSIDE_TEXT):
                raise ValueError(f"do not know how to widen {name} {tuple(old.shape)} -> {tuple(new.shape)}")
            _top_left(new, old)
        elif name.endswith("norm.weight"):  # input / post-attention / final RMSNorm
            _top_left(new, old * self.norm_scale)
        elif ".q_proj." in name:
            self._head_rows(new, old)
        elif ".o_proj.weight" in name:  # [H, heads d]: tiny head j's columns go to head q_heads[j]
            for j, target in enumerate(self.q_heads):
                _top_left(new[:, target * self.d : (target + 1) * self.d], old[:, j * self.d : (j + 1) * self.d])
        else:  # k / v (first kv heads), o bias, MLP, embeddings, lm_head: the top-left block
            _top_left(new, old)


WIDENED_OUTSIDE_TEXT = ("merger.mlp.2.", "multi_modal_projector.", "image_newline")


def _top_left(new: torch.Tensor, old: torch.Tensor) -> None:
    new[tuple(slice(0, size) for size in old.shape)] = old


def widen(
    tiny: torch.nn.Module,
    shape: Shape,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    name: str = "",
) -> torch.nn.Module:
    """``tiny`` (an embedded model, any device) widened and deepened to ``shape``: built on ``device`` in
    ``dtype`` directly (the model is made on the meta device, then each tensor once, in place)."""
    config = widened_config(tiny.config, shape)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = type(tiny)(config)
    placer = _Placer(tiny.config, config)
    old_state = tiny.state_dict()
    state = {}
    with torch.no_grad():
        for key, meta in model.state_dict().items():
            old = old_state.get(key)
            floating = meta.dtype.is_floating_point
            tensor = torch.zeros(meta.shape, dtype=dtype if floating else meta.dtype, device=device)
            if old is not None and not floating:
                tensor.copy_(old)
            else:
                placer.place(key, tensor, None if old is None else old.to(device=device, dtype=tensor.dtype))
            state[key] = tensor
        model.load_state_dict(state, assign=True, strict=True)
        tiny_buffers = dict(tiny.named_buffers())
        for key, buffer in list(model.named_buffers()):
            if buffer.is_meta:  # non-persistent buffers (rotary frequencies, position ids): the tiny model's
                module_name, _, leaf = key.rpartition(".")
                model.get_submodule(module_name)._buffers[leaf] = tiny_buffers[key].to(device)
    model.generation_config = copy.deepcopy(tiny.generation_config)
    model.config._name_or_path = name or f"{getattr(tiny.config, '_name_or_path', '')}@widened"
    model.config.recap_note = LABEL
    return model.eval()


def load(name: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """(model, processor) of ``name`` = ``<embedded model>@<shape>`` (``names()``), built on ``device``."""
    from . import load as load_tiny

    parts = split(name)
    if parts is None or parts[1] not in SHAPES[parts[0]]:
        raise ValueError(f"no real-shape model {name!r}; available: {', '.join(names())}")
    base, size = parts
    tiny, processor = load_tiny(base)
    return widen(tiny, SHAPES[base][size], device=device, dtype=dtype, name=name), processor
