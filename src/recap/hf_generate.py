"""``recap.speculative``: recap as a ``custom_generate`` decoding loop of transformers' ``generate``.

``model.generate(**inputs, custom_generate=recap.speculative, ...)`` lets generate do everything
it does before decoding (merge the model's generation_config with the call's arguments, validate
them, encode images, build the logits processors and stopping criteria, put the prompt to the
streamer), then calls this function instead of its own ``_sample`` loop. We decode with draft trees
and return what ``_sample`` returns: the sequences [1, L + new] (prompt included), or a
``GenerateDecoderOnlyOutput`` holding them when ``return_dict_in_generate=True``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .backends.hf import HFTarget
from .config import RecapConfig
from .decode import _eval_mode, run
from .errors import InputError, UnsupportedGenerationError
from .memory import TokenMemory
from .processors import TokenRules
from .stats import DecodeStats


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
    recap_stats: list[DecodeStats] | None = None,
    **model_kwargs: Any,
) -> torch.LongTensor | GenerateDecoderOnlyOutput:
    """Decode like ``generate`` would, with draft trees: pass as ``custom_generate=recap.speculative``.

    Greedy decoding and sampling (``do_sample=True``) with every logits processor and stopping
    criterion generate builds; the tokens equal generate's own (under the same ``torch.manual_seed``
    when sampling). Extra keyword arguments of ``model.generate``: ``recap_method`` (recap,
    token_recycling, pld, ar), ``recap_config`` (a ``RecapConfig``), ``recap_memory`` (a
    ``TokenMemory``), ``recap_stats`` (a list that receives the call's ``DecodeStats``).
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
        target = HFTarget(model)
        rules = TokenRules(logits_processor, stopping_criteria, generation_config.do_sample, input_ids)
        # (the cache and the other decoding state it holds are left out by the target's prefill)
        inputs = model.prepare_inputs_for_generation(input_ids, is_first_iteration=True, **model_kwargs)
        with _eval_mode(model):  # a model left in train() mode decodes without dropout, then gets its modes back
            result = run(
                target, rules, inputs, input_ids[0].tolist(), recap_method, recap_config, recap_memory, streamer
            )
    finally:
        if streamer is not None:
            streamer.end()
    if recap_stats is not None:
        recap_stats.append(result.stats)
    new = torch.tensor([result.token_ids], dtype=input_ids.dtype, device=input_ids.device)
    sequences = torch.cat([input_ids, new], dim=-1)
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


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
