"""The entries of the Hugging Face path: ``recap.generate`` (the direct API) and
``recap.speculative`` (a ``custom_generate`` decoding loop for ``model.generate``).

``recap.generate(model, inputs, ...)`` checks its inputs, then calls
``model.generate(**inputs, custom_generate=speculative, ...)``: generate does everything it
does before decoding (merge the model's generation_config with the call's arguments, validate
them, encode images, build the logits processors and stopping criteria, put the prompt to the
streamer), then calls ``speculative`` instead of its own ``_sample`` loop. ``speculative``
checks the request, builds the request's pieces (the target with its k, the drafter with its
memory and step-cost model, the token rules) and runs ``recap.loop.run``; it returns what
``_sample`` returns: the sequences [1, L + new] (prompt included), or a
``GenerateDecoderOnlyOutput`` holding them when ``return_dict_in_generate=True``.

Each check runs once, here: the inputs (direct entry, before generate's preparation), the
generation settings and the request (both entries, in ``speculative``), the model's support (the
target; the direct entry asks first, for a clear error before generate runs), eval mode (around
the decoding, in ``speculative``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList, StopStringCriteria
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .backends.capabilities import TreeSupport
from .backends.hf import HFTarget, check_supported, output_vocab_size
from .config import RecapConfig
from .core.memory import TokenMemory
from .core.rules import TokenRules
from .core.stats import DecodeStats
from .core.step_cost import StepCost
from .drafters import METHODS, PERSISTENT_METHODS, make_drafter, memory_k
from .errors import InputError, UnsupportedGenerationError
from .loop import GenerationResult, run

__all__ = ["GenerationResult", "RecapGenerateOutput", "default_memory", "generate", "speculative", "step_cost"]


@dataclass
class RecapGenerateOutput(GenerateDecoderOnlyOutput):
    """What ``speculative`` returns with ``recap_return_stats=True``: generate's output
    (``sequences`` [1, L + new]) and the call's ``DecodeStats``."""

    stats: DecodeStats | None = None


# -- per-model state that outlives a request ----------------------------------------------------
_default_memories: weakref.WeakKeyDictionary[torch.nn.Module, dict] = weakref.WeakKeyDictionary()
_step_costs: weakref.WeakKeyDictionary[torch.nn.Module, dict] = weakref.WeakKeyDictionary()
_state_lock = threading.Lock()


def default_memory(model: torch.nn.Module, method: str, k: int) -> TokenMemory:
    """The persistent memory recap keeps for ``model`` and ``method`` when none is passed."""
    with _state_lock:
        per_model = _default_memories.setdefault(model, {})
        key = (method, k)
        if key not in per_model:
            per_model[key] = TokenMemory(output_vocab_size(model), k=k, method=method)
        return per_model[key]


def step_cost(model: torch.nn.Module, max_nodes: int) -> StepCost:
    """The step-time model recap keeps for ``model`` (step times belong to a model and a machine)."""
    with _state_lock:
        per_model = _step_costs.setdefault(model, {})
        if max_nodes not in per_model:
            per_model[max_nodes] = StepCost(max_nodes)
        return per_model[max_nodes]


# -- the direct API -------------------------------------------------------------------------------
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
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    if max_new_tokens is None and not {"max_length", "generation_config"} & generate_kwargs.keys():
        max_new_tokens = 128
    if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be a positive integer or None, got {max_new_tokens!r}")
    support = check_supported(model)  # before generate's preparation: a clear error first (e.g. a meta-device model)
    input_ids = _check_inputs(model, inputs)
    _stop_strings_as_criteria(generate_kwargs)
    entry = functools.partial(
        speculative,
        streamer=generate_kwargs.get("streamer"),
        recap_method=method,
        recap_config=config,
        recap_memory=memory,
        recap_return_stats=True,
        recap_support=support,
    )
    # generate reads the callable's parameter names; inspecting a partial anew costs ~0.3 ms a call
    entry.__signature__ = _entry_signature(tuple(entry.keywords))
    if max_new_tokens is not None:
        generate_kwargs["max_new_tokens"] = max_new_tokens
    output = model.generate(**inputs, custom_generate=entry, **generate_kwargs)
    return GenerationResult(token_ids=output.sequences[0, input_ids.shape[1] :].tolist(), stats=output.stats)


@functools.cache
def _entry_signature(keywords: tuple[str, ...]) -> inspect.Signature:
    """The signature of ``speculative`` with ``keywords`` bound (it depends on their names, not their values)."""
    return inspect.signature(functools.partial(speculative, **dict.fromkeys(keywords)))


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


# -- the custom_generate entry ----------------------------------------------------------------
def speculative(
    model: torch.nn.Module,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer: Any = None,
    recap_method: str = "recap",
    recap_config: RecapConfig | None = None,
    recap_memory: TokenMemory | None = None,
    recap_return_stats: bool = False,
    recap_support: TreeSupport | None = None,
    **model_kwargs: Any,
) -> torch.LongTensor | GenerateDecoderOnlyOutput:
    """Decode like ``generate`` would, with draft trees: pass as ``custom_generate=recap.speculative``.

    Greedy decoding and sampling (``do_sample=True``) with every logits processor and stopping
    criterion generate builds; the tokens equal generate's own (under the same ``torch.manual_seed``
    when sampling). Extra keyword arguments of ``model.generate``: ``recap_method`` (recap,
    token_recycling, pld, ar), ``recap_config`` (a ``RecapConfig``), ``recap_memory`` (a
    ``TokenMemory``), ``recap_return_stats`` (return a ``RecapGenerateOutput``: the sequences and
    the call's ``DecodeStats``); ``recap.generate`` also hands over ``recap_support``, the support
    check it ran already.
    Refused with a message: batches, beams, assisted / prompt-lookup generation, contrastive
    search, DoLa, constraints, classifier-free guidance, per-step outputs (scores, attentions...).
    """
    caller = _generate_locals()
    if streamer is None:
        # transformers 5.24 does not hand the streamer to a custom_generate callable (it has
        # already put the prompt to it); take it from generate's frame so it gets the tokens too
        streamer = caller.get("streamer")
    try:
        if synced_gpus:
            raise UnsupportedGenerationError("synced_gpus is not supported: recap decodes on one device.")
        check_generation(generation_config, caller.get("assistant_model"))
        _check_request(input_ids, model_kwargs)
        if recap_method not in METHODS:
            raise ValueError(f"unknown method {recap_method!r}: choose one of {', '.join(METHODS)}")
        config = recap_config or RecapConfig()
        memory = _request_memory(model, recap_method, config, recap_memory)
        target = HFTarget(model, k=memory.k if memory is not None else config.k, support=recap_support)
        adaptive = recap_method == "recap" and config.adaptive_budget
        cost = step_cost(model, config.node_budget + 1) if adaptive else None
        drafter = make_drafter(recap_method, config, memory, target.placeholder_ids, cost)
        rules = TokenRules(logits_processor, stopping_criteria, generation_config.do_sample, input_ids)
        # (the cache and the other decoding state it holds are left out by the target's prefill)
        inputs = model.prepare_inputs_for_generation(input_ids, is_first_iteration=True, **model_kwargs)
        with eval_mode(model):  # a model left in train() mode decodes without dropout, then gets its modes back
            result = run(
                target, drafter, rules, inputs, input_ids[0].tolist(), streamer=streamer, cost=cost,
                choose_threads=config.adaptive_threads and input_ids.device.type == "cpu",
            )  # fmt: skip
    finally:
        if streamer is not None:
            streamer.end()
    new = torch.tensor([result.token_ids], dtype=input_ids.dtype, device=input_ids.device)
    sequences = torch.cat([input_ids, new], dim=-1)
    if recap_return_stats:
        return RecapGenerateOutput(sequences=sequences, stats=result.stats)
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


def _request_memory(
    model: torch.nn.Module, method: str, config: RecapConfig, memory: TokenMemory | None
) -> TokenMemory | None:
    """The persistent memory of a request: the one passed (checked against the model), else the
    one recap keeps for the model and method; None for a method without one."""
    if method not in PERSISTENT_METHODS:
        return None
    k = memory_k(method, config)
    if memory is None:
        return default_memory(model, method, k)
    _check_memory(memory, output_vocab_size(model), method, k)
    return memory


def _generate_locals() -> dict[str, Any]:
    """The local variables of the ``generate`` call that called ``speculative`` (empty if none)."""
    try:
        frame = sys._getframe(2)
    except ValueError:  # called from the top of a stack
        return {}
    if frame.f_code.co_name == "generate" and "custom_generate" in frame.f_locals:
        return frame.f_locals
    return {}


_MODES = {
    GenerationMode.BEAM_SEARCH: "beam search (num_beams > 1)",
    GenerationMode.BEAM_SAMPLE: "beam sampling (num_beams > 1)",
    GenerationMode.GROUP_BEAM_SEARCH: "group beam search",
    GenerationMode.CONSTRAINED_BEAM_SEARCH: "constrained beam search (constraints, force_words_ids)",
    GenerationMode.CONTRASTIVE_SEARCH: "contrastive search (penalty_alpha)",
    GenerationMode.DOLA_GENERATION: "DoLa decoding (dola_layers)",
    GenerationMode.ASSISTED_GENERATION: "assisted generation (assistant_model, prompt_lookup_num_tokens)",
}


def check_generation(config: GenerationConfig, assistant_model: Any = None) -> None:
    """Raise ``UnsupportedGenerationError`` for settings recap does not reproduce exactly."""
    mode = config.get_generation_mode(assistant_model)
    if mode == GenerationMode.ASSISTED_GENERATION:
        raise UnsupportedGenerationError(
            "assisted generation (assistant_model, prompt_lookup_num_tokens, assistant_early_exit) is not "
            "supported: recap is itself the speculative decoder; drop those arguments."
        )
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        what = _MODES.get(mode, str(mode))
        raise UnsupportedGenerationError(
            f"{what} is not supported (num_beams={config.num_beams}): recap reproduces greedy decoding and "
            "sampling (num_beams=1, no constraints, no penalty_alpha, no dola_layers)."
        )
    if config.guidance_scale is not None and config.guidance_scale != 1:
        raise UnsupportedGenerationError(
            f"guidance_scale={config.guidance_scale} (classifier-free guidance) is not supported: it runs a second, "
            "unconditional model per token. Drop guidance_scale."
        )
    if config.num_return_sequences not in (None, 1):
        raise InputError(
            f"num_return_sequences={config.num_return_sequences} is not supported: recap decodes one sequence "
            "per call; call it once per sequence (with different seeds when sampling)."
        )
    wanted = [
        name
        for name in ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
        if getattr(config, name, False)
    ]
    if wanted and config.return_dict_in_generate:
        raise UnsupportedGenerationError(
            f"{', '.join(wanted)} is not supported: recap returns the sequences only (a tree forward has no "
            "per-token scores, attentions or hidden states of plain decoding). Drop them."
        )
    if config.prefill_chunk_size is not None:
        raise UnsupportedGenerationError("prefill_chunk_size is not supported: recap prefills the prompt at once.")
    if config.cache_implementation not in (None, "dynamic"):
        raise UnsupportedGenerationError(
            f"cache_implementation={config.cache_implementation!r} is not supported: recap keeps its own dynamic "
            "cache of the accepted tree paths. Drop cache_implementation."
        )


def _check_request(input_ids: torch.Tensor, model_kwargs: dict[str, Any]) -> None:
    if input_ids.shape[0] != 1:
        raise InputError(
            f"batch size {input_ids.shape[0]} is not supported: recap decodes one request at a time; "
            "call generate once per prompt."
        )
    if model_kwargs.get("inputs_embeds") is not None:
        raise InputError("inputs_embeds is not supported: pass input_ids (recap drafts and verifies token ids).")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(torch.all(mask == 1)):
        raise InputError("the attention_mask has padding; pass the single prompt without padding")
    cache = model_kwargs.get("cache")
    if cache is not None and cache.get_seq_length() > 0:
        raise UnsupportedGenerationError(
            "continuing from a filled cache is not supported: pass the whole prompt without cache."
        )


# -- checks ---------------------------------------------------------------------------------------
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
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Decode in eval mode (no dropout) and give every submodule its own train/eval flag
    back afterwards; concurrent calls on one model restore it once, when the last ends."""
    if not isinstance(model, torch.nn.Module):
        yield
        return
    with _eval_lock:
        users = _eval_users.get(model)
        if users is None:
            flags = [(module, module.training) for module in model.modules()] if _any_training(model) else None
            users = _eval_users[model] = [0, flags]
            if flags is not None:
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


def _any_training(model: torch.nn.Module) -> bool:
    """Whether any submodule is in train mode (a plain walk: ``modules()`` costs ~4x as much)."""
    stack = [model]
    while stack:
        module = stack.pop()
        if module.training:
            return True
        stack.extend(child for child in module._modules.values() if child is not None)
    return False


def _check_memory(memory: TokenMemory, vocab: int, method: str, k: int) -> None:
    if not isinstance(memory, TokenMemory):
        raise TypeError(f"memory must be a recap.TokenMemory, got {type(memory).__name__}")
    if memory.method != method:
        raise ValueError(f"this memory was made for method {memory.method!r}, not {method!r}; pass it to that method")
    if memory.vocab_size != vocab:
        raise ValueError(f"this memory covers a vocabulary of {memory.vocab_size} tokens but the model has {vocab}")
    if memory.k < k:
        raise ValueError(f"this memory keeps k={memory.k} candidates; the config asks for k={k}")
