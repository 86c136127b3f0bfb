"""Memory files: round trip, every bad-file case, fuzzing, kill during save, fingerprints."""

from __future__ import annotations

import copy
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
import tiny_models
import torch

import recap
from recap import MemoryFileError, RecapConfig, TokenMemory, load_memory, memory_info, save_memory
from recap.backends.hf import output_vocab_size
from recap.codes import PERSISTENT_METHODS as METHODS
from recap.core.persist import FORMAT_NAME, FORMAT_VERSION, METADATA_KEY, header_for, tokenizer_fingerprint
from recap.core.topk import TopK
from recap.drafters.recap import RecapDrafter

SRC = str(Path(recap.__file__).resolve().parents[1])
PROMPTS = [
    "the red w1 w2 is of the blue w5 w7",
    "what is the image w3 w4 w3 w4 the",
    "one two one two one two w9 w8",
]


# -- helpers --------------------------------------------------------------------------------
def small_memory(vocab: int = 20, k: int = 4, rows: int = 5) -> TokenMemory:
    rng = np.random.default_rng(0)
    memory = TokenMemory(vocab, k, "recap", fingerprint="f" * 64)
    probs = rng.dirichlet(np.ones(k + 1), size=rows)[:, :k].astype(np.float32)
    ids = rng.integers(0, vocab, size=(rows, k))
    memory.write(np.arange(rows), TopK(ids, probs))
    if rows >= 2:  # and some persistent 2-/3-token rows
        memory.context[2].write_many([(1, 2), (3, 4)], [(ids[0].tolist(), probs[0].tolist(), 0.5)] * 2)
        memory.context[3].write_many([(1, 2, 3)], [(ids[1].tolist(), probs[1].tolist(), 0.25)])
    return memory


def parts(memory: TokenMemory | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Tensors and header of a valid file, to be mutated into bad ones."""
    memory = memory or small_memory()
    tensors = memory.snapshot()
    header = header_for(memory.method, memory.k, memory.vocab_size, memory.fingerprint, tensors)
    header["created"] = "2025-01-01T00:00:00+00:00"
    return tensors, header


def write(path: Path, tensors: dict[str, np.ndarray], header: Any = None, metadata: dict | None = None) -> Path:
    if metadata is None and header is not None:
        metadata = {METADATA_KEY: json.dumps(header)}
    safetensors.numpy.save_file(tensors, str(path), metadata=metadata)
    return path


def check_invariants(memory: TokenMemory) -> None:
    """Everything a loaded memory promises."""
    v, k = memory.vocab_size, memory.k
    assert memory.method in METHODS and v >= 1 and k >= 1
    assert memory.ids.shape == (v, k) and memory.ids.dtype == np.int32
    assert memory.probs.shape == (v, k) and memory.probs.dtype == np.float32
    assert memory.kappa.shape == (v,) and memory.kappa.dtype == np.float32
    assert memory.filled.shape == (v,) and memory.filled.dtype == bool
    assert ((memory.ids >= 0) & (memory.ids < v)).all()
    assert np.isfinite(memory.probs).all() and (memory.probs >= 0).all() and (memory.probs <= 1).all()
    assert np.isfinite(memory.kappa).all() and (memory.kappa >= 0).all() and (memory.kappa <= 1).all()
    for t in range(v):
        row = memory.row(t)
        assert (row is None) == (not memory.filled[t])
        if row is not None:
            assert row[0] == memory.ids[t].tolist() and row[1] == memory.probs[t].tolist()


def assert_same(a: TokenMemory, b: TokenMemory) -> None:
    assert (a.method, a.k, a.vocab_size, a.fingerprint) == (b.method, b.k, b.vocab_size, b.fingerprint)
    for name in ("ids", "probs", "kappa", "filled"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    for x, y in zip(a.calibration.counts(), b.calibration.counts()):
        assert np.array_equal(x, y), "calibration"
    for order in (2, 3):
        rows = [{int(key): (ids.tolist(), p.tolist(), float(kp)) for key, ids, p, kp in zip(*t.arrays[:4]) if key >= 0}
                for t in (a.context[order], b.context[order])]  # fmt: skip
        assert rows[0] == rows[1], f"context{order}"


# -- round trip -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    return tiny_models.build("llama")


@pytest.fixture(scope="module")
def learned(llama) -> TokenMemory:
    model, tok = llama
    memory = TokenMemory(output_vocab_size(model), 8, "recap", fingerprint=tokenizer_fingerprint(tok))
    for prompt in PROMPTS:
        recap.generate(model, tok(prompt, return_tensors="pt"), max_new_tokens=24, memory=memory)
    assert memory.rows_filled > 20
    return memory


def test_round_trip(tmp_path: Path, llama, learned: TokenMemory) -> None:
    model, tok = llama
    original = learned.copy()
    path = tmp_path / "memory.safetensors"
    save_memory(original, path)
    loaded = load_memory(path, expected=model)
    assert_same(original, loaded)
    check_invariants(loaded)
    assert_same(loaded, TokenMemory.load(path, expected=tok))
    assert_same(loaded, load_memory(str(path), expected=tok))

    info = memory_info(path)
    assert info["method"] == "recap" and info["k"] == 8 and info["vocab_size"] == original.vocab_size
    assert info["rows_filled"] == original.rows_filled and info["fingerprint"] == original.fingerprint
    assert info["size_bytes"] == path.stat().st_size and info["format_version"] == FORMAT_VERSION
    assert info["created"]

    # the same drafts from the same history
    prompt_ids = tok("w3 the red w1 w2", return_tensors="pt")["input_ids"][0].tolist()
    for history in (prompt_ids, [*prompt_ids, 7, 8, 9], prompt_ids[:2]):
        trees = []
        for memory in (original, loaded):
            drafter = RecapDrafter(RecapConfig(), memory)
            drafter.begin(prompt_ids, [], None)
            trees.append(drafter.propose(history))
        for field in ("tokens", "parents", "depths", "sources"):
            assert np.array_equal(getattr(trees[0], field), getattr(trees[1], field)), field
        assert len(trees[0]) > 1

    # the same decoding: tokens and number of steps (at a fixed budget: an adaptive one follows
    # the step times measured on the machine, which differ from call to call)
    inputs = tok("w3 w4 the blue is of w7 one", return_tensors="pt")
    fixed = RecapConfig(adaptive_budget=False)
    a = recap.generate(model, inputs, max_new_tokens=24, memory=original, config=fixed)
    b = recap.generate(model, inputs, max_new_tokens=24, memory=loaded, config=fixed)
    assert a.token_ids == b.token_ids and a.stats.steps == b.stats.steps
    assert_same(original, loaded)  # and they learned the same


def test_save_overwrites_and_preserves_mode(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_memory(small_memory(rows=2), path)
    os.chmod(path, 0o640)
    memory = small_memory(rows=7)
    memory.save(path)
    assert load_memory(path).rows_filled == 7
    assert (path.stat().st_mode & 0o777) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]


def test_save_failure_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.safetensors"
    save_memory(small_memory(rows=2), path)
    before = path.read_bytes()

    def boom(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        save_memory(small_memory(rows=7), path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]  # the temporary file was removed


def test_save_refuses_invalid_memory(tmp_path: Path) -> None:
    memory = small_memory()
    memory.probs[1, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        save_memory(memory, tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()


def test_token_recycling_memory_round_trip(tmp_path: Path) -> None:
    memory = TokenMemory(30, 8, "token_recycling")
    memory.write(np.array([1, 2]), TopK(np.tile(np.arange(8), (2, 1)), np.full((2, 8), 0.1, dtype=np.float32)))
    memory.save(tmp_path / "tr.safetensors")
    loaded = TokenMemory.load(tmp_path / "tr.safetensors")
    assert_same(memory, loaded)
    assert loaded.row(1) == memory.row(1) and loaded.row(3) is None


# -- bad files ------------------------------------------------------------------------------
def expect_error(path: Path, match: str, expected: Any = None) -> None:
    with pytest.raises(MemoryFileError, match=match) as info:
        load_memory(path, expected=expected)
    assert str(path) in str(info.value)
    with pytest.raises(MemoryFileError, match=match):
        memory_info(path) if expected is None else TokenMemory.load(path, expected)


def test_missing_file(tmp_path: Path) -> None:
    expect_error(tmp_path / "nope.safetensors", "does not exist")


def test_directory(tmp_path: Path) -> None:
    expect_error(tmp_path, "not a regular file")


def test_not_safetensors(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    path.write_text("hello, I am a text file, not a memory")
    expect_error(path, "not a valid safetensors file")
    path.write_bytes(b"")
    expect_error(path, "not a valid safetensors file")
    path.write_bytes(b"\x80\x03}q\x00.")  # a pickle is never unpickled
    expect_error(path, "not a valid safetensors file")


def test_truncated(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_memory(small_memory(), path)
    data = path.read_bytes()
    for cut in (4, 8, 40, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        expect_error(path, "not a valid safetensors file .truncated or corrupted")


def test_corrupted_header_bytes(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_memory(small_memory(), path)
    data = bytearray(path.read_bytes())
    data[8] = ord("!")  # the header's opening brace
    path.write_bytes(bytes(data))
    expect_error(path, "not a valid safetensors file")


def test_trailing_garbage(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_memory(small_memory(), path)
    path.write_bytes(path.read_bytes() + b"junk")
    expect_error(path, "not a valid safetensors file")


Mutation = Callable[[dict[str, np.ndarray], dict[str, Any]], Any]


def _set(name: str, value: Any) -> Mutation:
    def mutate(tensors: dict, header: dict) -> None:
        header[name] = value

    return mutate


def _drop(name: str) -> Mutation:
    def mutate(tensors: dict, header: dict) -> None:
        del header[name]

    return mutate


def _tensor(name: str, fn: Callable[[np.ndarray], np.ndarray]) -> Mutation:
    def mutate(tensors: dict, header: dict) -> None:
        tensors[name] = fn(tensors[name].copy())

    return mutate


def _poke(name: str, value: float) -> Callable[[np.ndarray], np.ndarray]:
    def fn(a: np.ndarray) -> np.ndarray:
        a.reshape(-1)[3] = value
        return a

    return fn


BAD_HEADERS: dict[str, tuple[Mutation, str]] = {
    "no metadata": (lambda t, h: {}, "no recap header"),
    "other metadata key": (lambda t, h: {"format": "pt"}, "no recap header"),
    "header not json": (lambda t, h: {METADATA_KEY: "{not json"}, "malformed recap header .not JSON"),
    "header not object": (lambda t, h: {METADATA_KEY: "[1, 2]"}, "expected an object"),
    "wrong format": (_set("format", "llama-weights"), "not a recap memory file"),
    "no format": (_drop("format"), "not a recap memory file"),
    "version 3": (_set("format_version", 3), "unsupported format version 3"),
    "version 0": (_set("format_version", 0), "unsupported format version 0"),
    "version string": (_set("format_version", "1"), "unsupported format version '1'"),
    "unknown method": (_set("method", "medusa"), "unknown method 'medusa'"),
    "method not str": (_set("method", 3), "'method' must be a string"),
    "missing k": (_drop("k"), "'k' is missing"),
    "missing vocab_size": (_drop("vocab_size"), "'vocab_size' is missing"),
    "missing rows_filled": (_drop("rows_filled"), "'rows_filled' is missing"),
    "missing fingerprint": (_drop("fingerprint"), "'fingerprint' is missing"),
    "k as string": (_set("k", "4"), "'k' must be an integer"),
    "k as bool": (_set("k", True), "'k' must be an integer"),
    "negative rows": (_set("rows_filled", -1), "'rows_filled' must be an integer"),
    "k zero": (_set("k", 0), r"k=0, vocab_size=20; need >= 1"),
    "header k inconsistent": (_set("k", 5), r"tensor 'ids' has shape \[20, 4\], expected \[20, 5\].*inconsistent"),
    "header vocab inconsistent": (_set("vocab_size", 21), r"tensor 'ids' has shape \[20, 4\], expected \[21, 4\]"),
    "rows_filled inconsistent": (_set("rows_filled", 4), "rows_filled=4 but tensor 'filled' marks 5 rows"),
}

BAD_TENSORS: dict[str, tuple[Mutation, str]] = {
    "missing ids": (lambda t, h: t.pop("ids"), "missing tensor.s. ids"),
    "missing filled and kappa": (lambda t, h: [t.pop("filled"), t.pop("kappa")], "missing tensor.s. kappa, filled"),
    "extra tensor": (lambda t, h: t.update(weights=np.zeros(3, np.float32)), "unexpected tensor.s. weights"),
    "ids wider": (_tensor("ids", lambda a: np.zeros((20, 5), np.int32)), r"'ids' has shape \[20, 5\]"),
    "probs shorter": (_tensor("probs", lambda a: a[:19]), r"'probs' has shape \[19, 4\]"),
    "kappa 2-d": (_tensor("kappa", lambda a: a[:, None]), r"'kappa' has shape \[20, 1\]"),
    "filled scalar": (_tensor("filled", lambda a: np.array(1, np.uint8)), r"'filled' has shape \[\]"),
    "ids int64": (_tensor("ids", lambda a: a.astype(np.int64)), "'ids' has dtype I64, expected I32"),
    "ids float": (_tensor("ids", lambda a: a.astype(np.float32)), "'ids' has dtype F32, expected I32"),
    "probs float64": (_tensor("probs", lambda a: a.astype(np.float64)), "'probs' has dtype F64, expected F32"),
    "probs float16": (_tensor("probs", lambda a: a.astype(np.float16)), "'probs' has dtype F16, expected F32"),
    "kappa int": (_tensor("kappa", lambda a: a.astype(np.int32)), "'kappa' has dtype I32, expected F32"),
    "filled bool": (_tensor("filled", lambda a: a.astype(bool)), "'filled' has dtype BOOL, expected U8"),
    "id negative": (_tensor("ids", _poke("ids", -1)), r"token ids out of range \[0, 20\)"),
    "id = vocab": (_tensor("ids", _poke("ids", 20)), r"token ids out of range \[0, 20\)"),
    "prob NaN": (_tensor("probs", _poke("probs", np.nan)), "NaN or infinite probabilities"),
    "prob inf": (_tensor("probs", _poke("probs", np.inf)), "NaN or infinite probabilities"),
    "prob -inf": (_tensor("probs", _poke("probs", -np.inf)), "NaN or infinite probabilities"),
    "prob negative": (_tensor("probs", _poke("probs", -0.01)), "negative probabilities"),
    "prob above 1": (_tensor("probs", _poke("probs", 1.0001)), "probabilities above 1"),
    "kappa NaN": (_tensor("kappa", _poke("kappa", np.nan)), "NaN or infinite values in tensor 'kappa'"),
    "kappa above 1": (_tensor("kappa", _poke("kappa", 1.5)), r"out of \[0, 1\] in tensor 'kappa'"),
    "kappa negative": (_tensor("kappa", _poke("kappa", -0.5)), r"out of \[0, 1\] in tensor 'kappa'"),
    "filled 2": (_tensor("filled", _poke("filled", 2)), "other than 0 and 1 in tensor 'filled'"),
    "no calibration": (lambda t, h: t.pop("calibration_trials"), "missing tensor.s. calibration_trials"),
    "calibration shape": (_tensor("calibration_accepted", lambda a: a[:5]), r"'calibration_accepted' has shape \[5\]"),
    "calibration NaN": (_tensor("calibration_trials", _poke("t", np.nan)), "NaN or infinite calibration counts"),
    "accepted > trials": (_tensor("calibration_accepted", _poke("a", 1.0)), "calibration counts out of range"),
    "context key repeated": (_tensor("context2_keys", lambda a: np.full_like(a, a[0])), "invalid keys"),
    "context key token": (_tensor("context3_keys", lambda a: a + (20 << 42)), "invalid keys"),
    "context id": (_tensor("context2_ids", lambda a: a + 20), r"out of range \[0, 20\) in tensor 'context2_ids'"),
    "context prob": (_tensor("context3_probs", lambda a: a + 2), "out of \\[0, 1\\] in tensors 'context3_probs'"),
    "context rows": (_set("context2_rows", 3), r"'context2_keys' has shape \[2\], expected \[3\]"),
}


@pytest.mark.parametrize("case", list(BAD_HEADERS))
def test_bad_header(tmp_path: Path, case: str) -> None:
    tensors, header = parts()
    mutate, match = BAD_HEADERS[case]
    metadata = mutate(tensors, header)
    path = write(tmp_path / "bad.safetensors", tensors, header, metadata if isinstance(metadata, dict) else None)
    expect_error(path, match)


@pytest.mark.parametrize("case", list(BAD_TENSORS))
def test_bad_tensors(tmp_path: Path, case: str) -> None:
    tensors, header = parts()
    mutate, match = BAD_TENSORS[case]
    mutate(tensors, header)
    expect_error(write(tmp_path / "bad.safetensors", tensors, header), match)


def test_version_1_files_load_with_a_fresh_calibration(tmp_path: Path) -> None:
    tensors, header = parts()
    for name in [n for n in tensors if n.startswith(("calibration", "context"))]:
        del tensors[name]
    del header["context2_rows"], header["context3_rows"]
    header["format_version"] = 1
    memory = load_memory(write(tmp_path / "v1.safetensors", tensors, header))
    assert np.array_equal(memory.ids, small_memory().ids) and memory.calibration.observations == 0
    assert len(memory.context[2]) == 0
    tensors, header = parts()
    header["format_version"] = 1  # a version 1 file has no calibration tensors
    expect_error(write(tmp_path / "v1x.safetensors", tensors, header), "unexpected tensor.s. calibration_accepted")


def test_valid_crafted_file_loads(tmp_path: Path) -> None:
    """The crafting helpers themselves make a valid file (so the bad cases test one thing each)."""
    tensors, header = parts()
    memory = load_memory(write(tmp_path / "ok.safetensors", tensors, header))
    assert_same(memory, small_memory())
    check_invariants(memory)


def test_vocab_mismatch_with_model(tmp_path: Path, llama) -> None:
    model, _ = llama
    path = tmp_path / "m.safetensors"
    save_memory(small_memory(vocab=output_vocab_size(model) + 1), path)
    expect_error(path, r"vocab mismatch: the memory covers 214 tokens but LlamaForCausalLM has 213", model)


def test_fingerprint_mismatch(tmp_path: Path, llama) -> None:
    model, tok = llama
    _, processor = tiny_models.build("qwen2_5_vl")
    memory = small_memory(vocab=output_vocab_size(model))
    memory.fingerprint = tokenizer_fingerprint(tok)
    path = tmp_path / "m.safetensors"
    save_memory(memory, path)
    load_memory(path, expected=tok)
    load_memory(path, expected=model)
    expect_error(path, "tokenizer fingerprint mismatch", processor)
    expect_error(path, "tokenizer fingerprint mismatch", processor.tokenizer)
    memory.fingerprint = ""
    save_memory(memory, path)
    expect_error(path, "has no tokenizer fingerprint", tok)


def test_bad_expected_argument(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_memory(small_memory(), path)
    with pytest.raises(TypeError, match="expected must be a model, tokenizer or processor"):
        load_memory(path, expected="llama")


def test_unexpected_errors_become_memory_file_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import recap.core.persist as persist

    path = tmp_path / "m.safetensors"
    save_memory(small_memory(), path)

    def bug(*args: object) -> None:
        raise RuntimeError("a gap in the checks")

    monkeypatch.setattr(persist, "_check_values", bug)
    expect_error(path, "could not be read .RuntimeError: a gap in the checks")

    def interrupt(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(persist, "_check_values", interrupt)
    with pytest.raises(KeyboardInterrupt):
        load_memory(path)


def test_fifo_is_not_read(tmp_path: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / "fifo.safetensors"
    os.mkfifo(path)
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)  # a writer, so opening for reading does not block
    try:
        expect_error(path, "not a regular file")
    finally:
        os.close(fd)


# -- fuzzing --------------------------------------------------------------------------------
def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["int", "str", "float", "null", "bool"] + (["list", "dict"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.choice([0, 1, 2, 4, 20, -1, 10**20, rng.randint(-5, 50)])
    if kind == "str":
        return rng.choice(["", "recap", "token_recycling", FORMAT_NAME, "x" * rng.randint(0, 30), "\u00e9\u0000"])
    if kind == "float":
        return rng.choice([0.5, 1.0, -0.0, 1e308])
    if kind == "null":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "list":
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "k", "format", ""]): _random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _fuzz_case(rng: random.Random, valid: bytes) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:  # random bytes, sometimes with a plausible length prefix
        body = rng.randbytes(rng.randint(0, 200))
        if rng.random() < 0.5:
            body = rng.randint(0, 300).to_bytes(8, "little") + body
        return body
    if kind == 1:  # bit flips
        data = bytearray(valid)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == 2:  # truncation or extension
        cut = rng.randrange(len(valid) + 16)
        return valid[:cut] + (rng.randbytes(cut - len(valid)) if cut > len(valid) else b"")
    if kind == 3:  # a header field replaced by random JSON
        tensors, header = parts()
        header[rng.choice(list(header))] = _random_json(rng)
        return safetensors.numpy.save(tensors, metadata={METADATA_KEY: json.dumps(header)})
    if kind == 4:  # random metadata altogether
        tensors, _ = parts()
        value = json.dumps(_random_json(rng)) if rng.random() < 0.7 else rng.randbytes(10).hex()
        return safetensors.numpy.save(tensors, metadata={rng.choice([METADATA_KEY, "x"]): value})
    # splice: the header of one valid file onto the data of another
    other = safetensors.numpy.save(*_other_file(rng))
    n, m = int.from_bytes(valid[:8], "little"), int.from_bytes(other[:8], "little")
    return (valid[: 8 + n] + other[8 + m :]) if rng.random() < 0.5 else (other[: 8 + m] + valid[8 + n :])


def _other_file(rng: random.Random) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    tensors, header = parts(small_memory(vocab=rng.choice([19, 20, 21]), k=rng.choice([3, 4]), rows=rng.randint(0, 6)))
    return tensors, {METADATA_KEY: json.dumps(header)}


def test_fuzz_only_memory_file_errors(tmp_path: Path) -> None:
    rng = random.Random(1234)
    valid_memory = small_memory()
    path = tmp_path / "fuzz.safetensors"
    save_memory(valid_memory, path)
    valid = path.read_bytes()
    loaded = errors = 0
    start = time.perf_counter()
    for _ in range(2000):
        path.write_bytes(_fuzz_case(rng, valid))
        try:
            memory = load_memory(path)
        except MemoryFileError as e:
            assert str(path) in str(e)
            errors += 1
        else:
            check_invariants(memory)
            loaded += 1
    assert errors > 1500 and time.perf_counter() - start < 20


# -- kill during save -----------------------------------------------------------------------
CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {src!r})
    import numpy as np
    from recap import TokenMemory, save_memory
    path, vocab, k, gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    memory = TokenMemory(vocab, k)
    print("ready", flush=True)
    while True:
        gen += 1
        memory.ids[:] = gen % vocab
        memory.probs[:] = 1.0 / (gen + 1)
        memory.filled[:] = False
        memory.filled[: gen % vocab] = True
        save_memory(memory, path)
    """
)


def _generation(memory: TokenMemory) -> int:
    """The generation a complete file holds (asserts that it is one save, not a mix)."""
    gen = int(memory.ids[0, 0])
    assert (memory.ids == gen).all()
    assert (memory.probs == memory.probs[0, 0]).all()
    gen = round(1.0 / float(memory.probs[0, 0])) - 1
    assert gen % memory.vocab_size == int(memory.ids[0, 0])
    assert memory.rows_filled == gen % memory.vocab_size
    return gen


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_kill_during_save(tmp_path: Path) -> None:
    vocab, k = 200_000, 8
    path = tmp_path / "memory.safetensors"
    first = TokenMemory(vocab, k)
    first.ids[:] = 1
    first.probs[:] = 0.5
    first.filled[:1] = True
    save_memory(first, path)
    assert _generation(load_memory(path)) == 1
    rng = random.Random(7)
    last = 1
    for i in range(4):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD.format(src=SRC), str(path), str(vocab), str(k), str(1000 * (i + 1))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready", child.stderr.read()
            time.sleep(rng.uniform(0.02, 0.6))
        finally:
            child.send_signal(signal.SIGKILL)
            child.communicate()
        gen = _generation(load_memory(path))
        assert gen == last or 1000 * (i + 1) < gen  # the old content or one of the new saves, whole
        last = gen
        others = [name for name in os.listdir(tmp_path) if name != path.name]
        assert all(name.startswith(f".{path.name}.") and name.endswith(".tmp") for name in others), others
        for name in others:  # a leftover temporary file is never a valid file for the target name
            os.unlink(tmp_path / name)
    assert last > 1000  # at least one save completed


# -- fingerprints ---------------------------------------------------------------------------
def test_tokenizer_fingerprint(llama) -> None:
    model, tok = llama
    _, processor = tiny_models.build("qwen2_5_vl")
    digest = tokenizer_fingerprint(tok)
    assert re.fullmatch("[0-9a-f]{64}", digest), digest  # a sha256 hex digest
    assert tokenizer_fingerprint(tok) == digest
    grown = copy.deepcopy(tok)
    grown.add_tokens(["<recap-new-token>"])  # one more token: another vocabulary, another digest
    assert tokenizer_fingerprint(grown) != digest
    assert tokenizer_fingerprint(processor) == tokenizer_fingerprint(processor.tokenizer) != digest

    # a freshly built identical tokenizer gives the same digest; one changed token a different one
    specials = tiny_models.LLAVA_SPECIALS[:3]
    same = tiny_models._tokenizer(specials, eos_token="</s>", unk_token="<unk>", bos_token="<s>")
    assert tokenizer_fingerprint(same) == digest
    changed = tiny_models._tokenizer(["<unk>", "<s>", "</S>"], eos_token="</S>", unk_token="<unk>", bos_token="<s>")
    assert len(changed) == len(tok) and tokenizer_fingerprint(changed) != digest
    added = tiny_models._tokenizer(specials, eos_token="</s>", unk_token="<unk>", bos_token="<s>")
    added.add_tokens(["<extra>"])
    assert tokenizer_fingerprint(added) != digest

    # models: a digest of (model_type, output vocabulary)
    assert tokenizer_fingerprint(model) == tokenizer_fingerprint(model) != digest
    with pytest.raises(TypeError):
        tokenizer_fingerprint(42)


def test_fingerprint_is_stable_across_processes(llama) -> None:
    _, tok = llama
    code = textwrap.dedent(
        f"""
        import sys
        sys.path[:0] = [{SRC!r}, {str(Path(__file__).parent)!r}]
        import tiny_models
        from recap import tokenizer_fingerprint
        print(tokenizer_fingerprint(tiny_models.build("llama")[1]))
        """
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == tokenizer_fingerprint(tok)
