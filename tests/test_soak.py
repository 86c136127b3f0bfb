"""A long-running server's memory: bounded kept rows that age instead of starting afresh (a CI-sized
soak of ``recap.bench.soak``), the budget's checks, and a memory file that keeps rows' recency."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors
import safetensors.numpy

import recap
from recap import RecapConfig, TokenMemory
from recap.bench.soak import soak
from recap.core.topk import TopK
from recap.drafters.recap import RecapDrafter


def test_a_stream_of_requests_on_a_small_budget_keeps_its_speed() -> None:
    model, processor = recap.zoo.load("tiny-qwen2.5-vl")
    config = RecapConfig(adaptive_budget=False, node_budget=31)  # fixed trees: tokens per forward are deterministic
    report = soak(
        model, processor, requests=80, budget_rows=512, max_new_tokens=24, window=20, check_every=8, config=config
    )
    s = report["summary"]
    assert s["checked_against_generate"] == 10 and s["mismatches"] == []  # lossless all along
    assert s["most_rows_in_a_table"] <= s["table_budget_rows"] == 256  # never above the budget
    assert s["evictions"] > 50  # eviction happened many times
    assert s["last_vs_best"] >= 0.9  # no cliff: the last window keeps the best window's speed
    assert s["around_evictions"]["mean_after_vs_before"] >= 0.95


def test_the_budget_is_checked_and_says_what_to_do() -> None:
    for bad in (0, 511, 1.5e6, "4096", True):
        with pytest.raises(ValueError, match="max_context_rows=.*at least 512 rows.*persistent_context=False"):
            TokenMemory(100, 4, max_context_rows=bad)
    memory = TokenMemory(100, 8, max_context_rows=512)
    assert memory.context_rows == 0 and memory.context_budget_nbytes == 2 * 512 * (28 + 8 * 8)
    assert TokenMemory.context_rows_for_bytes(memory.context_budget_nbytes, 8) == 512
    with pytest.raises(ValueError, match="writes up to 205 rows.*max_context_rows >= 820"):  # 200 + 1 + 4 a step
        RecapDrafter(RecapConfig(node_budget=200), memory)
    RecapDrafter(RecapConfig(), memory)  # 68 rows a step fit in 256 a table


def test_a_memory_file_keeps_the_budget_and_the_rows_recency(tmp_path) -> None:
    rng = np.random.default_rng(0)
    memory = TokenMemory(50, 4, max_context_rows=1024)
    table = memory.context[3]
    keys = [(a, b, c) for a in range(8) for b in range(8) for c in range(8)][:400]
    probs = rng.dirichlet(np.ones(5), size=len(keys))[:, :4].astype(np.float32)
    rows = list(zip(rng.integers(0, 50, (len(keys), 4)).tolist(), probs.tolist(), [0.5] * len(keys)))
    for used, (key, row) in enumerate(zip(keys, rows), start=1):  # key i last used at time i
        table.write_many([key], [row], stamp=1, used=used)
    path = tmp_path / "mem.safetensors"
    memory.save(path)
    assert recap.memory_info(path)["max_context_rows"] == 1024
    back = TokenMemory.load(path)
    assert back.max_context_rows == 1024 and len(back.context[3]) == 400
    small = TokenMemory.load(path, max_context_rows=512)  # 256 a table: the most recently used stay
    assert len(small.context[3]) == 256
    assert all(small.context[3].get(key) is not None for key in keys[-256:])
    assert all(small.context[3].get(key) is None for key in keys[:-256])
    # a bad budget in a file is a bad file
    tensors = safetensors.numpy.load_file(str(path))
    raw = json.loads(safetensors.safe_open(str(path), "np").metadata()["recap"])
    safetensors.numpy.save_file(tensors, str(path), metadata={"recap": json.dumps({**raw, "max_context_rows": 3})})
    with pytest.raises(recap.MemoryFileError, match="'max_context_rows' must be an integer >= 512, got 3"):
        TokenMemory.load(path)
    # and they keep aging in that order: the next eviction takes the oldest of them first
    small.context[3].write_many([(9, 9, 9)], [rows[0]], stamp=2, used=small.clock + 1)
    assert small.context[3].get(keys[-256]) is None and small.context[3].get(keys[-1]) is not None


def test_rows_of_a_request_under_way_are_evicted_last() -> None:
    memory = TokenMemory(50, 4, max_context_rows=512)
    table = memory.context[2]
    ids, probs = np.zeros((256, 4), np.int64), np.full((256, 4), 0.2, np.float32)
    stamp = memory.new_stamp()
    own = np.asarray([table.pack((1, t)) for t in range(40)])
    table.write_packed(own, np.arange(40), TopK(ids[:40], probs[:40]), stamp=stamp, used=0)  # oldest
    other = np.asarray([table.pack((2, t)) for t in range(50)])
    for used in range(1, 10):  # newer rows of other requests fill the table many times over
        table.write_packed(other + used * 100, np.arange(50), TopK(ids[:50], probs[:50]), stamp=0, used=used)
    assert table.evictions > 0 and all(table.get((1, t)) is not None for t in range(40))
    memory.release_stamp(stamp)  # the request ended: its rows age like any other
    table.write_packed(other + 5000, np.arange(50), TopK(ids[:50], probs[:50]), stamp=0, used=99)
    table.write_packed(other + 9000, np.arange(50), TopK(ids[:50], probs[:50]), stamp=0, used=99)
    assert all(table.get((1, t)) is None for t in range(40))
