"""The memory file `recap generate` keeps per model in the user's cache ($RECAP_CACHE): a second run starts
warm with the same tokens, a damaged or foreign file is moved aside with a warning, never used, never fatal."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import tiny_models
import torch
from typer.testing import CliRunner

import recap
import recap.entry
from recap.backends.hf import output_vocab_size
from recap.cli import app
from recap.core.persist import memory_info
from recap.loading import build_inputs

PROMPT = "the red w1 w2 is of the blue w5 w7 the red w1 w2"
TOKENS = 12
runner = CliRunner()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cache_models")
    out = tiny_models.save_folders(root)
    out["copy"] = root / "llava_next_copy"  # the same weights and tokenizer in another folder
    shutil.copytree(out["llava_next"], out["copy"])
    return out


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RECAP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def generate(model_dir: Path, *extra: str) -> tuple[dict[str, Any], str]:
    args = ["generate", "-m", str(model_dir), "-p", PROMPT, "--max-new-tokens", str(TOKENS), "--json", *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout), result.stderr


def reference(arch: str) -> list[int]:
    model, processor = tiny_models.build(arch)
    inputs = build_inputs(processor, PROMPT)
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=TOKENS)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def cache_files(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.rglob("*") if p.is_file()) if cache.exists() else []


def test_second_generate_starts_warm_with_the_same_tokens(models: dict[str, Path], cache: Path) -> None:
    first, _ = generate(models["llava_next"])
    path = Path(first["memory_file"])
    assert path.parent == cache / "memory" and path.is_file()
    assert path.name.startswith("llava_next-") and path.name.endswith(f".recap-k{recap.RecapConfig().k}.safetensors")
    rows = memory_info(path)["rows_filled"]
    assert rows > 0  # what the second run starts from
    second, stderr = generate(models["llava_next"])
    assert "warning" not in stderr
    assert second["memory_file"] == str(path)
    assert second["token_ids"] == first["token_ids"] == reference("llava_next")
    assert memory_info(path)["rows_filled"] >= rows
    # the library finds the same file, warm, in one call
    model, processor = tiny_models.build("llava_next")
    memory, lib_path = recap.cached_memory(model, processor, name=str(models["llava_next"]))
    assert lib_path == path and memory.rows_filled >= rows
    inputs = build_inputs(processor, PROMPT)
    # warm: on trees of a fixed size (the default sizes them from step times, which vary from run to run), the
    # cached memory commits the same tokens in fewer steps than an empty one
    fixed = recap.RecapConfig(adaptive_budget=False, node_budget=8)
    empty = recap.TokenMemory(memory.vocab_size, k=memory.k, method="recap")
    cold = recap.generate(model, inputs, memory=empty, config=fixed, max_new_tokens=TOKENS)
    warm = recap.generate(model, inputs, memory=memory.copy(), config=fixed, max_new_tokens=TOKENS)
    assert warm.token_ids == cold.token_ids == first["token_ids"]
    assert warm.stats.steps < cold.stats.steps
    result = recap.generate(model, inputs, memory=memory, max_new_tokens=TOKENS)
    assert result.token_ids == first["token_ids"]
    memory.save(lib_path)


def test_no_memory_file_writes_nothing(models: dict[str, Path], cache: Path) -> None:
    out, _ = generate(models["llama"], "--no-memory-file")
    assert out["memory_file"] is None and out["token_ids"] == reference("llama")
    assert cache_files(cache) == []
    out, _ = generate(models["llama"], "--method", "pld")  # a method without a persistent memory: no file either
    assert out["memory_file"] is None and cache_files(cache) == []
    result = runner.invoke(
        app, ["generate", "-m", str(models["llama"]), "-p", "x", "--memory-file", "m", "--no-memory-file"]
    )
    assert result.exit_code == 2 and "contradict" in result.stderr


def test_damaged_cache_file_is_moved_aside_with_a_warning(models: dict[str, Path], cache: Path) -> None:
    model, processor = tiny_models.build("llava_next")
    path = recap.memory_cache_path(model, processor, name=str(models["llava_next"]))
    path.parent.mkdir(parents=True)
    garbage = bytes(range(256)) * 3
    path.write_bytes(garbage)
    out, stderr = generate(models["llava_next"])
    warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and str(path) in warnings[0] and f"moved it to {path.name}.bad" in warnings[0]
    assert out["token_ids"] == reference("llava_next")
    assert path.with_name(path.name + ".bad").read_bytes() == garbage
    assert memory_info(path)["rows_filled"] > 0  # a fresh memory, saved


def test_memory_of_another_model_is_never_used(
    models: dict[str, Path], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llama, _ = generate(models["llama"])
    llava, _ = generate(models["llava_next"])
    copy, _ = generate(models["copy"])  # same tokenizer, another folder: another file
    assert len({llama["memory_file"], llava["memory_file"], copy["memory_file"]}) == 3
    # a memory of another vocabulary and tokenizer where the llava file is expected: refused, moved aside
    shutil.copyfile(llama["memory_file"], llava["memory_file"])
    rows_at_start = []
    original = recap.entry.generate

    def spy(*args, **kwargs):
        rows_at_start.append(kwargs["memory"].rows_filled)
        return original(*args, **kwargs)

    monkeypatch.setattr(recap.entry, "generate", spy)
    out, stderr = generate(models["llava_next"])
    assert "warning:" in stderr and "fingerprint mismatch" in stderr and llava["memory_file"] in stderr
    assert out["token_ids"] == reference("llava_next")
    assert rows_at_start == [0]  # decoded from a fresh memory
    assert memory_info(llava["memory_file"])["vocab_size"] == output_vocab_size(tiny_models.build("llava_next")[0])
    # the library warns too, once, and returns a fresh memory
    model, processor = tiny_models.build("llava_next")
    shutil.copyfile(llama["memory_file"], llava["memory_file"])
    with pytest.warns(RuntimeWarning, match="fingerprint mismatch"):
        memory, _ = recap.cached_memory(model, processor, name=str(models["llava_next"]))
    assert memory.rows_filled == 0


def test_embedded_models_are_keyed_by_name(cache: Path) -> None:
    model, processor = recap.zoo.load("tiny-qwen2.5-vl")  # config.name_or_path: the shipped folder
    path = recap.memory_cache_path(model, processor)
    assert path.name == f"tiny-qwen2.5-vl.recap-k{recap.RecapConfig().k}.safetensors"
    assert recap.memory_cache_path(model, processor, name="tiny-qwen2.5-vl@0.5b").name.startswith(
        "tiny-qwen2.5-vl@0.5b."
    )
    assert recap.memory_cache_path(model, processor, "token_recycling").name.endswith(".token_recycling-k8.safetensors")
    with pytest.raises(recap.InputError, match="pld"):
        recap.memory_cache_path(model, processor, "pld")


def test_concurrent_saves_leave_a_valid_file(cache: Path) -> None:
    """Two writers at once (as two processes would): each save is atomic, the last writer wins."""
    model, processor = tiny_models.build("llama")
    memories = []
    for seed in (1, 2):
        memory, path = recap.cached_memory(model, processor, name="concurrent")
        ids = torch.tensor([[seed, 5, 6, 7, 5, 6, 7, 8]])
        recap.generate(
            model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, memory=memory, max_new_tokens=8
        )
        memories.append(memory)
    errors: list[BaseException] = []

    def save(memory: recap.TokenMemory) -> None:
        try:
            for _ in range(15):
                memory.save(path)
                recap.load_memory(path, expected=processor)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(m,)) for m in memories]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert memory_info(path)["rows_filled"] in {m.rows_filled for m in memories}
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind


def test_second_generate_starts_from_this_machines_step_costs(
    models: dict[str, Path], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside the memory file, the step-cost model's times and the linear kernels chosen: a second run starts
    from them (no start-up probes, no forward timing kernels) with the same tokens; a damaged file is moved aside
    with one warning, another machine's is not used (and is replaced by this machine's)."""
    from recap.backends import few_row_linear
    from recap.core.step_cost import StepCost
    from recap.memory_cache import STEP_COSTS_FORMAT, step_costs_path

    restored: list[bool] = []
    original = StepCost.restore

    def spy(self: StepCost, times: dict) -> bool:
        restored.append(original(self, times))
        return restored[-1]

    monkeypatch.setattr(StepCost, "restore", spy)
    first, _ = generate(models["llava_next"], "--max-new-tokens", "40")
    path = step_costs_path(Path(first["memory_file"]))
    saved = json.loads(path.read_text())
    assert saved["format"] == STEP_COSTS_FORMAT and "1" in saved["times"] and saved["machine"]["threads"] >= 1
    assert restored == [] and first["stats"]["tree_sizes"][:2] == [1, 2]  # the first run probed: 1, 2, ...
    kernels = {tuple(entry[:5]): entry[5] for entry in saved["linear_kernels"]}
    assert kernels and kernels == few_row_linear.choices()
    few_row_linear.forget()  # as in a new process
    second, stderr = generate(models["llava_next"], "--max-new-tokens", "40")
    assert restored == [True] and "warning" not in stderr
    assert second["token_ids"] == first["token_ids"]
    assert kernels.items() <= few_row_linear.choices().items()  # taken, not timed again
    # another machine's times: not used, and this machine's saved over them
    saved["machine"]["processor"] = "another CPU"
    path.write_text(json.dumps(saved))
    third, stderr = generate(models["llava_next"], "--max-new-tokens", "40")
    assert restored == [True] and "warning" not in stderr and third["token_ids"] == first["token_ids"]
    saved = json.loads(path.read_text())
    assert saved["machine"]["processor"] != "another CPU"
    # a damaged file: moved aside, one warning, the same tokens, and none of it taken (a sound kernel choice beside
    # bad times, or a bad one among sound ones)
    sound = [7, 5, False, 3, 1, "linear"]
    for damage in (
        b"{not json",
        json.dumps({**saved, "times": {"1": [-1.0]}, "linear_kernels": [sound]}).encode(),
        json.dumps({**saved, "linear_kernels": [sound, [16, 16, True, 4, 1, "fastest"]]}).encode(),
    ):
        path.write_bytes(damage)
        out, stderr = generate(models["llava_next"], "--max-new-tokens", "40")
        assert (7, 5, False, 3, 1) not in few_row_linear.choices()
        warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1 and str(path) in warnings[0] and f"moved it to {path.name}.bad" in warnings[0]
        assert path.with_name(path.name + ".bad").read_bytes() == damage and out["token_ids"] == first["token_ids"]
        assert json.loads(path.read_text())["format"] == STEP_COSTS_FORMAT  # this run's, saved
    out, _ = generate(models["llava_next"], "--max-new-tokens", "40", "--no-memory-file")
    assert out["memory_file"] is None
