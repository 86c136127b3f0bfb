"""One TokenMemory shared by threads: exact outputs, no torn rows, consistent snapshots."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tiny_models
import torch
from PIL import Image

import recap
from recap import TokenMemory, load_memory, save_memory
from recap.backends.hf import output_vocab_size
from recap.core.topk import TopK, row_concentration

THREADS, REQUESTS, NEW_TOKENS = 4, 10, 16
SIZES = [(56, 56), (112, 112), (56, 112), (84, 56)]


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _inputs(arch: str, processor, thread: int, request: int) -> dict[str, torch.Tensor]:
    words = " ".join(f"w{(7 * thread + 3 * request + j) % 50}" for j in range(3 + request % 4))
    if arch == "llama":
        return dict(processor(f"the red {words} is of the blue {words}", return_tensors="pt"))
    rng = np.random.default_rng(100 * thread + request)
    size = SIZES[(thread + request) % len(SIZES)]  # grids differ, and so do the M-RoPE deltas
    image = Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"what is {words}"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    return dict(processor(text=[text], images=[image], return_tensors="pt"))


@pytest.mark.parametrize("arch", ["llama", "qwen2_5_vl"])
def test_shared_memory_threads_match_greedy(arch: str, tmp_path: Path) -> None:
    model, processor = tiny_models.build(arch)
    requests = [[_inputs(arch, processor, t, r) for r in range(REQUESTS)] for t in range(THREADS)]
    with torch.inference_mode():
        expected = [
            [
                model.generate(**x, do_sample=False, max_new_tokens=NEW_TOKENS)[0, x["input_ids"].shape[1] :].tolist()
                for x in per_thread
            ]
            for per_thread in requests
        ]
    memory = TokenMemory(output_vocab_size(model), 8, "recap")
    start = threading.Barrier(THREADS + 1)
    done = threading.Event()

    def worker(t: int) -> list[list[int]]:
        start.wait()
        return [recap.generate(model, x, max_new_tokens=NEW_TOKENS, memory=memory).token_ids for x in requests[t]]

    def saver() -> int:
        """Saves the memory while it is being written; every file must load."""
        start.wait()
        saves = 0
        while not done.is_set() or saves == 0:
            path = tmp_path / f"m{saves % 2}.safetensors"
            save_memory(memory, path)
            assert load_memory(path, expected=model).rows_filled <= memory.rows_filled
            saves += 1
        return saves

    with ThreadPoolExecutor(THREADS + 1) as pool:
        futures = [pool.submit(worker, t) for t in range(THREADS)]
        saving = pool.submit(saver)
        try:
            outputs = [f.result(timeout=120) for f in futures]
        finally:
            done.set()
        assert saving.result(timeout=60) > 0
    for t in range(THREADS):
        for r in range(REQUESTS):
            assert outputs[t][r] == expected[t][r], (arch, t, r)
    assert memory.rows_filled > 0


VOCAB, KEYS, K = 1000, 64, 8  # rows keyed by the first KEYS tokens; ids anywhere in the vocabulary


def _topk(values: np.ndarray) -> TopK:
    """Rows whose ids are all v and whose probabilities are all v / 1e6."""
    ids = np.repeat(values[:, None], K, axis=1)
    return TopK(ids, (ids / 1e6).astype(np.float32))


def _consistent(ids: list[int], probs: list[float], kappa: float) -> None:
    v = ids[0]
    assert ids == [v] * K, ids
    assert probs == [float(np.float32(v / 1e6))] * K, (ids, probs)
    assert kappa == float(row_concentration(np.asarray([probs], dtype=np.float32))[0]), (ids, kappa)


def test_no_torn_rows(tmp_path: Path) -> None:
    memory = TokenMemory(VOCAB, K, "recap")
    stop = threading.Event()
    barrier = threading.Barrier(5)
    deadline = time.monotonic() + 30

    def writer(seed: int) -> int:
        rng = np.random.default_rng(seed)
        barrier.wait()
        writes = 0
        while not stop.is_set() and time.monotonic() < deadline:
            keys = rng.choice(KEYS, size=rng.integers(1, 16), replace=False)
            memory.write(keys, _topk(rng.integers(1, VOCAB, size=len(keys))))
            writes += 1
        return writes

    def reader(seed: int) -> int:
        """Reads until it has checked 3000 written rows (each also through the arrays)."""
        rng = np.random.default_rng(seed)
        barrier.wait()
        reads = 0
        while reads < 3000 and time.monotonic() < deadline:
            token = int(rng.integers(KEYS))
            row = memory.row(token)
            if row is not None:
                _consistent(*row)
                reads += 1
            with memory.lock:  # the arrays, read under the lock, agree too
                if memory.filled[token]:
                    _consistent(memory.ids[token].tolist(), memory.probs[token].tolist(), float(memory.kappa[token]))
        return reads

    def saver() -> int:
        barrier.wait()
        for i in range(10):
            path = tmp_path / f"s{i}.safetensors"
            save_memory(memory, path)
            loaded = load_memory(path)
            for token in np.nonzero(loaded.filled)[0]:
                _consistent(*loaded.row(int(token)))
        return 10

    with ThreadPoolExecutor(5) as pool:
        writers = [pool.submit(writer, s) for s in (1, 2)]
        others = [pool.submit(reader, 3), pool.submit(reader, 4), pool.submit(saver)]
        try:
            counts = [f.result(timeout=60) for f in others]
        finally:
            stop.set()
        writes = [f.result(timeout=60) for f in writers]
    assert counts[:2] == [3000, 3000] and min(writes) > 0
