"""The embedded models load offline by name and generate through the chat-template path;
every method reproduces their greedy output on held-out suite requests."""

from __future__ import annotations

import functools

import pytest
import torch
import transformers
from packaging.version import Version
from transformers import AutoModelForImageTextToText, AutoProcessor

import recap
from recap import suite, zoo
from recap.backends.hf import output_vocab_size
from recap.loading import build_inputs, decode, load_model
from recap.zoo.image_processor import QwenVLImageProcessor, load_processor, register

NAMES = ("tiny-qwen2.5-vl", "tiny-llava-next")
# transformers before 5.19 (recap requires 5.19; a GPU machine's preinstalled 5.17) ignores ``AutoProcessor.register``
# for its own config classes: ``AutoProcessor`` then gives the Qwen folder's bare tokenizer (``load_processor`` not)
AUTO_PROCESSOR_REGISTERS = Version(transformers.__version__) >= Version("5.19")


@functools.cache
def loaded(name: str):
    return zoo.load(name)


def test_both_models_are_embedded_and_small() -> None:
    assert set(NAMES) <= set(zoo.NAMES)
    for name in NAMES:
        weights = zoo.path(name) / "model.safetensors"
        assert weights.is_file() and weights.stat().st_size < 25 * 2**20
        assert (zoo.path(name) / "README.md").is_file()


@pytest.mark.parametrize("name", NAMES)
def test_loads_offline_with_from_pretrained_and_by_name(name: str) -> None:
    if name == "tiny-qwen2.5-vl" and not AUTO_PROCESSOR_REGISTERS:
        pytest.skip(f"transformers {transformers.__version__} ignores AutoProcessor.register for Qwen2_5_VLConfig")
    register()
    model = AutoModelForImageTextToText.from_pretrained(zoo.path(name), dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(zoo.path(name))
    assert hasattr(processor, "image_processor") and processor.chat_template
    by_name, by_name_processor = load_model(name, device="cpu", dtype="float32")
    assert type(by_name) is type(model) and type(by_name_processor) is type(processor)


def test_qwen_processor_loads_without_the_auto_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers 5.17 (a GPU machine's preinstalled one) ignores AutoProcessor.register for its own config
    # classes, and AutoProcessor then returns the bare tokenizer: the embedded Qwen must not depend on it
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING

    monkeypatch.setattr(PROCESSOR_MAPPING, "_extra_content", {})
    monkeypatch.setattr("recap.zoo.image_processor.register", lambda: None)
    assert not hasattr(AutoProcessor.from_pretrained(zoo.path("tiny-qwen2.5-vl")), "image_processor")
    processor = load_processor(zoo.path("tiny-qwen2.5-vl"))
    assert type(processor) is QwenVLImageProcessor and processor.chat_template
    assert type(zoo.load("tiny-qwen2.5-vl")[1]) is QwenVLImageProcessor
    assert hasattr(load_processor(zoo.path("tiny-llava-next")), "image_processor")


@pytest.mark.parametrize("name", NAMES)
def test_generates_an_answer_that_uses_the_image(name: str) -> None:
    model, processor = loaded(name)
    sample = suite.load("ocr", 1, 5)[0]
    inputs = build_inputs(processor, sample.prompt, sample.image)
    out = model.generate(**inputs, do_sample=False, max_new_tokens=48)[0, inputs["input_ids"].shape[1] :]
    text = decode(processor, out.tolist())
    assert len(text.split()) >= 3


@pytest.mark.parametrize("name", NAMES)
def test_every_method_is_lossless_on_the_trained_models(name: str) -> None:
    model, processor = loaded(name)
    memory = recap.TokenMemory(output_vocab_size(model))
    for i, family in enumerate(("describe", "chart", "science")):
        sample = suite.load(family, 1, 77 + i)[0]
        inputs = build_inputs(processor, sample.prompt, sample.image)
        expected = model.generate(**inputs, do_sample=False, max_new_tokens=200)[0, inputs["input_ids"].shape[1] :]
        for method in ("ar", "pld", "token_recycling", "recap"):
            result = recap.generate(model, inputs, method, 200, memory=memory if method == "recap" else None)
            assert result.token_ids == expected.tolist(), f"{name} {family} {method}"


def test_bench_records_a_failing_library_peer_instead_of_crashing() -> None:
    """transformers' own prompt lookup drafts image placeholders on VLM prompts and raises;
    the bench must say so and keep going."""
    from recap.bench import markdown, parse_methods, run_bench, suite_requests

    model, processor = loaded("tiny-qwen2.5-vl")
    requests = suite_requests("ocr", 1, 0)
    results = run_bench(
        model,
        processor,
        requests,
        parse_methods("hf-prompt-lookup,ar"),
        max_new_tokens=8,
        progress=False,
        settings={"model": "tiny", "device": "cpu", "dtype": "float32", "workload": "test"},
    )
    assert [f["method"] for f in results["failures"]] == ["hf-prompt-lookup"]
    assert "hf-prompt-lookup" not in results["overall"] and results["overall"]["ar"]["match_ratio"] == 1.0
    assert "Failed runs of peers" in markdown(results)


def test_evaluate_shows_each_answer_of_a_family_subset(capsys: pytest.CaptureFixture[str]) -> None:
    from tools.zoo_training import evaluate

    evaluate.main(["--model", "tiny-qwen2.5-vl", "--families", "ocr", "--samples", "2", "--show"])
    out = capsys.readouterr().out
    assert out.count("[ocr] ") == 2 and out.count("  answer: ") == 2
    assert "| ocr |" in out and "| seed |" not in out
    with pytest.raises(SystemExit):
        evaluate.main(["--model", "tiny-qwen2.5-vl", "--families", "ocr,charts"])
    assert "must be a non-empty subset" in capsys.readouterr().err
