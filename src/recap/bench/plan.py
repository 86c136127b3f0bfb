"""The policy of ``recap bench``: which methods, which requests, which memory and which verify
costs a run uses, from the command's options. ``recap.cli`` parses the options and prints; the
choices live here, where the Python API can make them too (``plan`` then ``execute``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..backends.hf import placeholder_ids
from ..config import RecapConfig
from ..core.memory import TokenMemory
from ..drafters import memory_k
from ..drafters.token_recycling import Template
from ..kernels import ensure_ready
from ..loading import build_inputs, model_device
from .methods import MethodSpec, ablation_specs, budget_specs, parse_methods
from .run import run_bench
from .verify_costs import measure_costs
from .workloads import Request, jsonl_requests, suite_requests

DEFAULT_METHODS = "generate,hf-prompt-lookup,ar,pld,token_recycling,recap"
# the k of RECAP's memory when a memory file is given: the default config's (every RECAP spec reads it)
MEMORY_FILE_K = memory_k("recap", RecapConfig())


@dataclass
class BenchPlan:
    """What one bench run does (``plan``)."""

    specs: list[MethodSpec]
    requests: list[Request]
    warmup: Request
    workload: str
    sampling: dict[str, Any] | None


def plan(
    methods: str | None,
    ablate: bool,
    budgets: str | None,
    data: Path | None,
    families: str,
    samples: int,
    seed: int,
    sampling: dict[str, Any] | None,
) -> BenchPlan:
    """The methods (``methods`` or every default method, plus the ablations and fixed budgets asked
    for) and the requests (a JSONL file, or the offline suite's families at ``seed``)."""
    budget_list = [int(b) for b in budgets.split(",") if b.strip()] if budgets else []
    specs = parse_methods(methods or DEFAULT_METHODS)
    extra = (ablation_specs() if ablate else []) + budget_specs(budget_list)
    specs += [spec for spec in extra if spec.name not in {s.name for s in specs}]
    if data is not None:
        requests = jsonl_requests(data, limit=samples)
        warmup, workload = requests[0], f"data {data}"
    else:
        requests = suite_requests(families, samples, seed)
        warmup = suite_requests("describe", 1, seed + 1)[0]
        workload = f"suite {families} (seed {seed}, {samples} per family)"
    return BenchPlan(specs, requests, warmup, workload, sampling or None)


def drop_unrunnable_defaults(bench: BenchPlan, model: torch.nn.Module, methods_given: bool) -> str | None:
    """Leave transformers' prompt lookup out of the default methods where it cannot match generate
    (sampling) or fails (vision-language models); returns the line that says why (None if kept).
    Methods named by the user stay."""
    if methods_given:
        return None
    if bench.sampling:
        why = (
            "hf-prompt-lookup left out: transformers' assisted sampling does not draw like plain sampling, so "
            "its tokens differ from generate's under the same seed"
        )
    elif placeholder_ids(model.config):
        why = (
            "hf-prompt-lookup left out: transformers' prompt lookup copies image placeholder tokens into its "
            "drafts on vision-language models and fails; name it in --methods to run it anyway"
        )
    else:
        return None
    bench.specs = [spec for spec in bench.specs if spec.kind != "hf-prompt-lookup"]
    return why


def largest_tree(specs: list[MethodSpec]) -> int:
    """The most nodes (root included) any of ``specs`` verifies in one step: RECAP's budget plus
    its suffix graft, or Token Recycling's static template."""
    sizes = [s.config.node_budget + 1 + s.config.suffix_tokens for s in specs if s.kind == "recap"]
    return max([*sizes, len(Template.default().parents)])


def execute(
    bench: BenchPlan,
    model: torch.nn.Module,
    processor: Any,
    settings: dict[str, Any],
    max_new_tokens: int,
    memory: str,
    recap_memory: TokenMemory | None,
    costs: bool,
    seed: int,
    say: Callable[[str], None] = print,
    repeats: int = 1,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Run the plan: kernels compiled before any timing, the verify-cost ladder (if ``costs``),
    then every method on every request, ``repeats`` times each (``run_bench``). Returns (results,
    cost table or None)."""
    kernel_seconds = ensure_ready()  # compiled on a machine's first run, then cached
    say(f"drafting kernels ready in {kernel_seconds:.1f} s (numba: compiled once per machine, cached)")
    settings = {**settings, "workload": bench.workload, "kernels_ready_seconds": round(kernel_seconds, 2)}
    cost_table = None
    if costs:
        inputs = build_inputs(processor, bench.warmup.prompt, bench.warmup.image, device=model_device(model))
        cost_table = measure_costs(model, inputs, largest_tree(bench.specs))
    results = run_bench(
        model,
        processor,
        bench.requests,
        bench.specs,
        max_new_tokens=max_new_tokens,
        memory=memory,
        warmup=bench.warmup,
        settings=settings,
        preset_memories={"recap": recap_memory},
        costs=cost_table,
        sampling=bench.sampling,
        seed=seed,
        repeats=repeats,
    )
    return results, cost_table
