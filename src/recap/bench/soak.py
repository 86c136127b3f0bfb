"""A soak run: one engine, one memory with a small budget of kept rows, a long stream of suite requests.

    python -m recap.bench.soak --model tiny-qwen2.5-vl --requests 2000 --budget-rows 4096 --max-new-tokens 48

It checks what a server running for weeks needs: tokens per forward that hold up (the last
window within a few per cent of the best one: no step where the kept 2-/3-token rows start afresh
and drafting falls back to cold speed), kept rows never above the budget, resident memory flat
after warm-up, and outputs equal to ``model.generate``'s on a sample of requests. Trees are
verified at a fixed size (``adaptive_budget=False``), so tokens per forward do not depend on the
machine's speed: the numbers are deterministic. ``--policy reset`` swaps in the policy recap had
before (a full table is cleared) to compare against; it exists only in this tool.

Writes a JSON report (``--out``) and a markdown table next to it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..config import RecapConfig
from ..core.memory import ContextTable, TokenMemory
from ..entry import generate
from ..loading import build_inputs, load_model
from .workloads import Request, suite_requests

POLICIES = ("age", "reset")


def request_stream(families: str = "all", first_seed: int = 0) -> Iterator[Request]:
    """Suite requests without end: one per family for each seed from ``first_seed`` on."""
    for seed in itertools.count(first_seed):
        yield from suite_requests(families, 1, seed)


def resident_bytes() -> int:
    """This process's resident set size now (Linux ``/proc/self/statm``; else the peak, from ``resource``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def use_reset_policy(memory: TokenMemory) -> None:
    """Make ``memory``'s kept tables start afresh when full (the policy before eviction)."""
    for table in memory.context.values():

        def reserve(self: ContextTable, extra: int) -> None:
            if self.max_keys is not None and self.count + extra > self.max_keys:
                if self.count:
                    self.evicted += self.count
                    self.evictions += 1
                self.clear()
            limit, self.max_keys = self.max_keys, None
            try:
                ContextTable.reserve(self, extra)  # grows as before, evicts nothing
            finally:
                self.max_keys = limit

        table.reserve = types.MethodType(reserve, table)  # type: ignore[method-assign]


def windows(records: Sequence[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    """Per ``size`` consecutive requests: tokens per forward (new tokens over forwards, prefill
    included), the largest resident size and the kept rows at its end."""
    out = []
    for start in range(0, len(records), size):
        chunk = records[start : start + size]
        tokens = sum(r["new_tokens"] for r in chunk)
        forwards = sum(r["forwards"] for r in chunk)
        out.append(
            {
                "first": start,
                "requests": len(chunk),
                "tokens_per_forward": tokens / forwards if forwards else 0.0,
                "rss_mib": max(r["rss"] for r in chunk) / 2**20,
                "context_rows": chunk[-1]["context_rows"],
                "evictions": chunk[-1]["evictions"],
            }
        )
    return out


def around_evictions(records: Sequence[dict[str, Any]], span: int = 10) -> dict[str, float]:
    """Tokens per forward of the ``span`` requests after each request that evicted, over the ``span``
    before it (mean and lowest ratio): a table that starts afresh shows as a ratio well below 1."""
    ratios = []
    for i in range(span, len(records) - span):
        if records[i]["evictions"] == records[i - 1]["evictions"]:
            continue
        before, after = records[i - span : i], records[i + 1 : i + 1 + span]
        rate = [sum(r["new_tokens"] for r in part) / sum(r["forwards"] for r in part) for part in (before, after)]
        ratios.append(rate[1] / rate[0])
    if not ratios:
        return {"events": 0, "mean_after_vs_before": 1.0, "lowest_after_vs_before": 1.0}
    return {
        "events": len(ratios),
        "mean_after_vs_before": sum(ratios) / len(ratios),
        "lowest_after_vs_before": min(ratios),
    }


def soak(
    model: torch.nn.Module,
    processor: Any,
    *,
    requests: int,
    budget_rows: int,
    max_new_tokens: int,
    policy: str = "age",
    window: int = 200,
    check_every: int = 50,
    families: str = "all",
    first_seed: int = 0,
    config: RecapConfig | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Run ``requests`` suite requests through ``recap.generate`` on one memory of ``budget_rows``
    kept rows; every ``check_every``-th one (0: none) is also decoded by ``model.generate`` and
    compared. Returns the report (``summary``, ``windows``, ``requests``)."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: choose one of {', '.join(POLICIES)}")
    config = config or RecapConfig(adaptive_budget=False)
    vocab = model.get_output_embeddings().weight.shape[0]
    memory = TokenMemory(vocab, k=config.k, method="recap", max_context_rows=budget_rows)
    if policy == "reset":
        use_reset_policy(memory)
    records: list[dict[str, Any]] = []
    mismatches: list[str] = []
    checked = 0
    most_rows = 0
    for i, request in enumerate(itertools.islice(request_stream(families, first_seed), requests)):
        inputs = build_inputs(processor, request.prompt, request.image)
        result = generate(model, inputs, "recap", max_new_tokens, config=config, memory=memory, do_sample=False)
        stats = result.stats
        rows = memory.context_rows
        most_rows = max(most_rows, max(len(t) for t in memory.context.values()))
        records.append(
            {
                "id": request.id,
                "new_tokens": stats.new_tokens,
                "forwards": stats.steps + 1,
                "rss": resident_bytes(),
                "context_rows": rows,
                "evictions": sum(t.evictions for t in memory.context.values()),
            }
        )
        if check_every and i % check_every == 0:
            with torch.inference_mode():
                out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
            checked += 1
            if out[0, inputs["input_ids"].shape[1] :].tolist() != result.token_ids:
                mismatches.append(request.id)
        if progress and (i + 1) % 50 == 0:
            done = windows(records[-50:], 50)[0]
            print(
                f"[soak {policy}] {i + 1}/{requests}: {done['tokens_per_forward']:.3f} tokens/forward, "
                f"{rows} rows, {records[-1]['evictions']} evictions, rss {done['rss_mib']:.0f} MiB",
                flush=True,
            )
    table = windows(records, window)
    full = [w for w in table if w["requests"] == window] or table
    best = max(w["tokens_per_forward"] for w in full)
    last = full[-1]["tokens_per_forward"]
    warm = full[min(1, len(full) - 1)]["rss_mib"]  # resident size once warmed up: the end of the second window
    fine = windows(records, max(1, window // 4))
    summary = {
        "policy": policy,
        "requests": len(records),
        "budget_rows": budget_rows,
        "max_new_tokens": max_new_tokens,
        "window": window,
        "best_window_tokens_per_forward": best,
        "last_window_tokens_per_forward": last,
        "last_vs_best": last / best if best else 0.0,
        "worst_quarter_window_tokens_per_forward": min(w["tokens_per_forward"] for w in fine[1:] or fine),
        "most_rows_in_a_table": most_rows,
        "table_budget_rows": memory.max_context_rows // 2,
        "evictions": records[-1]["evictions"] if records else 0,
        "rows_evicted": sum(t.evicted for t in memory.context.values()),
        "rss_mib_after_warmup": warm,
        "rss_mib_last": full[-1]["rss_mib"],
        "around_evictions": around_evictions(records),
        "checked_against_generate": checked,
        "mismatches": mismatches,
    }
    return {"summary": summary, "windows": table, "requests": records}


def markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    around = s["around_evictions"]
    lines = [
        f"# Soak: policy {s['policy']}, {s['requests']} requests, budget {s['budget_rows']} kept rows, "
        f"max_new_tokens {s['max_new_tokens']}",
        "",
        f"- tokens per forward: best {s['window']}-request window {s['best_window_tokens_per_forward']:.3f}, last "
        f"{s['last_window_tokens_per_forward']:.3f} ({100 * s['last_vs_best']:.1f}% of the best); worst "
        f"{s['window'] // 4}-request window after the first {s['worst_quarter_window_tokens_per_forward']:.3f}",
        f"- kept rows: at most {s['most_rows_in_a_table']} in a table (budget {s['table_budget_rows']}); "
        f"{s['evictions']} evictions, {s['rows_evicted']} rows evicted",
        f"- the 10 requests after a request that evicted, over the 10 before: tokens per forward x "
        f"{around['mean_after_vs_before']:.3f} on average, x {around['lowest_after_vs_before']:.3f} "
        f"at worst ({around['events']} such requests)",
        f"- resident memory: {s['rss_mib_after_warmup']:.0f} MiB after warm-up, {s['rss_mib_last']:.0f} MiB at the end",
        f"- outputs equal to model.generate: {s['checked_against_generate'] - len(s['mismatches'])}/"
        f"{s['checked_against_generate']} checked",
        "",
        "| requests | tokens/forward | RSS MiB | kept rows | evictions |",
        "|---|---|---|---|---|",
    ]
    for w in report["windows"]:
        lines.append(
            f"| {w['first']}-{w['first'] + w['requests'] - 1} | {w['tokens_per_forward']:.3f} | {w['rss_mib']:.0f} | "
            f"{w['context_rows']} | {w['evictions']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recap.bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-qwen2.5-vl")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--budget-rows", type=int, default=4096, help="TokenMemory(max_context_rows=...)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--policy", choices=POLICIES, default="age", help="reset: the old clear-when-full policy")
    parser.add_argument("--window", type=int, default=200)
    parser.add_argument("--check-every", type=int, default=50, help="compare with model.generate every N-th request")
    parser.add_argument("--families", default="all")
    parser.add_argument("--seed", type=int, default=0, help="the first suite seed")
    parser.add_argument("--out", type=Path, default=Path("soak.json"))
    args = parser.parse_args(argv)
    model, processor = load_model(args.model)
    report = soak(
        model, processor, requests=args.requests, budget_rows=args.budget_rows, max_new_tokens=args.max_new_tokens,
        policy=args.policy, window=args.window, check_every=args.check_every, families=args.families,
        first_seed=args.seed, progress=True,
    )  # fmt: skip
    args.out.write_text(json.dumps(report, indent=1))
    args.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 1 if report["summary"]["mismatches"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
