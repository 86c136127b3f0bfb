"""The benchmark protocol: warm-up, then every method on every request, order rotated."""

from __future__ import annotations

import datetime as dt
import platform
from collections.abc import Sequence
from typing import Any

import torch
from tqdm import tqdm

from ..loading import build_inputs, model_device
from .methods import PEERS, REFERENCE, MethodRunner, MethodSpec
from .report import aggregate
from .workloads import Request


def cpu_times() -> tuple[int, int] | None:
    """(steal, total) CPU time of the machine so far, in clock ticks, from Linux's /proc/stat (None
    elsewhere): steal is the time a hypervisor ran something else while this virtual machine was ready to run."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
    return steal, user + nice + system + idle + iowait + irq + softirq + steal


def steal_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The share of CPU time stolen between two ``cpu_times`` readings (None if unknown)."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])


def run_bench(
    model: torch.nn.Module,
    processor: Any,
    requests: Sequence[Request],
    specs: Sequence[MethodSpec],
    *,
    max_new_tokens: int = 200,
    memory: str = "warm",
    warmup: Request | None = None,
    settings: dict[str, Any] | None = None,
    progress: bool = True,
    preset_memories: dict[str, Any] | None = None,
    costs: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None,
    seed: int = 0,
    repeats: int = 1,
    runner_class: type[MethodRunner] = MethodRunner,
) -> dict[str, Any]:
    """Run every method on every request and return the results (see report.aggregate).

    Protocol: each method runs once on ``warmup`` (32 tokens) first; then for request i the
    methods run in the order rotated by i, so drift on a noisy machine hits all alike. Each
    call is timed end to end (prefill and vision encoding included; the processor's
    preprocessing is shared and not timed). ``memory``: "warm" keeps each method's
    persistent memory across requests, in request order (as a server would); "cold" clears
    its rows before each request (RECAP's calibration, a statistic of the model, stays). A
    peer from the model library (``hf-prompt-lookup``) that raises on a request is recorded
    under "failures" and left out of its aggregates; any other method raising is a bug and
    propagates. ``preset_memories`` maps a method name to the memory it starts from (e.g. one
    loaded from a file). ``costs`` (``costs.measure_costs``) adds the verification cost table.
    ``sampling``: generate's sampling arguments (e.g. ``{"do_sample": True, "temperature": 0.7}``);
    every method then runs request i after ``torch.manual_seed(seed + i)``, and the reference is
    ``generate`` with the same arguments and seed, whose tokens every method must reproduce.
    Greedy without. ``repeats``: each method decodes each request that many times, every time from
    the memory state it had before the request (the earlier runs work on copies, the last on the
    memory itself, which carries on), the method order rotated on each round; the run with the
    median time is recorded (its tokens, time and statistics; every run's tokens are checked):
    steadier ratios where the machine's speed jumps from moment to moment. ``runner_class``: the class that runs
    each method (a ``MethodRunner``; a diagnostic may pass a subclass).
    """
    if memory not in ("warm", "cold"):
        raise ValueError(f"memory must be 'warm' or 'cold', got {memory!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats!r}")
    if sampling and any(spec.kind in PEERS for spec in specs):
        raise ValueError(
            "hf-prompt-lookup cannot run in the sampling mode: transformers' assisted sampling draws differently "
            "from plain sampling, so its tokens differ from generate's under the same seed by design; leave it out"
        )
    runners = [runner_class(spec, model, memory) for spec in specs]
    for runner in runners:
        preset = (preset_memories or {}).get(runner.spec.name)
        if preset is not None:
            runner.memory = preset
    if warmup is not None:
        inputs = build_inputs(processor, warmup.prompt, warmup.image, device=model_device(model))
        for runner in runners:
            try:
                runner(inputs, 32, sampling, seed)
            except Exception:
                if runner.spec.kind not in PEERS:
                    raise
    records: list[dict[str, Any]] = []
    mismatches: list[dict[str, str]] = []
    failures: list[dict[str, str]] = []
    bar = tqdm(total=len(requests) * len(runners) * repeats, desc="bench", unit="run", disable=not progress)
    run_start = cpu_times()
    for i, request in enumerate(requests):
        inputs = build_inputs(processor, request.prompt, request.image, device=model_device(model))
        request_start = cpu_times()
        every: dict[str, list] = {}  # method -> its runs of this request
        before = {runner.spec.name: runner.memory for runner in runners}
        failed: set[str] = set()
        for repeat in range(repeats):
            shift = (i + repeat) % len(runners)
            for runner in runners[shift:] + runners[:shift]:
                name = runner.spec.name
                bar.update()
                if name in failed:
                    continue
                if before[name] is not None:  # every run starts from the memory before the request
                    runner.memory = before[name] if repeat == repeats - 1 else before[name].copy()
                try:
                    every.setdefault(name, []).append(runner(inputs, max_new_tokens, sampling, seed + i))
                except Exception as exc:  # a peer from the model library may not support this model
                    if runner.spec.kind not in PEERS:
                        raise
                    failed.add(name)
                    every.pop(name, None)
                    failures.append({"method": name, "request": request.id, "error": f"{type(exc).__name__}: {exc}"})
                    bar.write(f"FAILED: {name} on {request.id}: {exc}")
        request_steal = steal_share(request_start, cpu_times())
        reference = every[REFERENCE][0].tokens
        runs = {}
        for name, done in every.items():
            differing = next((run for run in done if run.tokens != reference), None)
            runs[name] = differing or sorted(done, key=lambda run: run.seconds)[(len(done) - 1) // 2]
        for name, run in runs.items():
            match = run.tokens == reference
            if not match:
                first = next((j for j, (a, b) in enumerate(zip(run.tokens, reference)) if a != b), None)
                detail = f"first difference at token {first}" if first is not None else "different length"
                mismatches.append({"method": name, "request": request.id, "detail": detail})
                bar.write(f"MISMATCH: {name} on {request.id}: {detail}")
            records.append(
                {
                    "request": request.id,
                    "family": request.family,
                    "method": name,
                    "tokens": run.tokens,
                    "hash": run.digest,
                    "match": match,
                    "seconds": run.seconds,
                    "repeat_seconds": [done.seconds for done in every[name]],
                    "steps": run.steps,
                    "mean_accepted_length": run.mean_accepted_length,
                    "accepted_lengths": run.accepted_lengths,
                    "nodes": run.nodes,
                    "host_seconds": run.host_seconds,
                    "verify_seconds": run.verify_seconds,
                    "prefill_seconds": run.prefill_seconds,
                    "accepted_by_source": run.accepted_by_source,
                    "steps_by_threads": run.steps_by_threads,
                    "cpu_steal": request_steal,
                }
            )
    bar.close()
    run_steal = steal_share(run_start, cpu_times())
    methods = [spec.name for spec in specs]
    results = aggregate(records, methods)
    results["costs"] = costs
    results["settings"] = {
        "max_new_tokens": max_new_tokens,
        "memory": memory,
        "memory_note": "carried across requests in the order listed" if memory == "warm" else "fresh per request",
        "protocol": "warm-up 32 tokens per method; method order rotated per request; end-to-end timing"
        + (
            f"; each request {repeats} times per method from the same memory state, the median run kept"
            if repeats > 1
            else ""
        ),
        "repeats": repeats,
        "decoding": _decoding(sampling, seed),
        "requests": len(requests),
        "methods": methods,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip()
        + f", {torch.get_num_threads()} torch threads",
        "cpu_steal": run_steal,
        **(settings or {}),
    }
    results["mismatches"] = mismatches
    results["failures"] = failures
    results["samples"] = records
    return results


def _decoding(sampling: dict[str, Any] | None, seed: int) -> str:
    """How the reference decodes, in words (for the report)."""
    if not sampling:
        return "greedy: generate(do_sample=False)"
    args = ", ".join(f"{k}={v}" for k, v in sampling.items())
    return f"sampling: generate({args}) after torch.manual_seed({seed} + request index)"
