"""Tree verification on Hugging Face transformers models (5.x): masks, positions, cache.

Any decoder-only model with the capabilities in ``capabilities.py`` is verified (docs/models.md
lists the tested families). No model file is forked: the tree is verified through the
model's own forward with a 4-D mask, explicit positions and a cache recap owns.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..core.topk import TopK
from ..core.tree import DraftTree
from ..core.vocab import output_vocab_size
from ..errors import UnsupportedModelError
from ..kernels import verify as verify_kernels
from . import Prefill, Verification, few_row_linear, grouped_sdpa
from .capabilities import AttentionKind, TreeSupport, forward_parameters, tree_support

__all__ = ["HFTarget", "NOT_PROMPT_INPUTS", "check_supported", "output_vocab_size", "placeholder_ids"]

_prefill_locks: weakref.WeakKeyDictionary[torch.nn.Module, threading.Lock] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def _prefill_lock(model: torch.nn.Module) -> threading.Lock:
    """A lock per model: M-RoPE models keep rope_deltas as state on the model, set at prefill."""
    with _registry_lock:
        lock = _prefill_locks.get(model)
        if lock is None:
            lock = _prefill_locks[model] = threading.Lock()
        return lock


def placeholder_ids(config: Any) -> frozenset[int]:
    """The image / video placeholder token ids a model config names: never keys, never draft nodes."""
    ids = set()
    for name in ("image_token_id", "image_token_index", "video_token_id", "video_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value >= 0:
            ids.add(value)
    return frozenset(ids)


# inputs a prompt's forward does not take from the caller: recap passes its own cache and keeps
# what it needs; labels are a training input (some processors return them)
NOT_PROMPT_INPUTS = ("labels", "cache", "past_key_values", "use_cache", "logits_to_keep")


def check_supported(model: torch.nn.Module) -> TreeSupport:
    """Raise ``UnsupportedModelError`` unless the model has what tree verification needs."""
    return tree_support(model)


def _new_cache(model: torch.nn.Module):
    """The model's own DynamicCache, except that sliding-window and chunked layers keep every
    entry (plain ``DynamicLayer``): recap applies their window in its mask, and a layer that
    dropped old entries could not be cropped back or re-indexed."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    cache = DynamicCache(config=model.config)
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, DynamicSlidingWindowLayer):
            cache.layers[i] = DynamicLayer()
    return cache


def _generation_positions(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The position_ids ``generate`` gives the prompt: the user's, else the model's own rule
    (arange, or M-RoPE's [3 or 4, 1, L] from the image grid). Shape [1, L] or [R, 1, L]."""
    given = inputs.get("position_ids")
    if given is not None:
        return given
    prepare = getattr(model, "_prepare_position_ids_for_generation", None)
    if prepare is None:
        return torch.arange(inputs["input_ids"].shape[1], device=inputs["input_ids"].device).view(1, -1)
    return prepare(inputs["input_ids"], dict(inputs))


def _kind_blocked(kind: AttentionKind, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
    """[N, L + N] bool: keys outside ``kind``'s window (None for full attention). ``query`` [N]
    and ``key`` [L + N] are sequence indices (a node's is L + its depth)."""
    if kind.window is None:
        return None
    if kind.layer_type == "chunked_attention":
        return (key[None, :] // kind.window) != (query[:, None] // kind.window)
    return query[:, None] - key[None, :] >= kind.window


def cache_kwarg(model: torch.nn.Module) -> str:
    """The keyword the model's forward takes its KV cache under: ``cache`` from transformers 5.24,
    ``past_key_values`` before (5.23 and older; vLLM 0.32 pins transformers < 5.20)."""
    return "cache" if "cache" in forward_parameters(model) else "past_key_values"


def _candidates(logits: torch.Tensor, k: int) -> tuple[np.ndarray, TopK]:
    """The greedy token [N] (``argmax``, as generate takes it) and the top-k (ids, full-vocabulary
    probs) [N, k] of ``logits`` [N, V], on the host. On the CPU compiled passes per row find them
    (torch's argmax, topk, logsumexp and exp cost 2-3x as much on a few rows in the decode loop, and
    more than the compiled pass's vectorized exp on many rows of a large vocabulary too); elsewhere
    torch's own ops."""
    if logits.dtype != torch.float32:
        logits = logits.float()
    if logits.is_cpu:
        rows = logits.numpy()
        if not rows.flags.c_contiguous:
            rows = np.ascontiguousarray(rows)
        greedy, ids, probs = verify_kernels.top_candidates_and_probabilities(rows, k)
        return greedy, TopK(ids, probs)
    probs, ids = torch.softmax(logits, dim=-1).topk(k, dim=-1)
    ids_and_greedy = torch.cat([logits.argmax(dim=-1)[:, None], ids], dim=1).cpu().numpy()
    return ids_and_greedy[:, 0], TopK(ids_and_greedy[:, 1:], probs.cpu().numpy())


class HFTarget:
    """One request's view of a transformers model, the decode loop's only window on it: the facts
    it needs (``vocab_size``, ``placeholder_ids``; the support check runs on construction) and the
    three operations prefill, tree verify, KV commit.

    ``k``: candidates per row of the top-k handed to the drafters; ``support``: what
    ``check_supported(model)`` returned for this call already (it is not run again). ``length`` is
    the number of committed tokens in the cache; the root of the next tree (the last committed
    token) is not in it yet.
    """

    def __init__(self, model: torch.nn.Module, k: int, support: TreeSupport | None = None) -> None:
        self.support = check_supported(model) if support is None else support
        self.model = model
        self.k = k  # candidates per row of the top-k handed to drafters
        self.vocab_size = output_vocab_size(model)
        self.placeholder_ids = placeholder_ids(model.config)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cache = None
        self.cache_kwarg = cache_kwarg(model)
        self.length = 0
        # position of the node at cache slot s and depth 0 is s + position_base; [1, 1] or
        # [R, 1, 1] (R rows of M-RoPE positions)
        self.position_base = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        self._pending = 0
        # tree forwards on the CPU: grouped KV heads skip repeat_kv (grouped_sdpa), linear layers take
        # their few rows with the faster of two kernels for the shape (few_row_linear)
        self._on_cpu = self.device.type == "cpu"
        # every layer attends to the whole prefix: one mask serves them all (else one per attention kind)
        self._one_full_mask = not self.support.by_type and self.support.kinds[0].window is None
        if self._on_cpu:
            grouped_sdpa.install()
            few_row_linear.install()

    def prefill(self, inputs: Mapping[str, torch.Tensor], positions: Sequence[int]) -> Prefill:
        """Run the prompt (and images); return the greedy first new token and the top-k at
        ``positions`` of the prompt (None if no positions were asked for).

        ``inputs``: the model's forward inputs, either a processor's output or what ``generate``
        prepares for its own prefill (``prepare_inputs_for_generation``: pre-encoded images, M-RoPE
        ``position_ids`` [4, 1, L]); given ``position_ids`` are used as they are."""
        inputs = {
            key: value.to(self.device) if isinstance(value, torch.Tensor) else value
            for key, value in inputs.items()
            if key not in NOT_PROMPT_INPUTS
        }
        length = int(inputs["input_ids"].shape[1])
        keep = torch.tensor([*positions, length - 1], device=self.device) if positions else 1
        cache = _new_cache(self.model)
        with torch.inference_mode(), _prefill_lock(self.model):
            inputs["position_ids"] = position_ids = _generation_positions(self.model, inputs)
            out = self.model(**inputs, use_cache=True, **{self.cache_kwarg: cache}, logits_to_keep=keep)
        returned = getattr(out, self.cache_kwarg, None)  # ``cache`` from transformers 5.24, else past_key_values
        if returned is not cache:
            raise UnsupportedModelError(
                f"{type(self.model).__name__} (model type {self.model.config.model_type!r}) cannot verify draft "
                f"trees: it keeps its own {type(returned).__name__} instead of the cache recap "
                "passes, so recap cannot crop or re-index it. Use model.generate for this model."
            )
        self.cache = cache
        self.position_base = position_ids[..., -1:] + (1 - length)
        self.length = length
        logits = out.logits[0]  # [P + 1, V]
        if not positions:
            return Prefill(int(logits[-1].argmax()), None, logits[-1:])
        greedy, topk = _candidates(logits, self.k)
        return Prefill(int(greedy[-1]), TopK(topk.ids[:-1], topk.probs[:-1]), logits[-1:])

    def verify(self, tree: DraftTree) -> Verification:
        """One forward over all tree nodes: the greedy next token after each node [N], the
        top-k there and the raw logits [N, V]."""
        n, length = len(tree), self.length
        if self._on_cpu:  # numpy, then shared with torch: each torch op costs ~10 us in the decode loop
            input_ids = torch.from_numpy(tree.tokens).view(1, n)
            depths = torch.from_numpy(tree.depths)
            position_ids = torch.from_numpy(self.position_base.numpy() + (length + tree.depths))  # [1, N] or [R, 1, N]
        else:
            input_ids = torch.from_numpy(tree.tokens).to(self.device).view(1, n)
            depths = torch.from_numpy(tree.depths).to(self.device)
            position_ids = self.position_base + (length + depths)
        with torch.inference_mode():
            mask = self._tree_mask(tree, depths)
            forward = dict(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True)
            forward[self.cache_kwarg] = self.cache
            timing_kernels = False
            if n > 1 and self._on_cpu:
                with grouped_sdpa.grouped(), few_row_linear.fastest() as scope:
                    out = self.model(**forward)
                timing_kernels = scope.timing
            else:  # a plain step, or any forward on another device, runs the model's own kernels
                out = self.model(**forward)
            logits = out.logits[0]  # [N, V]
            greedy, topk = _candidates(logits, self.k)
        self._pending = n
        return Verification(greedy, topk, logits, timing_kernels)

    def _tree_mask(self, tree: DraftTree, depths: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor] | None:
        """Additive [1, 1, N, L + N] mask: a node sees the committed prefix and its ancestors
        (within its layers' window); one per attention kind, keyed by layer type if several."""
        n, length, device = len(tree), self.length, self.device
        if n == 1 and self._one_full_mask:
            return None  # a plain step sees the whole cache: the model's own mask, as in generate's decode steps
        if self._one_full_mask and self._on_cpu:
            # the common case on the CPU, built in one compiled pass (exact in any dtype: the blocked value
            # is the dtype's own minimum)
            blocked = float(torch.finfo(self.dtype).min)
            mask = torch.from_numpy(verify_kernels.additive_tree_mask(tree.parents, length, blocked))
            return mask if self.dtype == torch.float32 else mask.to(self.dtype)
        not_ancestor = torch.from_numpy(~tree.ancestor_mask()).to(device)
        if self._one_full_mask:  # the common case elsewhere
            mask = torch.zeros((1, 1, n, length + n), dtype=self.dtype, device=device)
            mask[0, 0, :, length:].masked_fill_(not_ancestor, torch.finfo(self.dtype).min)
            return mask
        blocked = torch.zeros((n, length + n), dtype=torch.bool, device=device)
        blocked[:, length:] = not_ancestor
        query = length + depths
        key = torch.cat([torch.arange(length, device=device), query])
        masks = {}
        for kind in self.support.kinds:
            outside = _kind_blocked(kind, query, key)
            kind_blocked = blocked if outside is None else blocked | outside
            mask = torch.zeros((1, 1, n, length + n), dtype=self.dtype, device=device)
            masks[kind.layer_type] = mask.masked_fill_(kind_blocked, torch.finfo(self.dtype).min)
        return masks if self.support.by_type else next(iter(masks.values()))

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
