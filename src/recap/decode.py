"""The decode loop: prefill, then propose -> verify -> accept -> commit -> observe."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from .accept import accept_greedy
from .backends.hf import HFTarget, check_supported, image_token_ids, output_vocab_size
from .config import RecapConfig
from .cost import StepCost
from .drafters import METHODS, PERSISTENT_METHODS, make_drafter, memory_k
from .errors import InputError, UnsupportedGenerationError
from .memory import TokenMemory
from .stats import DecodeStats

# generation_config settings that change greedy decoding, with the neutral value
_GREEDY_CHANGING = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_repetition_penalty": 1.0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "min_length": 0,
    "min_new_tokens": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
    "stop_strings": None,
    "guidance_scale": None,
    "watermarking_config": None,
}


@dataclass
class GenerationResult:
    """token_ids: the new tokens only (the prompt excluded); stats: what the call did."""

    token_ids: list[int]
    stats: DecodeStats


_default_memories: weakref.WeakKeyDictionary[torch.nn.Module, dict] = weakref.WeakKeyDictionary()
_memories_lock = threading.Lock()


def default_memory(model: torch.nn.Module, method: str, k: int) -> TokenMemory:
    """The persistent memory recap keeps for ``model`` and ``method`` when none is passed."""
    with _memories_lock:
        per_model = _default_memories.setdefault(model, {})
        key = (method, k)
        if key not in per_model:
            per_model[key] = TokenMemory(output_vocab_size(model), k=k, method=method)
        return per_model[key]


_step_costs: weakref.WeakKeyDictionary[torch.nn.Module, dict] = weakref.WeakKeyDictionary()


def step_cost(model: torch.nn.Module, max_nodes: int) -> StepCost:
    """The step-time model recap keeps for ``model`` (step times belong to a model and a machine)."""
    with _memories_lock:
        per_model = _step_costs.setdefault(model, {})
        if max_nodes not in per_model:
            per_model[max_nodes] = StepCost(max_nodes)
        return per_model[max_nodes]


def _eos_ids(model: torch.nn.Module, eos_token_id: int | list[int] | None) -> set[int]:
    value = eos_token_id if eos_token_id is not None else getattr(model.generation_config, "eos_token_id", None)
    if value is None:
        return set()
    return {int(v) for v in (value if isinstance(value, (list, tuple)) else [value])}


def _check_generation(model: torch.nn.Module, do_sample: bool, num_beams: int) -> None:
    if do_sample:
        raise UnsupportedGenerationError(
            "do_sample=True is not supported: recap reproduces greedy decoding exactly, so temperature, "
            "top_p and top_k have no effect. Call with do_sample=False (the default)."
        )
    if num_beams != 1:
        raise UnsupportedGenerationError(
            f"num_beams={num_beams} is not supported: recap decodes greedily (num_beams=1)."
        )
    config = getattr(model, "generation_config", None)
    for name, neutral in _GREEDY_CHANGING.items():
        value = getattr(config, name, neutral)
        if value not in (neutral, None) and not (neutral is None and value in ([], 0)):
            raise UnsupportedGenerationError(
                f"the model's generation_config sets {name}={value!r}, which changes greedy decoding and "
                f"which recap does not reproduce. Set model.generation_config.{name} = {neutral!r} "
                f"(and compare against generate(..., {name}={neutral!r}))."
            )


def _check_inputs(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    if not isinstance(inputs, Mapping) or "input_ids" not in inputs:
        raise InputError(
            "inputs must be the mapping a processor or tokenizer returns (with input_ids), return_tensors='pt'"
        )
    input_ids = inputs["input_ids"]
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
        raise InputError("input_ids must be a [1, L] tensor: call the processor with return_tensors='pt'")
    if input_ids.shape[0] != 1:
        raise InputError(
            f"batch size {input_ids.shape[0]} is not supported: recap decodes one request at a time; "
            "call recap.generate once per prompt."
        )
    if input_ids.shape[1] == 0:
        raise InputError("input_ids is empty: give the model a prompt")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise InputError(
            f"input_ids must hold integer token ids, got dtype {input_ids.dtype}: pass the tokenizer's output "
            "unchanged, or convert with input_ids.long()"
        )
    if input_ids.is_meta:
        raise InputError("input_ids is on the 'meta' device (it has no values): pass real token ids")
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    vocab = getattr(embeddings, "num_embeddings", None)
    if vocab is not None:
        bad = (input_ids < 0) | (input_ids >= vocab)
        if bool(bad.any()):
            where = int(bad[0].nonzero()[0, 0])
            raise InputError(
                f"input_ids[0, {where}] = {int(input_ids[0, where])} is outside the model's vocabulary "
                f"(0..{vocab - 1}): "
                "the inputs were made by another model's tokenizer, or the embeddings were not resized "
                "after adding tokens (model.resize_token_embeddings(len(tokenizer)))"
            )
    length = input_ids.shape[1]
    mask = inputs.get("attention_mask")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (1, length):
            shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise InputError(
                f"the attention_mask has shape {shape} but input_ids has (1, {length}): pass the mask the "
                "tokenizer returned with these input_ids, or none"
            )
        if not bool(torch.all(mask == 1)):
            raise InputError("the attention_mask has padding; pass the single prompt without padding")
    positions = inputs.get("position_ids")
    if positions is not None:
        if (
            not isinstance(positions, torch.Tensor)
            or positions.dtype.is_floating_point
            or positions.ndim not in (2, 3)
            or positions.shape[-1] != length
            or positions.shape[-2] != 1
        ):
            shape = tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__
            raise InputError(
                f"position_ids has shape {shape}; recap takes integer position_ids of shape (1, {length}) "
                f"(or (R, 1, {length}) for M-RoPE models), as generate does, or none"
            )
    return input_ids


_eval_lock = threading.Lock()
_eval_users: weakref.WeakKeyDictionary[torch.nn.Module, list] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Decode in eval mode (no dropout) and give every submodule its own train/eval flag
    back afterwards; concurrent calls on one model restore it once, when the last ends."""
    if not isinstance(model, torch.nn.Module):
        yield
        return
    with _eval_lock:
        users = _eval_users.get(model)
        if users is None:
            flags = [(module, module.training) for module in model.modules()]
            users = _eval_users[model] = [0, flags if any(flag for _, flag in flags) else None]
            if users[1] is not None:
                model.eval()
        users[0] += 1
    try:
        yield
    finally:
        with _eval_lock:
            users[0] -= 1
            if users[0] == 0:
                del _eval_users[model]
                for module, flag in users[1] or ():
                    module.training = flag


def _in_eval_mode(generate_fn):
    @functools.wraps(generate_fn)
    def wrapper(model, *args, **kwargs):
        with _eval_mode(model):
            return generate_fn(model, *args, **kwargs)

    return wrapper


@_in_eval_mode
def generate(
    model: torch.nn.Module,
    inputs: Mapping[str, torch.Tensor],
    method: str = "recap",
    max_new_tokens: int = 128,
    config: RecapConfig | None = None,
    memory: TokenMemory | None = None,
    *,
    do_sample: bool = False,
    num_beams: int = 1,
    eos_token_id: int | list[int] | None = None,
) -> GenerationResult:
    """Greedy decoding of ``model`` on ``inputs`` (batch 1), accelerated by ``method``.

    The new tokens equal those of ``model.generate(**inputs, do_sample=False,
    max_new_tokens=max_new_tokens)``. ``memory`` is the persistent table of recap or
    token_recycling; by default one per model and method is kept across calls.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    config = config or RecapConfig()
    check_supported(model)
    _check_generation(model, do_sample, num_beams)
    input_ids = _check_inputs(model, inputs)
    if method in PERSISTENT_METHODS:
        k = memory_k(method, config)
        if memory is None:
            memory = default_memory(model, method, k)
        else:
            _check_memory(memory, model, method, k)
    eos = _eos_ids(model, eos_token_id)
    blocked = image_token_ids(model)
    cost = step_cost(model, config.node_budget + 1) if method == "recap" and config.adaptive_budget else None
    drafter = make_drafter(method, config, memory, blocked, cost)
    target = HFTarget(model, memory.k if memory is not None else config.k)
    stats = DecodeStats(method=method)
    prompt_ids = input_ids[0].tolist()

    start = time.perf_counter()
    positions = drafter.prefill_positions(prompt_ids)
    first, prompt_topk = target.prefill(inputs, positions)
    drafter.begin(prompt_ids, positions, prompt_topk)
    stats.time_prefill = time.perf_counter() - start
    history = [*prompt_ids, first]
    new_tokens = [first]
    done = first in eos or max_new_tokens == 1
    try:
        while not done:
            t0 = time.perf_counter()
            tree = drafter.propose(history)
            t1 = time.perf_counter()
            greedy, topk = target.verify(tree)
            t2 = time.perf_counter()
            acceptance = accept_greedy(tree, greedy)
            committed = [*tree.tokens[acceptance.path[1:]].tolist(), acceptance.bonus]
            for i, token in enumerate(committed):
                if token in eos or len(new_tokens) + i + 1 >= max_new_tokens:
                    committed = committed[: i + 1]
                    done = True
                    break
            new_tokens.extend(committed)
            history.extend(committed)
            stats.record_step(tree, len(committed))
            drafts_committed = min(len(committed), acceptance.accepted_drafts)
            stats.count_sources(tree.sources[acceptance.path[1 : 1 + drafts_committed]].tolist())
            if not done:
                target.commit(acceptance.path)
            drafter.observe(tree, topk, acceptance, committed)
            t3 = time.perf_counter()
            stats.time_draft += t1 - t0
            stats.time_verify += t2 - t1
            stats.time_update += t3 - t2
            if cost is not None:
                cost.record(len(tree), t3 - t0)
    finally:
        drafter.end()
        target.close()
    stats.new_tokens = len(new_tokens)
    stats.time_total = time.perf_counter() - start
    return GenerationResult(token_ids=new_tokens, stats=stats)


def _check_memory(memory: TokenMemory, model: torch.nn.Module, method: str, k: int) -> None:
    if not isinstance(memory, TokenMemory):
        raise TypeError(f"memory must be a recap.TokenMemory, got {type(memory).__name__}")
    if memory.method != method:
        raise ValueError(f"this memory was made for method {memory.method!r}, not {method!r}; pass it to that method")
    vocab = output_vocab_size(model)
    if memory.vocab_size != vocab:
        raise ValueError(f"this memory covers a vocabulary of {memory.vocab_size} tokens but the model has {vocab}")
    if memory.k < k:
        raise ValueError(f"this memory keeps k={memory.k} candidates; the config asks for k={k}")
