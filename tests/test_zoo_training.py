"""The training script runs end to end (a few steps), so it cannot silently rot."""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
from pathlib import Path

import pytest
import torch
from tiny_models import build
from transformers import AutoModelForImageTextToText

import recap
from recap import suite
from recap.loading import build_inputs
from recap.suite import seed as seed_suite
from recap.suite.check import extract_letter
from recap.zoo import ROOT
from recap.zoo.image_processor import load_processor
from tools.zoo_training import train


def test_training_smoke_run_resumes_and_saves_a_loadable_model(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [
        *"--arch qwen2.5-vl --batch-size 2 --short-batch-size 2 --tokenizer-samples 5 --vocab-size 400".split(),
        *"--checkpoint-every 1 --log-every 1 --warmup 1 --out".split(),
        str(out),
    ]
    train.main([*args, "--steps", "1"])
    train.main([*args, "--steps", "2"])  # resumes from the step-1 checkpoint
    summary = json.loads((out / "final" / "training.json").read_text())
    assert summary["steps"] == 2 and [h["step"] for h in summary["loss_history"]] == [1, 2]
    assert all(h["short_loss"] > 0 for h in summary["loss_history"])
    assert summary["command"].startswith("python -m tools.zoo_training.train --arch qwen2.5-vl")

    # a second phase starts from the saved model (same tokenizer) and records the first
    phase2 = tmp_path / "phase2"
    phase2_args = "--arch qwen2.5-vl --steps 1 --batch-size 1 --short-batch-size 0 --warmup 1 --data-seed 7".split()
    train.main([*phase2_args, "--out", str(phase2), "--init-from", str(out / "final")])
    second = json.loads((phase2 / "final" / "training.json").read_text())
    assert second["init_training"]["loss_history"] == summary["loss_history"]
    assert second["train_seed"] == 7 and "short_loss" not in second["loss_history"][0]
    assert (phase2 / "final" / "tokenizer.json").read_text() == (out / "final" / "tokenizer.json").read_text()

    # a phase of text-only option lookups alone
    phase3 = tmp_path / "phase3"
    lookup_args = "--arch qwen2.5-vl --steps 1 --batch-size 0 --short-batch-size 0 --lookup-batch-size 3".split()
    train.main([*lookup_args, "--warmup", "1", "--out", str(phase3), "--init-from", str(phase2 / "final")])
    third = json.loads((phase3 / "final" / "training.json").read_text())
    assert set(third["loss_history"][0]) == {"step", "lookup_loss", "minutes"} and third["lookup_batch_size"] == 3
    assert third["loss_history"][0]["lookup_loss"] > 0
    with pytest.raises(SystemExit):  # nothing to train on
        train.main(
            ["--arch", "qwen2.5-vl", "--out", str(tmp_path / "none"), "--batch-size", "0", "--short-batch-size", "0"]
        )

    model = AutoModelForImageTextToText.from_pretrained(out / "final", dtype=torch.float32).eval()
    processor = load_processor(out / "final")
    sample = suite.load("ocr", 1, 0)[0]
    inputs = build_inputs(processor, sample.prompt, sample.image)
    expected = model.generate(**inputs, do_sample=False, max_new_tokens=8)[0, inputs["input_ids"].shape[1] :]
    assert recap.generate(model, inputs, "recap", 8).token_ids == expected.tolist()


def test_batches_are_deterministic_and_resumable() -> None:
    first = [[s.seed for s in batch] for _, batch in zip(range(6), train.batch_stream(5, 0, 3))]
    again = [[s.seed for s in batch] for _, batch in zip(range(3), train.batch_stream(5, 3, 3))]
    assert again == first[3:]
    assert len({seed for batch in first for seed in batch}) == 18


def test_short_answer_items_ask_for_the_checkable_field() -> None:
    samples = [suite.load(family, 1, 3)[0] for family in suite.FAMILIES]
    for sample in samples:
        short = train.short_answer(sample)
        assert short.prompt.endswith("\n" + train.SHORT_INSTRUCTION) and short.reference == sample.check
        assert short.image is sample.image
    assert train.short_answer(samples[suite.FAMILIES.index("describe")]).prompt.startswith("How many objects")
    batches = [[s.seed for s in b] for _, b in zip(range(2), train.short_batch_stream(5, 0, 3))]
    again = [[s.seed for s in b] for _, b in zip(range(1), train.short_batch_stream(5, 1, 3))]
    assert again == batches[1:]
    long_seeds = {s.seed for b in zip(range(2), train.batch_stream(5, 0, 3)) for s in b[1]}
    assert long_seeds.isdisjoint(seed for b in batches for seed in b)  # scenes of their own


def test_short_weights_oversample_families_without_repeating_scenes() -> None:
    assert train.family_cycle() == list(suite.FAMILIES)
    cycle = train.family_cycle({"seed": 3, "ocr": 0})
    assert cycle.count("seed") == 3 and "ocr" not in cycle and cycle.count("chart") == 1
    weights = train.parse_weights("seed=3, ocr=0")
    assert weights == {"seed": 3, "ocr": 0}
    items = [s for _, b in zip(range(4), train.short_batch_stream(5, 0, len(cycle), weights)) for s in b]
    seeds = [s.seed for s in items if s.family == "seed"]
    assert len(seeds) == 3 * 4 and len(set(seeds)) == len(seeds)
    assert not any(s.family == "ocr" for s in items)
    again = [s.seed for _, b in zip(range(2), train.short_batch_stream(5, 2, len(cycle), weights)) for s in b]
    assert again == [s.seed for s in items[2 * len(cycle) :]]
    full = [s for _, b in zip(range(4), train.batch_stream(5, 0, len(cycle), weights=weights)) for s in b]
    assert sum(s.family == "seed" for s in full) == 3 * 4 and not any(s.family == "ocr" for s in full)
    # the default weights give exactly the unweighted stream (old commands stay reproducible)
    plain = [s.seed for _, b in zip(range(2), train.short_batch_stream(5, 0, 8)) for s in b]
    assert plain == [s.seed for _, b in zip(range(2), train.short_batch_stream(5, 0, 8, {})) for s in b]
    plain_full = [s.seed for _, b in zip(range(2), train.batch_stream(5, 0, 8)) for s in b]
    assert plain_full == [s.seed for _, b in zip(range(2), train.batch_stream(5, 0, 8, weights={})) for s in b]
    assert [s.seed for s in itertools.islice(train.sample_stream(5, 0), 8)] == [
        suite.sample_seed(f, 5, 0) for f in suite.FAMILIES
    ]
    for bad in ("seed", "seed=x", "nonsense=2", "seed=-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            train.parse_weights(bad)
    with pytest.raises(ValueError, match="no family"):
        train.family_cycle(dict.fromkeys(suite.FAMILIES, 0))


def test_fast_patch_embedding_matches_the_conv3d() -> None:
    model = build("qwen2_5_vl")[0].float()
    embed = model.model.visual.patch_embed
    c, t, p = embed.in_channels, embed.temporal_patch_size, embed.patch_size
    pixels = torch.randn(12, c * t * p * p, requires_grad=True)  # [patches, C*T*P*P], as the processor gives
    expected = embed(pixels)
    (expected**2).sum().backward()
    conv_grads = (pixels.grad.clone(), embed.proj.weight.grad.clone())
    pixels.grad, embed.proj.weight.grad = None, None
    train.fast_patch_embedding(model)
    got = embed(pixels)
    (got**2).sum().backward()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pixels.grad, conv_grads[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(embed.proj.weight.grad, conv_grads[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["tiny-qwen2.5-vl", "tiny-llava-next"])
def test_rescale_image_features_sets_the_mean_norm(name: str) -> None:
    model, processor = recap.zoo.load(name)
    images = [suite.load(family, 1, 11)[0].image for family in ("ocr", "chart")]
    original = train.image_feature_norm(model, processor, images)
    before, after = train.rescale_image_features(model, processor, 37.0, seed=11)
    assert before > 37.0 and abs(after - 37.0) < 0.37  # LLaVA's row-end newline embeddings are not scaled
    assert abs(train.image_feature_norm(model, processor, images) - original * 37.0 / before) < 1e-2 * original


def test_fresh_vision_phase_keeps_the_text_model_and_widens_the_vision_tower(tmp_path: Path) -> None:
    shipped = Path(recap.zoo.__file__).parent / "models" / "tiny-llava-next"
    source = AutoModelForImageTextToText.from_pretrained(shipped, dtype=torch.float32)
    fresh = train.make_model("llava-next", load_processor(shipped).tokenizer, vision_hidden=64)
    copied = train.transplant_text_model(source, fresh)
    fresh_state, source_state = fresh.state_dict(), source.state_dict()
    text = [k for k in fresh_state if not k.startswith(train.VISION_PREFIXES)]
    assert copied == len(text) and any(k.startswith("model.language_model.") for k in text)
    assert all(torch.equal(fresh_state[k], source_state[k]) for k in text)
    assert fresh.config.vision_config.hidden_size == 64 and fresh.config.vision_config.intermediate_size == 128
    with pytest.raises(ValueError, match="text models differ"):
        train.transplant_text_model(build("qwen2_5_vl")[0].float(), fresh)

    out = tmp_path / "wide"
    args = "--arch llava-next --steps 1 --batch-size 1 --short-batch-size 2 --warmup 1 --threads 1".split()
    args += ["--fresh-vision", "--vision-hidden", "64", "--image-feature-norm", "20", "--open-seed-short"]
    train.main([*args, "--init-from", str(shipped), "--out", str(out)])  # short items: mmt, seed (open)
    summary = json.loads((out / "final" / "training.json").read_text())
    assert summary["fresh_vision"] and summary["vision_hidden"] == 64 and summary["seed_forms"] == ["open"]
    saved = AutoModelForImageTextToText.from_pretrained(out / "final", dtype=torch.float32)
    assert saved.config.vision_config.hidden_size == 64
    for bad in (["--fresh-vision"], ["--init-from", str(shipped), "--vision-hidden", "64"]):
        with pytest.raises(SystemExit):
            train.main(["--arch", "llava-next", "--out", str(tmp_path / "bad"), *bad])


def test_open_seed_short_items_ask_the_question_without_options() -> None:
    samples = suite.load("seed", 60, 11)
    for sample in samples:
        question, option = seed_suite.open_form(sample.prompt, sample.check)
        assert question == sample.prompt.split("\n")[0] and question.endswith("?")
        assert f"{sample.check}. {option}" in sample.prompt or f"{sample.check}) {option}" in sample.prompt
        short = train.short_answer(sample, seed_forms=("open",))
        assert short.prompt == f"{question}\n{train.SHORT_INSTRUCTION}" and short.reference == option
        assert train.short_answer(sample).reference == sample.check  # letters unless asked
    assert len({seed_suite.open_form(s.prompt, s.check)[1] for s in samples}) > 15  # colours, shapes, places, ...
    other = suite.load("mmt", 1, 11)[0]
    assert train.short_answer(other, seed_forms=("open",)) == train.short_answer(other)
    with pytest.raises(ValueError, match="four-option"):
        seed_suite.open_form("What colour is it?\nA. red\nB. blue", "A")
    opened = [s for _, b in zip(range(2), train.short_batch_stream(5, 0, 8, seed_forms=("open",))) for s in b]
    assert [s.seed for s in opened] == [s.seed for _, b in zip(range(2), train.short_batch_stream(5, 0, 8)) for s in b]
    assert all(s.reference not in seed_suite.LETTERS for s in opened if s.family == "seed")


@pytest.mark.parametrize("arch", ["qwen2.5-vl", "llava-next"])
def test_text_only_lookups_are_seed_options_without_the_image(arch: str) -> None:
    first, second = itertools.islice(train.lookup_batch_stream(3, 0, 8), 2)
    assert [s.seed for s in train.lookup_batch_stream(3, 1, 8).__next__()] == [s.seed for s in second]  # resumable
    assert all(s.family == "seed" for s in first + second) and len({s.seed for s in first + second}) == 16
    for sample in first:
        lines = sample.prompt.split("\n")
        assert sample.reference in seed_suite.LETTERS and lines[-1] == train.SHORT_INSTRUCTION
        _, option = seed_suite.open_form("\n".join(lines[:5]), sample.reference)
        assert option in lines[0]  # the question names the answer's option
    processor = load_processor(ROOT / f"tiny-{arch}")  # the shipped model's
    batch = train.collate(first, processor, arch, with_images=False)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    image_token = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    assert not (batch["input_ids"] == image_token).any()
    answers = [row[row != -100].tolist() for row in batch["labels"]]
    eos = processor.tokenizer.eos_token_id
    assert [processor.tokenizer.decode(a[:-1]) for a in answers] == [s.reference for s in first]
    assert all(a[-1] == eos for a in answers)
    with_image = train.collate(first, processor, arch)
    assert (with_image["input_ids"] == image_token).any() and "pixel_values" in with_image


def test_sentence_lookups_close_an_answer_naming_any_option() -> None:
    """The "sentence" form: the question as asked, answered by the closing sentence of a seed
    answer (``seed.answer_sentence``) naming an option drawn apart from the scene, and its letter."""
    batch = next(train.lookup_batch_stream(4, 0, 40, ("sentence",)))
    originals = {s.seed: s for s in suite.load("seed", 200, 4 + train.LOOKUP_SEED_OFFSET)}
    for item in batch:
        original = originals[item.seed]
        assert item.prompt == original.prompt and train.SHORT_INSTRUCTION not in item.prompt
        option, letter = re.fullmatch(r".* (\S+) \(([A-D])\)[ .].*", item.reference).groups()
        assert letter == item.check == train.any_letter(item.seed)
        assert seed_suite.open_form(item.prompt, letter)[1].endswith(option)
        assert extract_letter(item.reference) == letter
    assert {s.check for s in batch} == set(seed_suite.LETTERS)
    assert 0 < sum(s.check == originals[s.seed].check for s in batch) < len(batch) / 2  # not the scene's answer
    assert len({s.reference.split(" ")[0] for s in batch}) > 1  # the four wordings


def test_seed_forms_mix_letter_open_and_lookup_items() -> None:
    samples = suite.load("seed", 60, 12)
    forms = ("letter", "open", "lookup")
    seen = {train.seed_form(s, forms) for s in samples}
    assert seen == set(forms)
    for sample in samples:
        short = train.short_answer(sample, forms)
        question, option = seed_suite.open_form(sample.prompt, sample.check)
        form = train.seed_form(sample, forms)
        if form == "lookup":
            lines = short.prompt.split("\n")
            assert option in lines[0] and lines[0] != question and lines[1:5] == sample.prompt.split("\n")[1:5]
            assert lines[5] == train.SHORT_INSTRUCTION and short.reference == sample.check
        elif form == "open":
            assert short.reference == option
        else:
            assert short.prompt == f"{sample.prompt}\n{train.SHORT_INSTRUCTION}" and short.reference == sample.check
    assert len({train.short_answer(s, forms).prompt.split("\n")[0].split(" ")[1] for s in samples}) > 1  # wordings
    named = [train.short_answer(s, ("lookup-any",)) for s in samples]
    assert all(
        seed_suite.open_form(s.prompt, n.reference)[1] in n.prompt.split("\n")[0] for n, s in zip(named, samples)
    )
    assert 0 < sum(n.reference == s.check for n, s in zip(named, samples)) < len(samples) / 2
    assert {n.reference for n in named} == set(seed_suite.LETTERS)
    kinds = [random.Random(s.seed).choice(seed_suite.KINDS) for s in samples]  # generate's first draw
    by_kind = {k: {n.reference for n, kind in zip(named, kinds) if kind == k} for k in set(kinds)}
    assert all(len(letters) >= 2 for letters in by_kind.values())  # the named letter does not reveal the kind
    assert train.parse_seed_forms(" open, lookup-any ") == ("open", "lookup-any")
    for bad in ("", "letters", "open,closed"):
        with pytest.raises(argparse.ArgumentTypeError, match="subset of letter, open, lookup, lookup-any, sentence"):
            train.parse_seed_forms(bad)
