"""Tree verification on Hugging Face transformers models (5.x): masks, positions, cache.

Supported and tested: Qwen2.5-VL, Qwen2-VL (M-RoPE), LLaVA-1.5, LLaVA-NeXT and the
decoder-only causal LMs listed in ``SUPPORTED_MODEL_TYPES``. No model file is forked: the
tree is verified through the model's own forward with a 4-D mask and explicit positions.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..errors import UnsupportedModelError
from ..topk import TopK
from ..tree import DraftTree

MROPE_MODEL_TYPES = ("qwen2_5_vl", "qwen2_vl")
SUPPORTED_MODEL_TYPES = (*MROPE_MODEL_TYPES, "llava", "llava_next", "llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ATTENTION = ("sdpa", "eager")

_prefill_locks: weakref.WeakKeyDictionary[torch.nn.Module, threading.Lock] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def _prefill_lock(model: torch.nn.Module) -> threading.Lock:
    """A lock per model: Qwen's rope_deltas is state on the model, set by each prefill."""
    with _registry_lock:
        lock = _prefill_locks.get(model)
        if lock is None:
            lock = _prefill_locks[model] = threading.Lock()
        return lock


def output_vocab_size(model: torch.nn.Module) -> int:
    """Number of logits the model returns per position."""
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise UnsupportedModelError(f"{type(model).__name__} has no output embedding (lm_head)")
    return int(head.weight.shape[0])


def image_token_ids(model: torch.nn.Module) -> frozenset[int]:
    """Placeholder token ids of images and videos: never keys, never draft nodes."""
    config = model.config
    ids = set()
    for name in ("image_token_id", "image_token_index", "video_token_id", "video_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value >= 0:
            ids.add(value)
    return frozenset(ids)


def check_supported(model: torch.nn.Module) -> None:
    """Raise ``UnsupportedModelError`` unless the model is one we verify against."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model type {model_type!r} ({type(model).__name__}) is not supported: recap verifies draft "
            f"trees only on architectures it is tested against: {', '.join(SUPPORTED_MODEL_TYPES)}."
        )
    attention = getattr(model.config, "_attn_implementation", None) or "eager"
    if attention not in SUPPORTED_ATTENTION:
        raise UnsupportedModelError(
            f"attention implementation {attention!r} cannot take a tree mask: load the model with "
            f"attn_implementation='sdpa' (or 'eager')."
        )
    if not hasattr(model, "get_output_embeddings"):
        raise UnsupportedModelError(f"{type(model).__name__} is not a generative model with an lm_head")


def cache_kwarg(model: torch.nn.Module) -> str:
    """The keyword the model's forward takes its KV cache under: ``cache`` from transformers 5.24,
    ``past_key_values`` before (5.23 and older; vLLM 0.32 pins transformers < 5.20)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy token [N] and top-k (ids, full-vocabulary probs) [N, k] of logits [N, V]."""
    logits = logits.float()
    probs, ids = torch.softmax(logits, dim=-1).topk(k, dim=-1)
    return ids, probs


class HFTarget:
    """One request's view of a transformers model: prefill, tree verify, KV commit.

    ``length`` is the number of committed tokens in the cache; the root of the next tree
    (the last committed token) is not in it yet.
    """

    def __init__(self, model: torch.nn.Module, k: int) -> None:
        check_supported(model)
        self.model = model
        self.k = k
        self.mrope = model.config.model_type in MROPE_MODEL_TYPES
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cache = None
        self.cache_kwarg = cache_kwarg(model)
        self.length = 0
        self.rope_delta = 0
        self._pending = 0

    def prefill(self, inputs: Mapping[str, torch.Tensor], positions: Sequence[int]) -> tuple[int, TopK | None]:
        """Run the prompt (and images); return the first new token and the top-k at
        ``positions`` of the prompt (None if no positions were asked for)."""
        inputs = {
            key: value.to(self.device) if isinstance(value, torch.Tensor) else value for key, value in inputs.items()
        }
        length = int(inputs["input_ids"].shape[1])
        keep = torch.tensor([*positions, length - 1], device=self.device) if positions else 1
        with torch.inference_mode(), _prefill_lock(self.model):
            if self.mrope:
                self.model.model.rope_deltas = None
            out = self.model(**inputs, use_cache=True, logits_to_keep=keep)
            if self.mrope:
                delta = self.model.model.rope_deltas
                self.rope_delta = int(delta.reshape(-1)[0]) if delta is not None else 0
        self.cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        self.length = length
        logits = out.logits[0]  # [P + 1, V]
        first = int(logits[-1].argmax())
        if not positions:
            return first, None
        ids, probs = _topk(logits[:-1], self.k)
        return first, TopK(ids.cpu().numpy(), probs.cpu().numpy())

    def verify(self, tree: DraftTree) -> tuple[np.ndarray, TopK]:
        """One forward over all tree nodes. Returns the greedy next token after each node
        [N] and the top-k there."""
        n, length = len(tree), self.length
        device = self.device
        input_ids = torch.from_numpy(tree.tokens).to(device).view(1, n)
        positions = torch.from_numpy(tree.depths + (length + self.rope_delta)).to(device)
        position_ids = positions.view(1, 1, n).expand(3, 1, n) if self.mrope else positions.view(1, n)
        blocked = torch.from_numpy(~tree.ancestor_mask()).to(device)
        mask = torch.zeros((1, 1, n, length + n), dtype=self.dtype, device=device)
        mask[0, 0, :, length:].masked_fill_(blocked, torch.finfo(self.dtype).min)
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
                **{self.cache_kwarg: self.cache},
            )  # fmt: skip
            logits = out.logits[0]  # [N, V]
            greedy = logits.argmax(dim=-1)
            ids, probs = _topk(logits, self.k)
            ids_and_greedy = torch.cat([greedy[:, None], ids], dim=1).cpu().numpy()
            probs = probs.cpu().numpy()
        self._pending = n
        return ids_and_greedy[:, 0], TopK(ids_and_greedy[:, 1:], probs)

    def commit(self, path: Sequence[int]) -> None:
        """Keep the cache entries of the accepted ``path`` (node indices, root first; empty
        discards the whole tree).

        The accepted entries are moved down to slots L .. L+m-1 (a copy of m entries, not of
        the whole cache) and the rest is cropped away.
        """
        n, length, kept = self._pending, self.length, len(path)
        if list(path) != list(range(kept)):
            source = torch.as_tensor(list(path), device=self.device) + length
            with torch.inference_mode():
                for layer in self.cache.layers:
                    if getattr(layer, "keys", None) is not None and layer.keys.numel():
                        layer.keys[..., length : length + kept, :] = layer.keys.index_select(-2, source)
                        layer.values[..., length : length + kept, :] = layer.values.index_select(-2, source)
        if kept < n:
            self.cache.crop(-(n - kept))
        self.length += kept
        self._pending = 0

    def close(self) -> None:
        self.cache = None
