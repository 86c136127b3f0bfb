"""RECAP inside vLLM gives vLLM's own greedy output, token for token, on both embedded models:
cold and warm memory, one request at a time and 8 concurrent requests of different lengths
(rows move in vLLM's batch as requests finish). The logits tap sees rejected drafts' rows, and
those rows are the target's real predictions."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here (bash scripts/setup-vllm-venv.sh)")

import recap.vllm  # noqa: E402
from recap import zoo  # noqa: E402
from recap.bench.workloads import Request, suite_requests  # noqa: E402
from recap.core.memory import TokenMemory  # noqa: E402
from recap.vllm import bench  # noqa: E402
from recap.vllm.proposer import RecapProposer  # noqa: E402

MODELS = ("tiny-qwen2.5-vl", "tiny-llava-next")
LENGTHS = (24, 64, 40, 56, 32, 64, 48, 16)  # max_tokens of the 8 requests of a batch


def _engine(path, method: str):
    before = set(map(id, recap.vllm.live_proposers()))
    llm = bench.make_llm(path, method, k=4)
    new = [p for p in recap.vllm.live_proposers() if id(p) not in before]
    return llm, (new[0] if new else None)


@pytest.fixture(scope="module", params=MODELS)
def reference(request):
    """The model's vLLM folder, the two request sets, and vLLM's outputs without speculation."""
    path = recap.vllm.model_path(request.param)
    a = bench.prompts_for(path, suite_requests("all", 1, 0))
    b = bench.prompts_for(path, suite_requests("all", 1, 1))
    llm, _ = _engine(path, "none")
    refs = {"a8": bench.generate(llm, a, LENGTHS, 8), "b1": bench.generate(llm, b, LENGTHS, 1)}
    del llm
    bench._free_engine()
    return request.param, path, a, b, refs


def test_recap_equals_vllm_greedy_cold_and_warm_batch_1_and_8(reference) -> None:
    name, path, a, b, refs = reference
    llm, proposer = _engine(path, "recap")
    assert isinstance(proposer, RecapProposer), "vLLM did not create recap's proposer"
    places: dict[str, set[int]] = {}  # the batch rows each request was seen in
    tap = proposer.recap_tap

    def spy(runner, logits, metadata):
        for i, req_id in enumerate(runner.input_batch.req_ids[: runner.input_batch.num_reqs]):
            places.setdefault(req_id, set()).add(i)
        tap(runner, logits, metadata)

    proposer.recap_tap = spy
    try:
        assert bench.generate(llm, a, LENGTHS, 8) == refs["a8"], f"{name}: cold memory, 8 concurrent requests"
        assert bench.generate(llm, b, LENGTHS, 1) == refs["b1"], f"{name}: warm memory, one request at a time"
        counters = bench.spec_counters(llm)
        assert bench.generate(llm, a, LENGTHS, 8) == refs["a8"], f"{name}: warm memory, 8 concurrent requests"
        warm = {key: bench.spec_counters(llm)[key] - counters[key] for key in bench.COUNTERS}
        proposer.memory.clear()
        assert bench.generate(llm, b, LENGTHS, 1) == refs["b1"], f"{name}: cold memory, one request at a time"
        stats = proposer.stats
        assert stats.requests == 32 and stats.inconsistent == 0
        assert stats.accepted > 0 and warm["num_accepted_tokens"] > 0, "RECAP never drafted a token vLLM accepted"
        assert stats.rejected_rows > 0, "the tap saw no rejected draft's row"
        assert len(proposer._drafters) <= 8, "request states are not freed when requests finish"
        assert any(len(rows) > 1 for rows in places.values()), "no request moved between batch rows"
    finally:
        del llm
        bench._free_engine()


def test_the_tap_reads_the_targets_predictions_at_rejected_drafts() -> None:
    """Rows of rejected drafts hold the target's top-k after those drafts: checked against the
    same model in transformers on a text-only request."""
    path = recap.vllm.model_path("tiny-qwen2.5-vl")
    text_only = [Request(r.id, r.family, r.prompt, None) for r in suite_requests("all", 1, 0)]
    prompts = bench.prompts_for(path, text_only)
    llm, proposer = _engine(path, "recap")
    seen: list[tuple[list[int], np.ndarray, np.ndarray, int]] = []
    learn = proposer._learn

    def spy(drafter, rows, sampled, before):
        accepted = len(sampled) - 1
        for j in range(accepted + 1, len(rows.tokens)):  # rows of rejected drafts
            seen.append(([*before.tolist(), *rows.tokens[1 : j + 1].tolist()], rows.ids[j], rows.probs[j], j))
        learn(drafter, rows, sampled, before)

    proposer._learn = spy
    try:
        for _ in range(2):  # the second pass drafts from a warm memory
            bench.generate(llm, prompts, [96] * len(prompts), 8)
    finally:
        del llm
        bench._free_engine()
    assert seen, "no draft was rejected: the test lost its power"
    model, _ = zoo.load("tiny-qwen2.5-vl")
    for context, ids, probs, _ in seen[:: max(1, len(seen) // 6)]:
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([context])).logits[0, -1]
        expected = torch.softmax(logits.float(), -1).topk(len(ids))
        assert int(ids[0]) == int(expected.indices[0]), "a rejected row's top-1 is not the target's prediction there"
        np.testing.assert_allclose(probs[0], float(expected.values[0]), rtol=1e-3, atol=1e-5)


def test_a_memory_file_warms_a_new_engine(tmp_path, monkeypatch) -> None:
    """RECAP_VLLM_MEMORY: a memory saved from one engine starts the next one warm."""
    path = recap.vllm.model_path("tiny-qwen2.5-vl")
    prompts = bench.prompts_for(path, suite_requests("all", 1, 2))
    llm, proposer = _engine(path, "recap")
    try:
        first = bench.generate(llm, prompts, LENGTHS, 8)
        proposer.memory.save(tmp_path / "memory.safetensors")
        rows = proposer.memory.rows_filled
    finally:
        del llm
        bench._free_engine()
    monkeypatch.setenv("RECAP_VLLM_MEMORY", str(tmp_path / "memory.safetensors"))
    llm, proposer = _engine(path, "recap")
    try:
        assert rows > 0 and proposer.memory.rows_filled == rows
        before = bench.spec_counters(llm)["num_accepted_tokens"]
        assert bench.generate(llm, prompts, LENGTHS, 8) == first
        assert bench.spec_counters(llm)["num_accepted_tokens"] > before
    finally:
        del llm
        bench._free_engine()


def test_a_server_snapshot_restarts_warm_and_a_damaged_one_starts_cold(tmp_path, monkeypatch) -> None:
    """RECAP_VLLM_SNAPSHOT: a damaged file is moved aside and the engine starts cold (never fails);
    the engine saves its memory there (here after every step, in the background); the next engine
    starts from it, warm, with the same output."""
    path = recap.vllm.model_path("tiny-qwen2.5-vl")
    prompts = bench.prompts_for(path, suite_requests("all", 1, 3))
    snapshot = tmp_path / "server.safetensors"
    snapshot.write_bytes(b"not a memory file")
    monkeypatch.setenv("RECAP_VLLM_SNAPSHOT", str(snapshot))
    monkeypatch.setenv("RECAP_VLLM_SNAPSHOT_SECONDS", "0")
    llm, proposer = _engine(path, "recap")
    try:
        assert (tmp_path / "server.safetensors.bad").read_bytes() == b"not a memory file"
        assert proposer.memory.rows_filled == 0  # cold
        first = bench.generate(llm, prompts, LENGTHS, 8)
        cold = bench.spec_counters(llm)["num_accepted_tokens"]
        assert proposer.snapshots.saves >= 1  # the periodic snapshots ran
        proposer.snapshots.save(proposer.memory)  # the last one, as at exit
        rows = proposer.memory.rows_filled
    finally:
        del llm
        bench._free_engine()
    llm, proposer = _engine(path, "recap")
    try:
        assert rows > 0 and proposer.memory.rows_filled == rows  # restarted from the snapshot
        assert bench.generate(llm, prompts, LENGTHS, 8) == first
        assert bench.spec_counters(llm)["num_accepted_tokens"] > cold  # warm from the first request
    finally:
        del llm
        bench._free_engine()


def test_the_snapshot_is_saved_when_the_engine_shuts_down(tmp_path, monkeypatch) -> None:
    """An engine freed before its process ends (no periodic snapshot due yet) saves its memory as it
    goes: the file holds the memory's last state (it was not saved when only a process exit did it)."""
    path = recap.vllm.model_path("tiny-qwen2.5-vl")
    snapshot = tmp_path / "server.safetensors"
    monkeypatch.setenv("RECAP_VLLM_SNAPSHOT", str(snapshot))
    monkeypatch.delenv("RECAP_VLLM_SNAPSHOT_SECONDS", raising=False)  # every 300 s: none in this test
    before = set(map(id, recap.vllm.live_proposers()))
    # the engine is made here, not in ``_engine``: the first engine of a process is made while vLLM imports, and
    # frames of that import stay referenced (with their callers' frames), so a helper's local would keep it
    llm = bench.make_llm(path, "recap", k=4)
    proposer = next(p for p in recap.vllm.live_proposers() if id(p) not in before)
    try:
        bench.generate(llm, bench.prompts_for(path, suite_requests("all", 1, 6)), LENGTHS, 8)
        last = proposer.memory.snapshot()
        saved_before = (proposer.snapshots.saves, snapshot.exists())  # not asserted here: that keeps `proposer`
        gone = weakref.ref(proposer)
    finally:
        del llm, proposer
        bench._free_engine()
    assert saved_before == (0, False)
    assert gone() is None, "the engine's proposer outlived the engine"
    saved = TokenMemory.load(snapshot).snapshot()
    assert last["filled"].sum() > 0 and saved.keys() == last.keys()
    for name, array in last.items():
        np.testing.assert_array_equal(saved[name], array, err_msg=name)


def test_a_server_restarted_from_its_snapshot_drafts_as_the_one_kept_running(tmp_path) -> None:
    """issue #31 on a small set (``recap.vllm.restart_bench``): after a warm-up stream, the engine
    kept running (a) and one restarted from the snapshot taken then (b) serve the next requests with
    the same tokens per forward (within 5%; here the same counters), more than a cold restart (c);
    one from a damaged snapshot (d) starts cold with one warning line; every output vLLM's own."""
    from recap.vllm import restart_bench

    path = recap.vllm.model_path("tiny-qwen2.5-vl")
    warmup = bench.prompts_for(path, suite_requests("all", 1, 4))
    measured = bench.prompts_for(path, suite_requests("all", 1, 5))
    lengths = (LENGTHS, LENGTHS)
    reference = restart_bench.reference_outputs(path, warmup, measured, lengths, 8)
    r = restart_bench.run_mode(path, "chain", 8, 4, 32, warmup, measured, lengths, reference, tmp_path)
    assert [r[key]["match"] for key in ("warmup", "a", "b", "c")] == [1.0] * 4 and r["b_equals_a"]
    rows, context_rows = r["snapshot"]["rows"], r["snapshot"]["context_rows"]
    assert rows > 0 and r["snapshot"]["restored"] == [rows, context_rows] and r["snapshot"]["saves_in_a"] == 1
    assert 0.95 <= r["b_over_a"] <= 1.05
    assert r["b_counts_equal_a"], "the restarted engine drafted differently: the snapshot lost some of A's state"
    assert r["c"]["tokens_per_forward"] < r["a"]["tokens_per_forward"], "the warm-up taught nothing: no power"
    damaged = r["damaged"]  # D: the snapshot cut in half starts cold, as C, with one line saying so
    assert r["d"]["match"] == 1.0 and damaged["cold_start"] and damaged["moved_aside"] and damaged["d_counts_equal_c"]
    assert [line for line in damaged["warnings"] if "snapshot" in line] == damaged["warnings"]
    assert len(damaged["warnings"]) == 1 and "started with a fresh memory" in damaged["warnings"][0]


def test_the_proposer_refuses_a_vllm_version_the_tap_was_not_checked_against(monkeypatch) -> None:
    from vllm.engine.arg_utils import EngineArgs

    from recap.vllm import tap

    path = recap.vllm.model_path("tiny-qwen2.5-vl")
    config = EngineArgs(
        model=str(path), dtype="float32", max_model_len=2048, speculative_config=recap.vllm.speculative_config(k=4)
    ).create_engine_config()
    assert RecapProposer(config).k == 4
    monkeypatch.setattr(tap, "installed_version", lambda: "0.33.1")
    with pytest.raises(tap.UnsupportedVLLMError, match=r"vLLM 0\.33\.1 is installed.*ngram, suffix"):
        RecapProposer(config)
