"""The decode loop: prefill, then propose -> verify -> accept -> commit -> observe, and
``recap.generate``, the direct API (which lets ``model.generate`` prepare the request and then runs
this loop through ``recap.speculative``, the ``custom_generate`` entry)."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from transformers import StoppingCriteriaList, StopStringCriteria

from . import kernels
from .accept import accept_greedy
from .backends import Target
from .backends.hf import check_supported, output_vocab_size
from .config import RecapConfig
from .cost import StepCost
from .drafters import METHODS, PERSISTENT_METHODS, make_drafter, memory_k
from .errors import InputError, UnsupportedGenerationError
from .memory import TokenMemory
from .processors import TokenRules
from .sampling import walk
from .stats import DecodeStats


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
    max_new_tokens: int | None = None,
    config: RecapConfig | None = None,
    memory: TokenMemory | None = None,
    **generate_kwargs: Any,
) -> GenerationResult:
    """Decode ``model`` on ``inputs`` (batch 1), accelerated by ``method``, exactly as
    ``model.generate(**inputs, max_new_tokens=max_new_tokens, **generate_kwargs)`` would.

    ``max_new_tokens``: 128 when neither it, ``max_length`` nor ``generation_config`` is given;
    otherwise the length follows generate's own rule.

    ``generate_kwargs`` are generate's own: greedy or sampling (``do_sample``, ``temperature``,
    ``top_k``, ``top_p``, ``min_p``, ``typical_p``, ``epsilon_cutoff``, ``eta_cutoff``), the
    processors (``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``,
    ``suppress_tokens``, ``bad_words_ids``, ``sequence_bias``, ...), stopping (``eos_token_id``,
    ``max_length``, ``stop_strings`` with ``tokenizer=``, ``max_time``, ``stopping_criteria``),
    ``logits_processor``, ``streamer`` and ``generation_config``; the model's generation_config
    supplies the defaults, as in generate. The new tokens equal generate's (under the same
    ``torch.manual_seed`` when sampling). ``memory`` is the persistent table of recap or
    token_recycling; by default one per model and method is kept across calls.
    """
    from .hf_generate import speculative  # it runs this module's loop

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    if max_new_tokens is None and not {"max_length", "generation_config"} & generate_kwargs.keys():
        max_new_tokens = 128
    if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be a positive integer or None, got {max_new_tokens!r}")
    check_supported(model)
    input_ids = _check_inputs(model, inputs)
    _stop_strings_as_criteria(generate_kwargs)
    stats: list[DecodeStats] = []
    entry = functools.partial(
        speculative,
        streamer=generate_kwargs.get("streamer"),
        recap_method=method,
        recap_config=config,
        recap_memory=memory,
        recap_stats=stats,
    )
    if max_new_tokens is not None:
        generate_kwargs["max_new_tokens"] = max_new_tokens
    output = model.generate(**inputs, custom_generate=entry, **generate_kwargs)
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    return GenerationResult(token_ids=sequences[0, input_ids.shape[1] :].tolist(), stats=stats[0])


def _stop_strings_as_criteria(kwargs: dict[str, Any]) -> None:
    """Turn ``stop_strings`` into a ``StopStringCriteria`` passed in ``stopping_criteria``.

    transformers 5.24 does not hand the ``tokenizer`` to a ``custom_generate`` callable, so its
    own stop-string criteria cannot be built on that path; this is the criterion it would build."""
    stop_strings = kwargs.pop("stop_strings", None)
    if stop_strings is None:
        return
    tokenizer = kwargs.get("tokenizer")
    if tokenizer is None:
        raise UnsupportedGenerationError(
            "stop_strings needs the model's tokenizer, as in generate: pass tokenizer=processor.tokenizer "
            "(or the tokenizer itself)."
        )
    criteria = StoppingCriteriaList(kwargs.get("stopping_criteria") or [])
    criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    kwargs["stopping_criteria"] = criteria


def run(
    target: Target,
    rules: TokenRules,
    inputs: Mapping[str, Any],
    prompt_ids: list[int],
    method: str = "recap",
    config: RecapConfig | None = None,
    memory: TokenMemory | None = None,
    streamer: Any = None,
) -> GenerationResult:
    """The decode loop of one request: prefill ``inputs`` (the model's forward inputs for the
    prompt ``prompt_ids``), then propose -> verify -> accept -> commit -> observe until ``rules``
    stop it. Plain greedy decoding (``rules.fast``) accepts by the compiled argmax comparison;
    processors or sampling pick each token along the tree with ``sampling.walk``. The drafters
    learn from the raw top-k of every verified node either way. ``streamer`` gets each step's
    committed tokens (the caller puts the prompt and calls ``end``, as generate does)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    config = config or RecapConfig()
    if method in PERSISTENT_METHODS:
        k = memory_k(method, config)
        if memory is None:
            memory = default_memory(target.model, method, k)
        else:
            _check_memory(memory, target.vocab_size, method, k)
    kernels.ensure_ready()  # compile or load every kernel now, never in the middle of a request
    adaptive = method == "recap" and config.adaptive_budget
    cost = step_cost(target.model, config.node_budget + 1) if adaptive else None
    drafter = make_drafter(method, config, memory, target.placeholder_ids, cost)
    target.k = memory.k if memory is not None else config.k
    stats = DecodeStats(method=method)

    start = time.perf_counter()
    positions = drafter.prefill_positions(prompt_ids)
    first, prompt_topk = target.prefill(inputs, positions)
    drafter.begin(prompt_ids, positions, prompt_topk)
    if not rules.fast:
        with torch.inference_mode():
            first = rules.choose(target.logits)
    stats.time_prefill = time.perf_counter() - start
    done = rules.push(first)
    history = [*prompt_ids, first]
    new_tokens = [first]
    if streamer is not None:
        streamer.put(torch.tensor([first]))
    try:
        while not done:
            t0 = time.perf_counter()
            tree = drafter.propose(history)
            t1 = time.perf_counter()
            greedy, topk = target.verify(tree)
            t2 = time.perf_counter()
            if rules.fast:
                acceptance = accept_greedy(tree, greedy)
                committed = [*tree.tokens[acceptance.path[1:]].tolist(), acceptance.bonus]
                committed, done = rules.cut(committed)
            else:
                with torch.inference_mode():
                    acceptance, done = walk(tree, functools.partial(rules.choose_row, target.logits), rules.push)
                committed = [*tree.tokens[acceptance.path[1:]].tolist(), acceptance.bonus]
            new_tokens.extend(committed)
            history.extend(committed)
            if streamer is not None:
                streamer.put(torch.tensor(committed))
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


def _check_memory(memory: TokenMemory, vocab: int, method: str, k: int) -> None:
    if not isinstance(memory, TokenMemory):
        raise TypeError(f"memory must be a recap.TokenMemory, got {type(memory).__name__}")
    if memory.method != method:
        raise ValueError(f"this memory was made for method {memory.method!r}, not {method!r}; pass it to that method")
    if memory.vocab_size != vocab:
        raise ValueError(f"this memory covers a vocabulary of {memory.vocab_size} tokens but the model has {vocab}")
    if memory.k < k:
        raise ValueError(f"this memory keeps k={memory.k} candidates; the config asks for k={k}")
