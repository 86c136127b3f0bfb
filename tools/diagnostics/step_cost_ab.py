"""Same-process A/B of the step-cost model: RECAP with ``recap.core.step_cost`` as it was at a git revision
against the working tree's, and ``generate``, in one ``recap bench`` run.

    python -m tools.diagnostics.step_cost_ab --model tiny-qwen2.5-vl --seed 691 --rev caa14de
    python -m tools.diagnostics.step_cost_ab --model tiny-qwen2.5-vl --seed 709 --rev HEAD   # an A/A

Cross-process pairs cannot resolve a few points (``generate``'s own time moves by up to 11% between two processes
of one command), and ``recap bench``'s variants share one step-cost model per tree budget. Here the bench's own
protocol (``recap.bench.run.run_bench``: warm-up, order rotated per request, ``--repeats`` runs from the same memory
state, the median kept, every output checked against ``generate``'s) runs ``recap@REV`` and ``recap``, the same
default configuration, each with its own step-cost object and its own memory from empty; ``--cold`` clears the
rows before each request. Prints the bench's overall table; exits 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

from recap import entry
from recap.bench import run as bench_run
from recap.bench.methods import MethodRunner, MethodSpec
from recap.bench.report import columns, table_rows
from recap.bench.workloads import Request, suite_requests
from recap.core.step_cost import StepCost
from recap.loading import load_model

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


class OwnStepCost(MethodRunner):
    """A bench runner whose RECAP calls use the step-cost object given for its method's name."""

    step_costs: dict[str, StepCost] = {}

    def __call__(self, *args, **kwargs):
        cost = self.step_costs.get(self.spec.name)
        if cost is not None:
            entry._step_costs[self.model] = {MAX_NODES: cost}  # what recap.generate takes for this model
        return super().__call__(*args, **kwargs)


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
    requests = suite_requests("all", args.samples, args.seed)
    old = f"recap@{args.rev}"
    OwnStepCost.step_costs = {old: step_cost_at(args.rev)(MAX_NODES), "recap": StepCost(MAX_NODES)}
    specs = [MethodSpec("generate", "generate"), MethodSpec(old, "recap"), MethodSpec("recap", "recap")]
    warmup = Request("warm-up", "warm-up", "Describe the image.", requests[0].image)
    results = bench_run.run_bench(
        model,
        processor,
        requests,
        specs,
        memory="cold" if args.cold else "warm",
        warmup=warmup,
        repeats=args.repeats,
        runner_class=OwnStepCost,
    )
    shown = columns(results)
    print(f"{args.model}, suite seed {args.seed}, {len(requests)} requests, median of {args.repeats} runs each")
    print(" | ".join(["method", *(title for title, _, _ in shown)]))
    for row in table_rows(results["overall"], shown):
        print(" | ".join(row))
    if results["mismatches"]:
        raise SystemExit(f"{len(results['mismatches'])} outputs differ from generate's: {results['mismatches']}")


if __name__ == "__main__":
    main()
