"""RECAP's tree mode inside vLLM (``speculative_config(tree=N)``): vLLM's own greedy output,
token for token, on both embedded models, cold and warm, one request at a time and 8
concurrent requests with images (prefills mixed with tree decodes in one batch); the same as
the chain mode's; trees with branches verified and nodes off the first chain accepted (their
K/V moved into place); each reason tree mode falls back to the chain."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here (bash scripts/setup-vllm-venv.sh)")

import recap.vllm  # noqa: E402
from recap.bench.workloads import suite_requests  # noqa: E402
from recap.config import RecapConfig  # noqa: E402
from recap.core.memory import TokenMemory  # noqa: E402
from recap.core.tree import DraftTree  # noqa: E402
from recap.drafters.recap import RecapDrafter  # noqa: E402
from recap.vllm import bench, tree_attention, tree_mode  # noqa: E402
from recap.vllm.proposer import RecapTreeProposer  # noqa: E402

MODELS = ("tiny-qwen2.5-vl", "tiny-llava-next")
LENGTHS = (24, 64, 40, 56, 32, 64, 48, 16)  # max_tokens of the 8 requests of a batch
NODES = 32


def _engine(path, method: str, **kwargs):
    before = set(map(id, recap.vllm.live_proposers()))
    llm = bench.make_llm(path, method, k=4, tree=NODES, **kwargs)
    new = [p for p in recap.vllm.live_proposers() if id(p) not in before]
    return llm, (new[0] if new else None)


@pytest.fixture(scope="module", params=MODELS)
def reference(request):
    """The model's vLLM folder, two request sets, vLLM's outputs without speculation, and the
    chain mode's outputs of the concurrent set."""
    path = recap.vllm.model_path(request.param)
    a = bench.prompts_for(path, suite_requests("all", 1, 0))
    b = bench.prompts_for(path, suite_requests("all", 1, 1))
    llm, _ = _engine(path, "none")
    refs = {"a8": bench.generate(llm, a, LENGTHS, 8), "b1": bench.generate(llm, b, LENGTHS, 1)}
    del llm
    bench._free_engine()
    llm, _ = _engine(path, "recap")
    refs["chain a8"] = bench.generate(llm, a, LENGTHS, 8)
    del llm
    bench._free_engine()
    return request.param, path, a, b, refs


def test_tree_mode_equals_vllm_greedy_and_the_chain_cold_and_warm_batch_1_and_8(reference, monkeypatch) -> None:
    name, path, a, b, refs = reference
    # a token budget below the 8 prompts' ~750 tokens: later prompts' (chunked) prefills share steps with
    # earlier requests' tree decodes, and some steps schedule only a prefix of a tree
    llm, proposer = _engine(path, "recap-tree", max_num_batched_tokens=256)
    assert isinstance(proposer, RecapTreeProposer) and proposer.trees_on, "vLLM did not create the tree proposer"
    mixed = []  # steps with tree requests and prefills of other requests in one batch
    sizes = {"cut": 0}  # trees vLLM scheduled only a prefix of (the token budget): a request with fewer nodes
    find = tree_mode._tree_requests

    def spy(runner, scheduler_output, prop):
        trees = find(runner, scheduler_output, prop)
        spec = scheduler_output.scheduled_spec_decode_tokens
        for req_id, drafts in spec.items():
            tree = prop.tree_for(req_id)
            if tree is not None:
                sizes["cut"] += len(drafts) < len(tree) - 1
        prefills = [r for r, n in scheduler_output.num_scheduled_tokens.items() if n > 1 + len(spec.get(r, ()))]
        if trees and prefills:
            mixed.append((len(trees), len(prefills)))
        return trees

    monkeypatch.setattr(tree_mode, "_tree_requests", spy)
    monkeypatch.setattr(tree_attention, "CHECK", tree_attention._Recorder())
    try:
        cold8 = bench.generate(llm, a, LENGTHS, 8)
        gaps = tree_attention.CHECK
        monkeypatch.setattr(tree_attention, "CHECK", None)
        # the torch tree attention against vLLM's CPU kernel where both compute the same rows (float32)
        assert gaps and max(gaps) < 1e-4, f"{name}: torch vs native attention differ by up to {max(gaps):.2e}"
        print(f"{name}: torch vs vLLM CPU attention on first-chain rows: max |diff| {max(gaps):.2e}")
        assert cold8 == refs["a8"], f"{name}: cold memory, 8 concurrent requests"
        assert cold8 == refs["chain a8"], f"{name}: tree mode differs from the chain mode"
        assert bench.generate(llm, b, LENGTHS, 1) == refs["b1"], f"{name}: warm memory, one request at a time"
        assert bench.generate(llm, a, LENGTHS, 8) == refs["a8"], f"{name}: warm memory, 8 concurrent requests"
        proposer.memory.clear()
        assert bench.generate(llm, b, LENGTHS, 1) == refs["b1"], f"{name}: cold memory, one request at a time"
        s = proposer.stats
        assert s.requests == 32 and s.inconsistent == 0 and s.chain_requests == 0
        assert s.tree_steps > 0 and s.tree_nodes > s.tree_steps * 4, "no trees were verified"
        assert s.branched > 0 and s.recomputed_rows > 0, "no tree with a branch was verified"
        assert s.off_chain_accepts > 0 and s.off_chain_tokens > 0, "no node off the first chain was ever accepted"
        assert s.kv_moves >= s.off_chain_tokens, "accepted off-chain nodes' K/V were not moved into place"
        assert mixed, "no step mixed prefills with tree decodes"
        assert sizes["cut"] > 0, "vLLM never scheduled only a prefix of a tree"
        assert len(proposer._drafters) <= 8 and len(proposer._trees) <= 8, "request states are not freed"
        tokens = sum(map(len, refs["a8"])) * 2 + sum(map(len, refs["b1"])) * 2
        forwards = tokens - s.accepted
        assert tokens / forwards > 1.3, f"{name}: {tokens / forwards:.2f} tokens per forward"
    finally:
        del llm
        bench._free_engine()


def test_requests_tree_mode_cannot_serve_draft_chains_with_a_reason(caplog) -> None:
    """Logprobs and penalties in a tree engine: the chain for those requests (one log line each),
    vLLM's own output for them, and trees for the greedy request beside them; a sampled request
    (served in a batch of its own: with one in the batch, vLLM's own speculation, ngram and suffix
    included, was seen to change greedy requests' outputs here) runs as a chain."""
    from vllm import SamplingParams

    path = recap.vllm.model_path("tiny-llava-next")
    prompts = bench.prompts_for(path, suite_requests("all", 1, 3))[:3]
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=40, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, max_tokens=40),
    ]
    llm, _ = _engine(path, "none")
    ref = [list(r.outputs[0].token_ids) for r in llm.generate(prompts, params, use_tqdm=False)]
    del llm
    bench._free_engine()
    llm, proposer = _engine(path, "recap-tree")
    try:
        with caplog.at_level(logging.WARNING, logger="recap.vllm"):
            out = [list(r.outputs[0].token_ids) for r in llm.generate(prompts, params, use_tqdm=False)]
            sampled = llm.generate(prompts[:1], SamplingParams(temperature=0.8, max_tokens=40, seed=7), use_tqdm=False)
        assert out == ref
        assert 0 < len(sampled[0].outputs[0].token_ids) <= 40
        assert proposer.stats.chain_requests == 3 and proposer.stats.tree_steps > 0
        lines = [r.getMessage() for r in caplog.records if "drafted as a chain" in r.getMessage()]
        assert len(lines) == 3
        assert any("logprobs" in x for x in lines) and any("penalties" in x for x in lines)
        assert any("sampling" in x for x in lines)
    finally:
        del llm
        bench._free_engine()


def test_each_request_fallback_reason() -> None:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    def reason(**kwargs):
        return tree_mode.request_fallback_reason(SamplingParams(**{"temperature": 0.0, **kwargs}))

    assert reason() is None
    assert "sampling" in reason(temperature=0.7)
    assert "logprobs" in reason(logprobs=1) and "logprobs" in reason(prompt_logprobs=1)
    for penalty in ({"presence_penalty": 0.5}, {"frequency_penalty": 0.5}, {"repetition_penalty": 1.2}):
        assert "penalties" in reason(**penalty)
    assert "bad words" in reason(bad_words=["x"])
    assert "structured output" in reason(structured_outputs=StructuredOutputsParams(choice=["a", "b"]))
    for processor in ({"min_tokens": 3}, {"logit_bias": {1: 1.0}}, {"allowed_token_ids": [1, 2]}):
        assert "logits processors" in reason(**processor)
    assert "pooling" in tree_mode.request_fallback_reason(None)


def test_each_engine_fallback_reason() -> None:
    cpu, gpu = SimpleNamespace(is_cpu=lambda: True), SimpleNamespace(is_cpu=lambda: False)
    PARALLEL = {"pipeline_parallel_size": 1, "data_parallel_size": 1}

    def config(model=None, hf=None, parallel=None, scheduler=None, cache="auto"):
        hf = SimpleNamespace(**(hf or {}))
        return SimpleNamespace(
            model_config=SimpleNamespace(hf_config=hf, hf_text_config=hf, **(model or {})),
            parallel_config=SimpleNamespace(**{**PARALLEL, **(parallel or {})}),
            scheduler_config=SimpleNamespace(**(scheduler or {"async_scheduling": False})),
            cache_config=SimpleNamespace(cache_dtype=cache),
        )

    assert tree_mode.engine_fallback_reason(config(), cpu) is None
    assert "GPU" in tree_mode.engine_fallback_reason(config(), gpu)
    assert "hybrid" in tree_mode.engine_fallback_reason(config(model={"is_hybrid": True}), cpu)
    assert "attention-free" in tree_mode.engine_fallback_reason(config(model={"is_attention_free": True}), cpu)
    assert "sliding" in tree_mode.engine_fallback_reason(config(hf={"sliding_window": 4096}), cpu)
    assert "full attention" in tree_mode.engine_fallback_reason(
        config(hf={"layer_types": ["full_attention", "linear_attention"]}), cpu
    )
    assert "parallel" in tree_mode.engine_fallback_reason(config(parallel={"pipeline_parallel_size": 2}), cpu)
    assert "parallel" in tree_mode.engine_fallback_reason(config(parallel={"data_parallel_size": 2}), cpu)
    assert "tensor" in tree_mode.engine_fallback_reason(config(parallel={"tensor_parallel_size": 2}), cpu)
    assert "async" in tree_mode.engine_fallback_reason(config(scheduler={"async_scheduling": True}), cpu)
    assert "quantized" in tree_mode.engine_fallback_reason(config(cache="fp8"), cpu)


def test_an_engine_tree_mode_cannot_serve_drafts_chains(monkeypatch, caplog) -> None:
    """The engine-level fallback in a real engine (here forced: 'GPU'): chains, vLLM's output."""
    monkeypatch.setattr(tree_mode, "engine_fallback_reason", lambda config, platform=None: "a test reason")
    path = recap.vllm.model_path("tiny-qwen2.5-vl")
    prompts = bench.prompts_for(path, suite_requests("all", 1, 4))[:3]
    llm, _ = _engine(path, "none")
    ref = bench.generate(llm, prompts, [32] * 3, 3)
    del llm
    bench._free_engine()
    with caplog.at_level(logging.WARNING, logger="recap.vllm"):
        llm, proposer = _engine(path, "recap-tree")
    try:
        assert not proposer.trees_on and proposer.tree_reason == "a test reason"
        assert any("drafts chains instead: a test reason" in r.getMessage() for r in caplog.records)
        assert bench.generate(llm, prompts, [32] * 3, 3) == ref
        assert proposer.stats.tree_steps == 0 and proposer.stats.accepted >= 0
    finally:
        del llm
        bench._free_engine()


def test_a_step_with_an_attention_feature_trees_cannot_honour_accepts_the_first_chain_only() -> None:
    assert tree_attention._unsupported(SimpleNamespace(sliding_window=128)) == "a sliding window"
    assert tree_attention._unsupported(SimpleNamespace(alibi_slopes=torch.ones(2))) == "ALiBi"
    assert tree_attention._unsupported(SimpleNamespace(logits_soft_cap=30.0)) == "a logits soft cap"
    assert tree_attention._unsupported(SimpleNamespace(sinks=torch.ones(2))) == "attention sinks"
    assert tree_attention._unsupported(SimpleNamespace(sliding_window=-1, alibi_slopes=None)) is None
    # node 2 branches off the root; argmax agrees with both node 1 and node 2's token at the root
    tree = DraftTree.from_lists([5, 6, 7, 8], [-1, 0, 0, 2])
    argmax = np.asarray([7, 1, 8, 9])
    assert tree_mode._accept_chain(tree, argmax).path == [0]
    from recap.core.accept import accept_greedy

    assert accept_greedy(tree, argmax).path == [0, 2, 3]


def test_the_kv_layout_probe_reads_back_what_the_cpu_writer_wrote() -> None:
    from vllm import _custom_ops as ops

    class Impl:
        kv_cache_dtype = "auto"

        def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
            blocks, heads, size, _ = kv_cache.shape
            key_cache, value_cache = kv_cache.view(blocks, heads, size * 2, -1).chunk(2, dim=2)
            ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, "vec", 1.0, 1.0, "auto")

    impl, layer = Impl(), SimpleNamespace(isa="vec")
    cache = torch.zeros(4, 2, 32, 2 * 32)
    slots = torch.tensor([3, 40, 41, 100, 127, 0])
    keys, values = torch.randn(6, 2, 32), torch.randn(6, 2, 32)
    impl.do_kv_cache_update(layer, keys, values, cache, slots)
    got_k, got_v = tree_attention.read_kv(impl, layer, cache, slots)
    assert torch.equal(got_k, keys) and torch.equal(got_v, values)
    step = tree_attention.TreeStep([], slot_mapping=slots, layers={0: (impl, layer, cache)})
    tree_attention.move_accepted(step, [(3, 1), (5, 2)])  # token 3 -> slot 40, token 5 -> slot 41
    got_k, _ = tree_attention.read_kv(impl, layer, cache, torch.tensor([40, 41, 3]))
    assert torch.equal(got_k[0], keys[3]) and torch.equal(got_k[1], keys[5]) and torch.equal(got_k[2], keys[0])


def test_masked_attention_is_attention_restricted_to_the_allowed_columns() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 16), torch.randn(7, 2, 16), torch.randn(7, 2, 16)
    allowed = torch.rand(3, 7) > 0.4
    allowed[:, 0] = True
    out = tree_attention.masked_attention(q, k, v, allowed, 0.25)
    for r in range(3):
        cols = allowed[r].nonzero().flatten()
        kk, vv = k[cols].repeat_interleave(2, 1), v[cols].repeat_interleave(2, 1)
        w = torch.softmax(torch.einsum("hd,lhd->hl", q[r], kk) * 0.25, -1)
        torch.testing.assert_close(out[r], torch.einsum("hl,lhd->hd", w, vv))


def test_chain_first_puts_the_best_chain_first_and_keeps_parents_first() -> None:
    drafter = RecapDrafter(RecapConfig(k=8, node_budget=8), TokenMemory(64, k=8))
    tree = DraftTree.from_lists(
        [1, 2, 3, 4, 5, 6, 7], [-1, 0, 0, 1, 2, 4, 4], probs=[1.0, 0.2, 0.7, 0.1, 0.6, 0.5, 0.3]
    )
    out = drafter.chain_first(tree, 5)
    assert out.tokens.tolist() == [1, 3, 5, 6, 2, 4]  # root, best chain 3-5-6, then the rest, cut to 5 drafts
    assert out.parents.tolist() == [-1, 0, 1, 2, 0, 4]
    assert all(out.parents[i] < i for i in range(1, len(out)))
    assert out.depths.tolist() == [0, 1, 2, 3, 1, 2]


def test_speculative_config_tree() -> None:
    assert recap.vllm.speculative_config(tree=32) == {
        "method": "custom_class", "model": recap.vllm.TREE_PROPOSER, "num_speculative_tokens": 32,
    }  # fmt: skip
    for bad in (0, 129, 2.5):
        with pytest.raises(ValueError, match="tree must be"):
            recap.vllm.speculative_config(tree=bad)
