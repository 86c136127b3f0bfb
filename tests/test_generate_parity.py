"""recap reproduces model.generate with its logits processors, stopping criteria and seeded sampling,
through both entries (``recap.generate`` and ``model.generate(custom_generate=recap.speculative)``),
on tiny float32 models of every supported architecture."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_lossless import make_inputs
from tiny_models import BUILDERS, build
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TextIteratorStreamer,
)
from transformers.generation.streamers import BaseStreamer

import recap
import recap.loop
from recap import RecapConfig
from recap.bench import suite_requests
from recap.loading import build_inputs

N = 40
FIXED = RecapConfig(adaptive_budget=False)  # trees of a fixed size: acceptance that does not depend on timings
GREEDY_SETTINGS = [
    {},  # the model's own generation_config
    dict(repetition_penalty=1.3),
    dict(no_repeat_ngram_size=2),
    dict(suppress_tokens=[]),  # filled per model: its three most frequent greedy tokens
    dict(min_new_tokens=12),  # with the first greedy token as EOS, so the processor decides
]
SAMPLING_SETTINGS = [
    (dict(temperature=0.3), (0, 1)),
    (dict(temperature=0.9, top_k=8), (2, 3)),
    (dict(top_p=0.8), (4, 5)),
    (dict(min_p=0.1, temperature=1.2), (6, 7)),
    (dict(typical_p=0.9, repetition_penalty=1.2, temperature=0.6), (8,)),
    (dict(epsilon_cutoff=3e-3, no_repeat_ngram_size=3, temperature=0.5), (9,)),
]


def hf_tokens(model, inputs, seed: int | None = None, **kwargs) -> list[int]:
    if seed is not None:
        torch.manual_seed(seed)
    out = model.generate(**inputs, max_new_tokens=kwargs.pop("max_new_tokens", N), **kwargs)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def both_entries(model, inputs, seed: int | None = None, method: str = "recap", **kwargs):
    """(recap.generate's tokens and stats, custom_generate's tokens), each seeded alike."""
    if seed is not None:
        torch.manual_seed(seed)
    kwargs.setdefault("max_new_tokens", N)
    direct = recap.generate(model, inputs, method, config=FIXED, **kwargs)
    extra = dict(custom_generate=recap.speculative, recap_method=method, recap_config=FIXED)
    via_hf = hf_tokens(model, inputs, seed, **extra, **kwargs)
    return direct.token_ids, direct.stats, via_hf


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_greedy_with_processors_matches_generate(arch: str) -> None:
    model, processor = build(arch)
    inputs = make_inputs(arch, processor, np.random.default_rng(sum(map(ord, arch)) + 1))
    free = hf_tokens(model, inputs, do_sample=False)
    multi_token_steps = 0
    for settings in GREEDY_SETTINGS:
        kwargs = dict(settings, do_sample=False)
        if "suppress_tokens" in kwargs:
            kwargs["suppress_tokens"] = sorted(set(free), key=lambda t: (-free.count(t), t))[:3]
        if "min_new_tokens" in kwargs:
            kwargs.update(eos_token_id=free[0], pad_token_id=free[0])
        expected = hf_tokens(model, inputs, **kwargs)
        direct, stats, via_hf = both_entries(model, inputs, **kwargs)
        assert direct == expected, f"{arch} {kwargs}: recap.generate differs from generate"
        assert via_hf == expected, f"{arch} {kwargs}: custom_generate differs from generate"
        multi_token_steps += sum(n > 1 for n in stats.accepted_lengths)
    assert multi_token_steps > 0, "no step accepted a draft: the processed walk was never exercised"


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_sampling_matches_generate_under_the_same_seed(arch: str) -> None:
    model, processor = build(arch)
    rng = np.random.default_rng(sum(map(ord, arch)) + 2)
    multi_token_steps = 0
    for settings, seeds in SAMPLING_SETTINGS:
        inputs = make_inputs(arch, processor, rng)
        for seed in seeds:
            kwargs = dict(settings, do_sample=True)
            expected = hf_tokens(model, inputs, seed, **kwargs)
            direct, stats, via_hf = both_entries(model, inputs, seed, **kwargs)
            assert direct == expected, f"{arch} {kwargs} seed {seed}: recap.generate differs from generate"
            assert via_hf == expected, f"{arch} {kwargs} seed {seed}: custom_generate differs from generate"
            multi_token_steps += sum(n > 1 for n in stats.accepted_lengths)
    assert multi_token_steps > 0, "no sampled step accepted a draft: the walk never descended"


class KeepBelow(LogitsProcessor):
    """A user's processor: forbids the ids at or above a bound that grows with the sequence."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores[:, 40 + 3 * input_ids.shape[-1] :] = -float("inf")
        return scores


@pytest.mark.parametrize("arch", ["llama", "qwen2_5_vl"])
def test_more_processors_and_your_own_match_generate(arch: str) -> None:
    model, processor = build(arch)
    rng = np.random.default_rng(8)
    free: list[int] = []
    while len(free) < 8:  # a prompt whose greedy answer is not cut short by the model's EOS
        inputs = make_inputs(arch, processor, rng)
        free = hf_tokens(model, inputs, do_sample=False)
    first, second = free[0], free[1]
    cases = [
        dict(bad_words_ids=[[first], [free[2], free[3]]]),
        dict(sequence_bias={(second,): -4.0, (free[4], free[5]): 3.0}),
        dict(begin_suppress_tokens=[first], forced_eos_token_id=second, renormalize_logits=True),
        dict(exponential_decay_length_penalty=(5, 1.5), eos_token_id=free[6], remove_invalid_values=True),
        dict(logits_processor=LogitsProcessorList([KeepBelow()])),
        dict(prefix_allowed_tokens_fn=lambda batch_id, ids: list(range(int(ids[-1]) % 7, 200, 3))),
    ]
    changed = 0
    for i, case in enumerate(cases):
        for sampling in (dict(do_sample=False), dict(do_sample=True, temperature=0.5, eta_cutoff=1e-3)):
            kwargs = dict(case, **sampling)
            expected = hf_tokens(model, inputs, i, **kwargs)
            direct, _, via_hf = both_entries(model, inputs, i, **kwargs)
            assert direct == expected and via_hf == expected, f"{arch} {kwargs}"
            changed += not sampling["do_sample"] and expected != free
    assert changed >= 4, "most processors should change the greedy answer, else the test is blind to them"


@pytest.mark.parametrize("method", ["ar", "pld", "token_recycling"])
def test_every_method_samples_like_generate(method: str) -> None:
    model, processor = build("qwen2_5_vl")
    rng = np.random.default_rng(3)
    for seed in (0, 1):
        inputs = make_inputs("qwen2_5_vl", processor, rng)
        kwargs = dict(do_sample=True, temperature=0.4, top_k=20, repetition_penalty=1.1)
        expected = hf_tokens(model, inputs, seed, max_new_tokens=60, **kwargs)
        direct, _, via_hf = both_entries(model, inputs, seed, method, max_new_tokens=60, **kwargs)
        assert direct == expected and via_hf == expected, f"{method} seed {seed}"


def test_qwen_published_generation_config_is_reproduced() -> None:
    """Qwen2.5-VL instruct ships repetition_penalty 1.05 with top_k 1, top_p 0.001, temperature 0.1."""
    model, processor = build("qwen2_5_vl")
    config = model.generation_config
    saved = config.to_dict()
    config.update(do_sample=True, repetition_penalty=1.05, top_k=1, top_p=0.001, temperature=0.1)
    try:
        inputs = make_inputs("qwen2_5_vl", processor, np.random.default_rng(4))
        expected = hf_tokens(model, inputs, 0)  # no arguments: the model's defaults
        direct, stats, via_hf = both_entries(model, inputs, 0)
        assert direct == expected and via_hf == expected
        assert stats.mean_accepted_length > 1
    finally:
        config.update(**{k: saved.get(k) for k in ("do_sample", "repetition_penalty", "top_k", "top_p", "temperature")})


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "llama"])
def test_sampled_stops_inside_an_accepted_path(arch: str) -> None:
    """EOS lists and max_length end a sampled request where generate ends it."""
    model, processor = build(arch)
    rng = np.random.default_rng(5)
    inside = checked = 0
    for seed in range(6):
        inputs = make_inputs(arch, processor, rng)
        kwargs = dict(do_sample=True, temperature=0.1, max_new_tokens=60)
        free = hf_tokens(model, inputs, seed, **kwargs)
        if len(free) < 20:  # the model's own EOS came early
            continue
        checked += 1
        recap.generate(model, inputs, max_new_tokens=60, do_sample=False, config=FIXED)  # warms the memory
        eos = [t for i, t in enumerate(free) if i >= 5 and t not in free[:i]][:2]
        length = inputs["input_ids"].shape[1] + 17
        for stop in (dict(eos_token_id=eos, pad_token_id=eos[0]), dict(max_length=length, max_new_tokens=None)):
            expected = hf_tokens(model, inputs, seed, **kwargs | stop)
            assert len(expected) < 20
            direct, stats, via_hf = both_entries(model, inputs, seed, **kwargs | stop)
            assert direct == expected and via_hf == expected, f"{arch} seed {seed} {stop}"
            inside += stats.accepted_lengths[-1] > 1
    assert checked >= 3
    assert inside > 0, "no request stopped inside a multi-token step; the test lost its power"


@pytest.mark.parametrize("do_sample", [False, True])
def test_stop_strings_end_where_generate_ends(do_sample: bool) -> None:
    """Stop strings (which need a real tokenizer: the embedded model's BPE) inside accepted paths."""
    model, processor = recap.zoo.load("tiny-qwen2.5-vl")
    tokenizer = processor.tokenizer
    kwargs = dict(do_sample=do_sample, temperature=0.5, max_new_tokens=100, tokenizer=tokenizer)
    stops = 0
    for i, request in enumerate(suite_requests("describe,science,textvqa", 2, 0)):
        inputs = build_inputs(processor, request.prompt, request.image)
        free = tokenizer.decode(hf_tokens(model, inputs, i, **kwargs))
        words = [w for w in free.split() if len(w) >= 4]
        word = words[len(words) * 2 // 3]  # a word well into the answer
        expected = hf_tokens(model, inputs, i, stop_strings=[word], **kwargs)
        assert tokenizer.decode(expected).endswith(word)
        torch.manual_seed(i)
        result = recap.generate(model, inputs, stop_strings=[word], config=FIXED, **kwargs)
        assert result.token_ids == expected, f"request {i}: stop string {word!r}"
        stops += result.stats.accepted_lengths[-1] > 1
    assert stops > 0, "no stop string was reached inside a multi-token step"


def test_plain_greedy_keeps_the_compiled_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no processor and no sampling (the embedded models' and the tiny models' defaults) the loop
    accepts by the compiled argmax comparison and never walks the tree token by token."""

    def no_walk(*args, **kwargs):
        raise AssertionError("the per-token walk ran on plain greedy decoding")

    monkeypatch.setattr(recap.loop, "walk", no_walk)
    model, processor = recap.zoo.load("tiny-llava-next")
    request = suite_requests("describe", 1, 0)[0]
    inputs = build_inputs(processor, request.prompt, request.image)
    assert recap.generate(model, inputs, max_new_tokens=40).token_ids == hf_tokens(model, inputs, max_new_tokens=40)
    model, tokenizer = build("mistral")
    inputs = tokenizer("the w1 w2 of a", return_tensors="pt")
    assert recap.generate(model, inputs, max_new_tokens=40).token_ids == hf_tokens(model, inputs, max_new_tokens=40)
    with pytest.raises(AssertionError, match="per-token walk"):
        recap.generate(model, inputs, max_new_tokens=40, repetition_penalty=1.1)


class Recorder(BaseStreamer):
    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = 0

    def put(self, value: torch.Tensor) -> None:
        assert value.ndim <= 2 and (value.ndim < 2 or value.shape[0] == 1)
        self.puts.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.ended += 1


@pytest.mark.parametrize("do_sample", [False, True])
def test_streamer_receives_the_prompt_then_exactly_the_returned_tokens(do_sample: bool) -> None:
    model, processor = build("llava_next")
    inputs = make_inputs("llava_next", processor, np.random.default_rng(6))
    prompt = inputs["input_ids"][0].tolist()
    kwargs = dict(do_sample=do_sample, temperature=0.3, max_new_tokens=50)
    reference = Recorder()
    expected = hf_tokens(model, inputs, 0, streamer=reference, **kwargs)
    assert reference.puts[0] == prompt and sum(reference.puts[1:], []) == expected
    streamer = Recorder()
    torch.manual_seed(0)
    result = recap.generate(model, inputs, streamer=streamer, config=FIXED, **kwargs)
    assert result.token_ids == expected
    assert streamer.puts[0] == prompt and sum(streamer.puts[1:], []) == expected and streamer.ended == 1
    assert max(len(p) for p in streamer.puts[1:]) > 1, "several tokens per step should arrive together"
    streamer = Recorder()
    assert hf_tokens(model, inputs, 0, streamer=streamer, custom_generate=recap.speculative, **kwargs) == expected
    assert streamer.puts[0] == prompt and sum(streamer.puts[1:], []) == expected and streamer.ended == 1


def test_text_iterator_streamer_yields_the_returned_text() -> None:
    model, tokenizer = build("llama")
    inputs = tokenizer("the red w1 is of the blue w2", return_tensors="pt")
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    result = recap.generate(model, inputs, max_new_tokens=30, streamer=streamer)
    assert "".join(streamer).strip() == tokenizer.decode(result.token_ids, skip_special_tokens=True).strip()


def test_max_time_and_your_stopping_criteria_are_honoured() -> None:
    model, tokenizer = build("qwen2")
    inputs = tokenizer("the w5 w6 a w7", return_tensors="pt")
    assert len(hf_tokens(model, inputs, max_time=1e-9)) == 1
    assert len(recap.generate(model, inputs, max_time=1e-9).token_ids) == 1

    class AfterSeven(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor([input_ids.shape[-1] - inputs["input_ids"].shape[-1] >= 7])

    criteria = StoppingCriteriaList([AfterSeven()])
    expected = hf_tokens(model, inputs, 0, do_sample=True, temperature=0.2, stopping_criteria=criteria)
    direct, stats, via_hf = both_entries(model, inputs, 0, do_sample=True, temperature=0.2, stopping_criteria=criteria)
    assert len(expected) == 7 and direct == expected and via_hf == expected


def test_the_length_follows_max_length_or_the_generation_config_when_given() -> None:
    model, tokenizer = build("llama")
    inputs = tokenizer("the w5 w6 a w7", return_tensors="pt")
    config = model.generation_config.__class__.from_dict(model.generation_config.to_dict(), max_new_tokens=9)
    config.eos_token_id = None
    assert len(recap.generate(model, inputs, generation_config=config).token_ids) == 9
    assert (
        len(recap.generate(model, inputs, max_length=inputs["input_ids"].shape[1] + 5, eos_token_id=[]).token_ids) == 5
    )
    assert len(recap.generate(model, inputs, eos_token_id=[]).token_ids) == 128  # recap's default


def test_return_dict_in_generate_returns_the_sequences() -> None:
    model, tokenizer = build("qwen3")
    inputs = tokenizer("the w5 w6 a", return_tensors="pt")
    expected = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    out = model.generate(**inputs, max_new_tokens=20, custom_generate=recap.speculative, return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
