"""Tree verification for the RECAP proposer inside vLLM 0.32 (opt-in: ``speculative_config(tree=N)``).

vLLM verifies one chain per request. Tree mode keeps vLLM's shapes and changes what the
speculative slots mean: a request's ``N`` draft slots hold RECAP's best-first tree in
topological order, best chain first (``RecapDrafter.chain_first``), and the runner is taught
to verify it. The patches, all installed here by ``install()`` (each logged once, refused on a
vLLM outside ``tap.SUPPORTED``):

1. ``GPUModelRunner._preprocess`` (after it, before the forward): each tree node's position
   becomes ``root + depth`` instead of ``root + slot`` (``positions``, and all three M-RoPE
   rows, which for text advance together). The slots (``slot_mapping``) stay one per node.
   It also publishes the step's trees (``tree_attention.STEP``) for the attention backend.
2. ``AttentionBackendEnum.CPU_ATTN`` -> ``tree_attention.RecapTreeCPUBackend``: the native
   kernel for every row, then the off-chain rows again with their ancestor mask.
3. ``GPUModelRunner._sample`` (after the tap and vLLM's own sampling): greedy tree acceptance
   for the tree requests (a node is accepted when its token is the argmax of its parent's row
   and its parent is accepted; the deepest path, the first in node order on a tie), written
   into vLLM's ``[requests, 1 + N]`` output padded with -1, so the scheduler's
   ``num_computed_tokens -= rejected`` stays right. Then the accepted path's K/V is moved
   into slots ``1..d`` of the block (``tree_attention.move_accepted``), unless already there.

What tree mode cannot serve exactly falls back to the chain, with one log line saying why:
per request (``request_fallback_reason``): sampling, logprobs, penalties, bad words,
structured output, logits processors (min_tokens, logit bias, allowed tokens); per engine
(``engine_fallback_reason``): a GPU (until the GPU tests have passed on one), hybrid or
windowed layers, pipeline, data or (until tested) tensor parallelism, async scheduling, a
quantized KV cache.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np
import torch

from ..core.accept import accept_greedy
from ..core.tree import DraftTree
from . import tap, tree_attention

logger = logging.getLogger("recap.vllm")

BACKEND = "recap.vllm.tree_attention.RecapTreeCPUBackend"
GPU_TESTED = False  # set True once tests/in_vllm/test_tree_gpu.py has passed on a GPU
_installed = False


# -- what tree mode cannot serve ------------------------------------------------------------
def engine_fallback_reason(vllm_config: Any, platform: Any = None) -> str | None:
    """Why this engine cannot verify trees (it runs RECAP's chain instead), or None."""
    if platform is None:
        from vllm.platforms import current_platform as platform
    if not platform.is_cpu():
        if not GPU_TESTED:
            return (
                "tree mode on a GPU is written (FlashAttention in two passes) but its tests have not passed on a "
                "GPU yet (tests/in_vllm/test_tree_gpu.py)"
            )
        return "only the CPU attention backend is wired for trees in this version"
    model = vllm_config.model_config
    hf = getattr(model, "hf_text_config", None) or model.hf_config
    if getattr(model, "is_hybrid", False) or getattr(model, "has_noops", False):
        return "hybrid (Mamba / linear-attention) layers keep a recurrent state a tree cannot branch"
    if getattr(model, "is_attention_free", False):
        return "an attention-free model"
    if getattr(hf, "sliding_window", None) and getattr(hf, "use_sliding_window", True):
        return "sliding-window layers"
    if any(t != "full_attention" for t in getattr(hf, "layer_types", None) or []):
        return "layers other than full attention"
    parallel = vllm_config.parallel_config
    if parallel.pipeline_parallel_size > 1 or parallel.data_parallel_size > 1:
        return "pipeline or data parallelism"
    if getattr(parallel, "tensor_parallel_size", 1) > 1:
        return (
            "tensor parallelism is not tested yet (every rank must move the accepted path's KV, and on some "
            "platforms only rank 0 sees the logits)"
        )
    if getattr(vllm_config.scheduler_config, "async_scheduling", False):
        return "async scheduling (the tree's acceptance must be known before the next step is scheduled)"
    if str(vllm_config.cache_config.cache_dtype) != "auto":
        return f"a quantized KV cache ({vllm_config.cache_config.cache_dtype})"
    return None


def request_fallback_reason(params: Any) -> str | None:
    """Why this request is drafted as a chain in a tree engine (``SamplingParams``), or None."""
    if params is None:
        return "no sampling parameters (a pooling request)"
    if params.temperature >= 1e-5:
        return f"sampling (temperature {params.temperature:g}): tree acceptance here is greedy"
    if params.logprobs is not None or params.prompt_logprobs is not None or getattr(params, "logprob_token_ids", None):
        return "logprobs (vLLM reports them per verified row, which a tree's rows are not)"
    if params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0:
        return "penalties (vLLM would count the tree's nodes as the history)"
    if params.bad_words or getattr(params, "_bad_words_token_ids", None):
        return "bad words (vLLM would match them along the tree's slots)"
    if params.structured_outputs is not None:
        return "structured output (the grammar advances along one chain)"
    if params.min_tokens or params.logit_bias or params.allowed_token_ids:
        return "logits processors (min_tokens, logit bias or allowed tokens)"
    if getattr(params, "thinking_token_budget", None) is not None or getattr(params, "watermarking", None):
        return "a thinking budget or watermarking"
    return None


# -- the runner patches ---------------------------------------------------------------------
def _tree_requests(runner: Any, scheduler_output: Any, proposer: Any) -> list[tree_attention.TreeRequest]:
    """The step's tree requests: those whose scheduled drafts are (a prefix of) the tree proposed."""
    out = []
    spec = scheduler_output.scheduled_spec_decode_tokens
    if not spec:
        return out
    batch = runner.input_batch
    starts = runner.query_start_loc.np
    for req_id, drafts in spec.items():
        tree = proposer.tree_for(req_id)
        n = len(drafts)
        if tree is None or n == 0 or n >= len(tree) or list(tree.tokens[1 : n + 1]) != list(drafts):
            continue  # not the tree proposed (e.g. vLLM's -1 padding): verified as the chain it is
        parents = tree.parents[: n + 1]
        depths = tree.depths[: n + 1]
        chain = parents == np.arange(-1, n)
        first_off = int(np.argmin(chain)) if not chain.all() else n + 1
        row = batch.req_id_to_index[req_id]
        mask = torch.from_numpy(DraftTree(tree.tokens[: n + 1], parents, depths, tree.sources[: n + 1]).ancestor_mask())
        out.append(
            tree_attention.TreeRequest(
                req_id=req_id, row=row, start=int(starts[row + 1]) - (n + 1), parents=parents, depths=depths,
                mask=mask, off_chain=torch.arange(first_off, n + 1, dtype=torch.int64),
            )
        )  # fmt: skip
    return out


def _set_positions(runner: Any, requests: list[tree_attention.TreeRequest]) -> None:
    """Node ``i`` of a block at ``root + depth(i)`` (vLLM put it at ``root + i``)."""
    for tree in requests:
        shift = np.arange(tree.size) - tree.depths
        if not shift.any():
            continue
        index = torch.arange(tree.start, tree.start + tree.size)
        delta = torch.from_numpy(shift).to(torch.int64)
        runner.positions[index] -= delta.to(runner.positions.device, runner.positions.dtype)
        if runner.uses_mrope:
            mrope = runner.mrope_positions.gpu
            mrope[:, index] -= delta.to(mrope.device, mrope.dtype)


def _accept(runner: Any, logits: torch.Tensor, metadata: Any, output: Any, step: tree_attention.TreeStep) -> None:
    """Greedy tree acceptance for the step's trees, into ``output.sampled_token_ids``; the
    accepted paths' K/V moved into place; each path handed to the proposer."""
    proposer = runner.drafter
    first_row = np.concatenate([[0], np.cumsum(np.asarray(metadata.num_draft_tokens) + 1)])
    sampled = output.sampled_token_ids
    moves: list[tuple[int, int]] = []
    for tree in step.requests:
        rows = logits[first_row[tree.row] : first_row[tree.row] + tree.size]
        argmax = rows.argmax(dim=-1).cpu().numpy()
        proposed = proposer.tree_for(tree.req_id)
        node_tree = DraftTree(
            tokens=np.asarray(proposed.tokens[: tree.size], dtype=np.int64),
            parents=np.asarray(tree.parents, dtype=np.int64),
            depths=np.asarray(tree.depths, dtype=np.int64),
            sources=np.zeros(tree.size, dtype=np.int8),
        )
        # a broken step (an attention feature the tree rows cannot honour): the first chain only
        acceptance = _accept_chain(node_tree, argmax) if step.broken else accept_greedy(node_tree, argmax)
        path = acceptance.path
        tokens = [int(t) for t in node_tree.tokens[path[1:]]] + [acceptance.bonus]
        row = sampled[tree.row]
        row.fill_(-1)
        row[: len(tokens)] = torch.tensor(tokens, dtype=row.dtype, device=row.device)
        moves += [(tree.start + node, tree.start + i) for i, node in enumerate(path) if node != i]
        proposer.verified(tree.req_id, node_tree, path, argmax)
    tree_attention.move_accepted(step, moves)
    proposer.tree_stats(step, moves)
    if step.broken:
        proposer.disable_trees(step.broken)


def _accept_chain(tree: DraftTree, argmax: np.ndarray):
    from ..core.accept import Acceptance

    last = 0
    for i in range(1, len(tree)):
        if tree.parents[i] != i - 1 or tree.tokens[i] != argmax[i - 1]:
            break
        last = i
    return Acceptance(path=list(range(last + 1)), bonus=int(argmax[last]))


def install() -> None:
    """Install the tree-mode patches once (idempotent; refuses unsupported vLLM versions)."""
    global _installed
    tap.install()  # the version gate, and the logits tap the drafter learns from
    if _installed:
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    version = tap.installed_version()
    preprocess = GPUModelRunner._preprocess

    @functools.wraps(preprocess)
    def _preprocess(self, scheduler_output, *args, **kwargs):
        result = preprocess(self, scheduler_output, *args, **kwargs)
        tree_attention.STEP = None
        proposer = getattr(self, "drafter", None)
        if getattr(proposer, "tree_nodes", 0) and proposer.tree_reason is None:
            requests = _tree_requests(self, scheduler_output, proposer)
            if requests:
                _set_positions(self, requests)
                tree_attention.STEP = tree_attention.TreeStep(requests)
        return result

    GPUModelRunner._preprocess = _preprocess
    logger.warning(
        "recap.vllm tree mode: wrapped GPUModelRunner._preprocess (vLLM %s): tree nodes take position root + depth",
        version,
    )
    sample = GPUModelRunner._sample

    @functools.wraps(sample)
    def _sample_tree(self, logits, spec_decode_metadata):
        output = sample(self, logits, spec_decode_metadata)
        step, tree_attention.STEP = tree_attention.STEP, None
        if step is not None and spec_decode_metadata is not None and logits is not None:
            _accept(self, logits, spec_decode_metadata, output, step)
        return output

    GPUModelRunner._sample = _sample_tree
    logger.warning(
        "recap.vllm tree mode: wrapped GPUModelRunner._sample (vLLM %s): greedy tree acceptance and the accepted "
        "path's KV moved into place, for tree requests only",
        version,
    )
    register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND)
    from vllm.v1.attention import selector

    selector._cached_get_attn_backend.cache_clear()  # an engine started before may have cached the class
    logger.warning(
        "recap.vllm tree mode: AttentionBackendEnum.CPU_ATTN -> %s (vLLM's CPU kernel, then the off-chain tree rows "
        "with their ancestor mask)",
        BACKEND,
    )
    _installed = True
