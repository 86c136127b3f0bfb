"""Same-process A/B of the step-cost model: RECAP with ``recap.core.step_cost`` as it was at a git revision
against the working tree's, and ``generate``, interleaved per request.

    python -m tools.diagnostics.step_cost_ab --model tiny-qwen2.5-vl --seed 691 --rev caa14de
    python -m tools.diagnostics.step_cost_ab --model tiny-qwen2.5-vl --seed 709 --rev HEAD   # an A/A

Cross-process pairs cannot resolve a few points (``generate``'s own time moves by up to 11% between two processes
of one command), and ``recap bench``'s variants share one step-cost model per tree budget. Here each side has its own
step-cost object and its own memory (both from empty), greedy, 200 tokens: for request i of the suite every side
decodes it ``--repeats`` times in an order rotated by i and the round, the earlier runs from a copy of the memory
(as the bench does), and the median time counts; ``--cold`` clears the memories' rows before each request. Prints
each side's speedup over ``generate`` (of the summed medians, and the mean of the per-request ratios) and its nodes
per token. Every output is checked against ``generate``'s.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from recap import entry
from recap.bench.workloads import suite_requests
from recap.core.memory import TokenMemory
from recap.core.step_cost import StepCost
from recap.core.vocab import output_vocab_size
from recap.loading import build_inputs, load_model

ROOT = Path(__file__).resolve().parents[2]
MAX_NODES = 64  # the default node budget (63) and the root


def step_cost_at(rev: str) -> type:
    """``StepCost`` as ``src/recap/core/step_cost.py`` was at ``rev`` (its relative imports made absolute)."""
    source = subprocess.run(
        ["git", "show", f"{rev}:src/recap/core/step_cost.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.replace("from .threads import", "from recap.core.threads import")
    path = Path(tempfile.mkdtemp()) / "step_cost_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("step_cost_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and the like look modules up by name
    spec.loader.exec_module(module)
    return module.StepCost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-qwen2.5-vl")
    parser.add_argument("--samples", type=int, default=4, help="requests per suite family")
    parser.add_argument("--seed", type=int, default=691)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rev", default="HEAD", help="the revision of the other side's step-cost model")
    parser.add_argument("--cold", action="store_true", help="clear each side's memory rows before every request")
    args = parser.parse_args()

    model, processor = load_model(args.model)
    vocab = output_vocab_size(model)
    requests = suite_requests("all", args.samples, args.seed)
    inputs = [build_inputs(processor, r.prompt, r.image) for r in requests]
    costs = {args.rev: step_cost_at(args.rev)(MAX_NODES), "working tree": StepCost(MAX_NODES)}
    memories = {side: TokenMemory(vocab, k=8, method="recap") for side in costs}

    def decode(side: str, request: dict, max_new_tokens: int, memory: TokenMemory | None = None):
        if side == "generate":
            with torch.inference_mode():
                out = model.generate(**request, max_new_tokens=max_new_tokens, do_sample=False)
            return out[0, request["input_ids"].shape[1] :].tolist(), None
        entry._step_costs[model] = {MAX_NODES: costs[side]}  # this side's step-cost model for this call
        result = entry.generate(model, request, "recap", max_new_tokens, memory=memory)
        return result.token_ids, result.stats

    warm_up = build_inputs(processor, "Describe the image.", requests[0].image)
    for side in ("generate", *costs):
        decode(side, warm_up, 32, TokenMemory(vocab, k=8, method="recap"))
    sides = ["generate", *costs]
    medians = {side: [] for side in sides}
    nodes = {side: [0, 0] for side in costs}
    for i, request in enumerate(inputs):
        if args.cold:  # every row, as the bench's --memory cold does; the calibration stays
            for memory in memories.values():
                memory.clear()
        times = {side: [] for side in sides}
        outputs = {side: [] for side in sides}
        for round_ in range(args.repeats):
            shift = (i + round_) % len(sides)
            last = round_ == args.repeats - 1
            for side in sides[shift:] + sides[:shift]:
                memory = None if side == "generate" else memories[side] if last else memories[side].copy()
                start = time.perf_counter()
                tokens, stats = decode(side, request, 200, memory)
                times[side].append(time.perf_counter() - start)
                outputs[side].append(tokens)
                if side != "generate" and last:
                    nodes[side][0] += stats.nodes_verified
                    nodes[side][1] += stats.new_tokens
        reference = outputs["generate"][0]
        for side in sides:
            if any(tokens != reference for tokens in outputs[side]):
                raise SystemExit(f"{side}: request {requests[i].id} differs from generate's tokens")
        for side in sides:
            medians[side].append(statistics.median(times[side]))
    print(f"{args.model}, suite seed {args.seed}, {len(inputs)} requests, median of {args.repeats} runs each")
    for side in costs:
        ratios = [g / s for g, s in zip(medians["generate"], medians[side])]
        total = sum(medians["generate"]) / sum(medians[side])
        per_token = nodes[side][0] / nodes[side][1]
        print(f"{side}: {total:.3f}x in all, {statistics.mean(ratios):.3f}x mean, {per_token:.2f} nodes per token")


if __name__ == "__main__":
    main()
