"""The ``recap`` command line: generate (all methods, text and image), clean errors, memory
files (create, reuse, inspect, refuse corrupt or foreign ones), and bench."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tiny_models
import torch
from PIL import Image
from typer.testing import CliRunner, Result

import recap
import recap.core.persist
import recap.loading
from recap.cli import app
from recap.core.persist import tokenizer_fingerprint
from recap.loading import build_inputs

PROMPT = "the red w1 w2 is of the blue w5 w7 the red w1 w2"
IMAGE_PROMPT = "what is the image w3 w4 w3 w4"
TOKENS = 12
METHODS = ("recap", "token_recycling", "pld", "ar")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny llama (text only) and llava_next (image + text) saved as model folders, plus a PNG."""
    root = tmp_path_factory.mktemp("cli_models")
    out = tiny_models.save_folders(root)
    out["image"] = root / "image.png"
    Image.new("RGB", (40, 30), (200, 40, 10)).save(out["image"])
    return out


runner = CliRunner()


def invoke(*args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def failed(result: Result, *fragments: str) -> str:
    """A clean failure: non-zero exit through typer.Exit (no exception escaped), an
    ``error:`` line naming the problem, no traceback."""
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert "error:" in result.stderr
    for fragment in fragments:
        assert fragment in result.output, (fragment, result.output)
    return result.output


def generate_json(model_dir: Path, *extra: str | Path, prompt: str = PROMPT, tokens: int = TOKENS) -> dict[str, Any]:
    result = ok(invoke("generate", "-m", model_dir, "-p", prompt, "--max-new-tokens", str(tokens), "--json", *extra))
    return json.loads(result.stdout)


def reference_ids(arch: str, prompt: str, image: Path | None = None, tokens: int = TOKENS) -> list[int]:
    model, processor = tiny_models.build(arch)
    inputs = build_inputs(processor, prompt, image)
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=tokens)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[Any]:
    """Records the calls of ``owner.name`` (still calling through)."""
    calls: list[Any] = []
    original: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


def memory_fields(path: Path) -> dict[str, str]:
    """``recap memory info`` as a dict of its "key value" lines."""
    lines = ok(invoke("memory", "info", path)).stdout.strip().splitlines()
    return dict(line.split(None, 1) for line in lines)


# -- generate -----------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_generate_text_model_json(models: dict[str, Path], method: str) -> None:
    out = generate_json(models["llama"], "--method", method)
    assert set(out) >= {"text", "token_ids", "stats"}
    assert out["token_ids"] == reference_ids("llama", PROMPT)
    _, tokenizer = tiny_models.build("llama")
    assert out["text"] == tokenizer.decode(out["token_ids"], skip_special_tokens=True)
    stats = out["stats"]
    assert stats["method"] == method
    assert stats["new_tokens"] == len(out["token_ids"])
    assert 1 + sum(stats["accepted_lengths"]) == stats["new_tokens"]
    assert stats["mean_accepted_length"] >= 1.0


@pytest.mark.parametrize("method", METHODS)
def test_generate_vlm_with_image(models: dict[str, Path], method: str) -> None:
    out = generate_json(models["llava_next"], "--image", models["image"], "--method", method, prompt=IMAGE_PROMPT)
    assert out["token_ids"] == reference_ids("llava_next", IMAGE_PROMPT, models["image"])
    assert out["stats"]["method"] == method


def test_generate_vlm_without_image(models: dict[str, Path]) -> None:
    out = generate_json(models["llava_next"], "--method", "ar")
    assert out["token_ids"] == reference_ids("llava_next", PROMPT)


def test_generate_plain_output(models: dict[str, Path]) -> None:
    result = ok(invoke("generate", "-m", models["llama"], "-p", PROMPT, "--max-new-tokens", "6", "--method", "pld"))
    _, tokenizer = tiny_models.build("llama")
    assert result.stdout.strip() == tokenizer.decode(reference_ids("llama", PROMPT, tokens=6), skip_special_tokens=True)
    assert "pld:" in result.stderr and "mean accepted length" in result.stderr


def test_generate_streams_by_default_and_not_with_no_stream(models: dict[str, Path], monkeypatch) -> None:
    _, tokenizer = tiny_models.build("llama")
    expected = tokenizer.decode(reference_ids("llama", PROMPT, tokens=20), skip_special_tokens=True)
    puts = spy(monkeypatch, __import__("transformers").TextStreamer, "put")
    streamed = ok(invoke("generate", "-m", models["llama"], "-p", PROMPT, "--max-new-tokens", "20"))
    assert streamed.stdout.strip() == expected and len(puts) > 2  # the prompt, then the tokens step by step
    puts.clear()
    plain = ok(invoke("generate", "-m", models["llama"], "-p", PROMPT, "--max-new-tokens", "20", "--no-stream"))
    assert plain.stdout.strip() == expected and not puts


def test_generate_samples_like_generate_under_a_seed(models: dict[str, Path]) -> None:
    model, processor = tiny_models.build("llava_next")
    inputs = build_inputs(processor, IMAGE_PROMPT, models["image"])
    for seed in (0, 1):
        args = ("--image", models["image"], "--temperature", "0.8", "--top-p", "0.9", "--top-k", "20", "--seed", seed)
        out = generate_json(models["llava_next"], *map(str, args), prompt=IMAGE_PROMPT, tokens=30)
        torch.manual_seed(seed)
        with torch.inference_mode():
            reference = model.generate(
                **inputs, do_sample=True, temperature=0.8, top_p=0.9, top_k=20, max_new_tokens=30
            )
        assert out["token_ids"] == reference[0, inputs["input_ids"].shape[1] :].tolist(), f"seed {seed}"


# -- errors -------------------------------------------------------------------------------------
def test_error_missing_model_dir(tmp_path: Path) -> None:
    failed(invoke("generate", "-m", tmp_path / "no-such-model", "-p", "x"), "no-such-model", "not a model directory")


def test_error_folder_without_config(tmp_path: Path) -> None:
    failed(invoke("generate", "-m", tmp_path, "-p", "x"), "config.json")


def test_error_unknown_model_name() -> None:
    failed(invoke("generate", "-m", "definitely-not-a-model", "-p", "x"), "definitely-not-a-model")


def test_error_unknown_method(models: dict[str, Path]) -> None:
    failed(invoke("generate", "-m", models["llama"], "-p", "x", "--method", "medusa"), "medusa", "recap")


def test_error_image_on_text_model(models: dict[str, Path]) -> None:
    failed(invoke("generate", "-m", models["llama"], "-p", "x", "--image", models["image"]), "takes no images")


def test_error_missing_image_file(models: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "missing.png"
    failed(invoke("generate", "-m", models["llava_next"], "-p", "x", "--image", missing), str(missing))


def test_error_unreadable_image_file(models: dict[str, Path], tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.png"
    garbage.write_bytes(b"not an image at all" * 5)
    failed(invoke("generate", "-m", models["llava_next"], "-p", "x", "--image", garbage), "garbage.png")


def test_error_through_console_script(tmp_path: Path) -> None:
    """The real process: exit status 2, one error line, no traceback."""
    script = Path(sys.executable).with_name("recap")
    command = [str(script)] if script.exists() else [sys.executable, "-c", "from recap.cli import main; main()"]
    proc = subprocess.run(
        [*command, "generate", "-m", str(tmp_path / "nothing"), "-p", "x"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("error:") and "nothing" in proc.stderr


# -- memory files -------------------------------------------------------------------------------
def test_memory_file_create_reuse_and_info(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory_file = tmp_path / "mem.recap"
    cold = generate_json(models["llava_next"], "--no-memory-file")  # no memory file: a fresh memory
    first = generate_json(models["llava_next"], "--memory-file", memory_file)
    assert memory_file.is_file()
    assert first["token_ids"] == cold["token_ids"] == reference_ids("llava_next", PROMPT)

    fields = memory_fields(memory_file)
    model, processor = tiny_models.build("llava_next")
    assert fields["method"] == "recap"
    assert fields["k"] == str(recap.RecapConfig().k)
    assert fields["vocab_size"] == str(model.get_output_embeddings().weight.shape[0])
    assert fields["fingerprint"] == tokenizer_fingerprint(processor)
    rows_first = int(fields["rows_filled"])
    assert rows_first > 0
    assert int(fields["size_bytes"]) == memory_file.stat().st_size

    loads = spy(monkeypatch, recap.core.memory, "load_memory")
    second = generate_json(models["llava_next"], "--memory-file", memory_file)
    assert len(loads) == 1  # the existing file was read
    assert second["token_ids"] == first["token_ids"]  # still lossless
    # the memory learnt on this very prompt drafts it well: fewer target forwards than cold
    assert second["stats"]["steps"] < cold["stats"]["steps"]
    assert second["stats"]["mean_accepted_length"] > cold["stats"]["mean_accepted_length"]
    assert int(memory_fields(memory_file)["rows_filled"]) >= rows_first


def test_memory_file_token_recycling(models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memory_file = tmp_path / "tr.recap"
    generate_json(models["llama"], "--method", "token_recycling", "--memory-file", memory_file)
    fields = memory_fields(memory_file)
    assert fields["method"] == "token_recycling" and fields["k"] == "8"
    before = memory_file.read_bytes()
    loads = spy(monkeypatch, recap.loading, "load_model")
    failed(invoke("generate", "-m", models["llama"], "-p", "x", "--memory-file", memory_file), "token_recycling")
    assert memory_file.read_bytes() == before and loads == []


def test_memory_file_needs_a_persistent_method(models: dict[str, Path], tmp_path: Path) -> None:
    memory_file = tmp_path / "m.recap"
    failed(invoke("generate", "-m", models["llama"], "-p", "x", "--method", "pld", "--memory-file", memory_file), "pld")
    assert not memory_file.exists()


def test_corrupt_memory_file_is_refused_and_untouched(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory_file = tmp_path / "corrupt.recap"
    garbage = bytes(range(256)) * 7 + b"\x00garbage"
    memory_file.write_bytes(garbage)
    mtime = memory_file.stat().st_mtime_ns
    loads = spy(monkeypatch, recap.loading, "load_model")
    decodes = spy(monkeypatch, recap.entry, "generate")
    saves = spy(monkeypatch, recap.core.memory, "save_memory")
    result = invoke("generate", "-m", models["llava_next"], "-p", PROMPT, "--memory-file", memory_file)
    failed(result, str(memory_file))
    assert loads == [] and decodes == [] and saves == []  # refused before loading the model or decoding
    assert result.stdout == ""
    assert memory_file.read_bytes() == garbage
    assert memory_file.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.recap"]  # no temporary left behind

    failed(invoke("memory", "info", memory_file), str(memory_file))
    assert memory_file.read_bytes() == garbage

    out = tmp_path / "bench"
    args = ["--suite", "ocr", "--samples", "1", "--methods", "ar,recap", "--out", out, "--memory-file", memory_file]
    failed(invoke("bench", "-m", models["llava_next"], *args), str(memory_file))
    assert loads == [] and saves == []
    assert memory_file.read_bytes() == garbage and not out.exists()


@pytest.mark.parametrize("content", [b"", b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "], ids=["empty", "no-tensors"])
def test_degenerate_memory_files_are_refused(models: dict[str, Path], tmp_path: Path, content: bytes) -> None:
    memory_file = tmp_path / "bad.recap"
    memory_file.write_bytes(content)
    failed(invoke("generate", "-m", models["llama"], "-p", "x", "--memory-file", memory_file), str(memory_file))
    assert memory_file.read_bytes() == content


def test_memory_file_of_another_vocabulary_is_refused(models: dict[str, Path], tmp_path: Path) -> None:
    memory_file = tmp_path / "llama.recap"
    generate_json(models["llama"], "--memory-file", memory_file)
    before = memory_file.read_bytes()
    output = failed(
        invoke("generate", "-m", models["llava_next"], "-p", PROMPT, "--memory-file", memory_file), str(memory_file)
    )
    assert "fingerprint" in output or "vocabulary" in output
    assert memory_file.read_bytes() == before
    # and the other way round
    other = tmp_path / "llava.recap"
    generate_json(models["llava_next"], "--memory-file", other, tokens=4)
    failed(invoke("generate", "-m", models["llama"], "-p", PROMPT, "--memory-file", other), str(other))


def test_memory_info_missing_file(tmp_path: Path) -> None:
    failed(invoke("memory", "info", tmp_path / "nope.recap"), "nope.recap")


# -- bench --------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampling", [[], ["--temperature", "0.7", "--seed", "0"]])
def test_bench_suite(models: dict[str, Path], tmp_path: Path, sampling: list[str]) -> None:
    out = tmp_path / "bench"
    args = ["--suite", "ocr", "--samples", "1", "--max-new-tokens", "16", "--methods", "ar,recap", "--out", out]
    result = ok(invoke("bench", "-m", models["llava_next"], *args, *sampling))
    for word in ("method", "MAL", "speedup", "generate", "ar", "recap", "results.json"):
        assert word in result.stdout, word
    assert "LOSSLESS VIOLATED" not in result.stdout
    results = json.loads((out / "results.json").read_text())
    assert list(results["overall"]) == ["generate", "ar", "recap"]
    assert list(results["families"]) == ["ocr"]
    for method, summary in results["overall"].items():
        assert summary["match_ratio"] == 1.0 and summary["samples"] == 1, method
    assert results["mismatches"] == []
    assert results["settings"]["max_new_tokens"] == 16
    assert results["settings"]["decoding"].startswith("sampling" if sampling else "greedy")
    assert (out / "report.md").is_file() and (out / "speedup.png").is_file()


def test_bench_bad_jsonl_names_the_line(models: dict[str, Path], tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "fine"}\n\n{"prompt": "no image", "image": "missing.png"}\n')
    out = tmp_path / "out"
    output = failed(invoke("bench", "-m", models["llava_next"], "--data", data, "--methods", "ar", "--out", out))
    assert f"{data}:3" in output and "missing.png" in output
    assert not out.exists()
    data.write_text('{"prompt": "fine"}\nnot json\n')
    assert f"{data}:2" in failed(invoke("bench", "-m", models["llava_next"], "--data", data, "--out", out))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--methods", "ar,warp"], "warp"),
        (["--suite", "ocr,nope"], "nope"),
        (["--memory", "lukewarm"], "lukewarm"),
        (["--memory", "cold", "--memory-file", "m.recap"], "--memory cold"),
        (["--methods", "hf-prompt-lookup", "--temperature", "0.7", "--no-costs"], "cannot run in the sampling mode"),
    ],
)
def test_bench_bad_options(models: dict[str, Path], tmp_path: Path, args: list[str], fragment: str) -> None:
    failed(invoke("bench", "-m", models["llava_next"], "--out", tmp_path / "out", *args), fragment)
