"""The decode loop: prefill, then propose -> verify -> accept -> commit -> observe."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping
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


def _check_inputs(inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
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
    mask = inputs.get("attention_mask")
    if mask is not None and not bool(torch.all(mask == 1)):
        raise InputError("the attention_mask has padding; pass the single prompt without padding")
    return input_ids


def _check_length(model: torch.nn.Module, total: int) -> None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and total > window:
        raise UnsupportedGenerationError(
            f"prompt + max_new_tokens = {total} exceeds the sliding window ({window}); recap's tree mask does "
            "not implement sliding-window attention. Shorten the request."
        )


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
    input_ids = _check_inputs(inputs)
    _check_length(model, input_ids.shape[1] + max_new_tokens)
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
