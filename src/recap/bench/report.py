"""Aggregating benchmark runs, and writing results.json, report.md and plots."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .methods import REFERENCE


def generate_ms_per_token(records: Sequence[dict[str, Any]]) -> float | None:
    """Milliseconds ``generate`` spent per token after the first, in these very runs: its time on
    each request less that request's prefill (as timed by the recap methods on it), over its
    tokens after the first. None without both."""
    prefills: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r.get("prefill_seconds") is not None:
            prefills[r["request"]].append(r["prefill_seconds"])
    seconds, tokens = 0.0, 0
    for r in records:
        if r["method"] == REFERENCE and prefills.get(r["request"]) and len(r["tokens"]) > 1:
            seconds += r["seconds"] - statistics.median(prefills[r["request"]])
            tokens += len(r["tokens"]) - 1
    return 1000 * seconds / tokens if tokens and seconds > 0 else None


def round_speedups(runs: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> list[float] | None:
    """The mean speedup of each repeat round alone, over (reference, method) record pairs: round j's
    ratio on a request is generate's j-th time over the method's j-th (the bench runs both in round j,
    seconds apart). None unless every record holds the same number (>= 2) of repeat times."""
    counts = {len(record.get("repeat_seconds") or ()) for pair in runs for record in pair}
    if len(counts) != 1 or min(counts) < 2:
        return None
    rounds = counts.pop()
    return [
        statistics.fmean(ref["repeat_seconds"][j] / run["repeat_seconds"][j] for ref, run in runs)
        for j in range(rounds)
    ]


def summarize(records: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per-method aggregates over ``records`` (dicts of one request x method, see run.py).

    speedup of a run = reference seconds / its seconds on the same request; reported as the
    mean and median of those ratios and as the ratio of total times. Mean accepted length is
    tokens committed by steps / steps (over all steps), and match ratio the share of
    requests whose tokens equal the reference's. Each method that steps also gets its
    zero-overhead ceiling: MAL x generate's ms per token (``generate_ms_per_token``) / its mean
    ms per verify forward, and its mean speedup as a share of that. With repeats, ``speedup_rounds``
    is the mean speedup of each repeat round alone (``round_speedups``; None for the reference):
    how far the noise of single runs moves the mean.
    """
    per_token = generate_ms_per_token(records)
    by_request: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in records:
        by_request[r["request"]][r["method"]] = r
    out: dict[str, dict[str, Any]] = {}
    for method in methods:
        runs = [(rs[REFERENCE], rs[method]) for rs in by_request.values() if method in rs and REFERENCE in rs]
        if not runs:
            continue
        ratios = [ref["seconds"] / run["seconds"] for ref, run in runs]
        steps = [run["steps"] for _, run in runs if run.get("steps") is not None]
        tokens = sum(len(run["tokens"]) for _, run in runs)
        summary: dict[str, Any] = {
            "samples": len(runs),
            "new_tokens": tokens,
            "seconds": sum(run["seconds"] for _, run in runs),
            "speedup_mean": statistics.fmean(ratios),
            "speedup_median": statistics.median(ratios),
            "speedup_total": sum(ref["seconds"] for ref, _ in runs) / sum(run["seconds"] for _, run in runs),
            "speedup_rounds": None if method == REFERENCE else round_speedups(runs),
            "match_ratio": sum(run["match"] for _, run in runs) / len(runs),
            "mean_accepted_length": None,
            "tokens_per_forward": None,
            "nodes_per_token": None,
            "host_overhead_us_per_step": None,
            "verify_ms_per_step": None,
            "ceiling": None,
            "of_ceiling": None,
            "histogram": None,
            "accepted_by_source": None,
            "steps_by_threads": None,
        }
        if len(steps) == len(runs):
            total_steps = sum(steps)
            committed = sum(sum(run["accepted_lengths"]) for _, run in runs)
            histogram: dict[str, int] = defaultdict(int)
            sources: dict[str, int] = defaultdict(int)
            for _, run in runs:
                for length in run["accepted_lengths"]:
                    histogram[str(length)] += 1
                for source, count in (run.get("accepted_by_source") or {}).items():
                    sources[source] += count
            summary.update(
                mean_accepted_length=committed / total_steps if total_steps else 0.0,
                tokens_per_forward=tokens / (total_steps + len(runs)),
                nodes_per_token=sum(run["nodes"] for _, run in runs) / tokens if tokens else 0.0,
                host_overhead_us_per_step=1e6 * sum(run["host_seconds"] for _, run in runs) / max(1, total_steps),
                verify_ms_per_step=1e3 * sum(run.get("verify_seconds") or 0.0 for _, run in runs) / max(1, total_steps),
                histogram=dict(sorted(histogram.items(), key=lambda kv: int(kv[0]))),
                accepted_by_source=dict(sources),
            )
            by_threads: dict[str, int] = defaultdict(int)
            for _, run in runs:
                for threads, count in (run.get("steps_by_threads") or {}).items():
                    by_threads[str(threads)] += count
            if by_threads:
                summary["steps_by_threads"] = dict(sorted(by_threads.items(), key=lambda kv: int(kv[0])))
            if per_token and summary["verify_ms_per_step"] and total_steps:
                ceiling = summary["mean_accepted_length"] * per_token / summary["verify_ms_per_step"]
                summary.update(ceiling=ceiling, of_ceiling=summary["speedup_mean"] / ceiling)
        out[method] = summary
    return out


def aggregate(records: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    """{"overall": {method: summary}, "families": {family: {method: summary}},
    "generate_ms_per_token": ms}."""
    families: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        families[r["family"]].append(r)
    return {
        "overall": summarize(records, methods),
        "families": {family: summarize(rs, methods) for family, rs in families.items()},
        "generate_ms_per_token": generate_ms_per_token(records),
    }


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):  # a spread: lowest-highest
        return f"{format(min(value), spec)}-{format(max(value), spec)}"
    return format(value, spec)


COLUMNS = (
    ("MAL", "mean_accepted_length", ".2f"),
    ("tok/fwd", "tokens_per_forward", ".2f"),
    ("nodes/tok", "nodes_per_token", ".1f"),
    ("speedup mean", "speedup_mean", ".2f"),
    ("median", "speedup_median", ".2f"),
    ("total", "speedup_total", ".2f"),
    ("rounds", "speedup_rounds", ".2f"),
    ("match", "match_ratio", ".3f"),
    ("host us/step", "host_overhead_us_per_step", ".0f"),
    ("verify ms/step", "verify_ms_per_step", ".2f"),
    ("ceiling", "ceiling", ".2f"),
    ("of ceiling", "of_ceiling", ".0%"),
)


def columns(results: dict[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """The table's columns for these results: *rounds* only where some method has it (``--repeats``)."""
    summaries = [s for group in (results["overall"], *results["families"].values()) for s in group.values()]
    rounds = any(s.get("speedup_rounds") for s in summaries)
    return tuple(c for c in COLUMNS if rounds or c[1] != "speedup_rounds")


def table_rows(
    summaries: dict[str, dict[str, Any]], shown: tuple[tuple[str, str, str], ...] = COLUMNS
) -> list[list[str]]:
    return [[method] + [_fmt(s.get(key), spec) for _, key, spec in shown] for method, s in summaries.items()]


def threads_line(summaries: dict[str, dict[str, Any]]) -> str | None:
    """The share of steps per torch thread count of the methods that chose it (None if none did)."""
    chose = {m: s["steps_by_threads"] for m, s in summaries.items() if s.get("steps_by_threads")}
    if not chose:
        return None
    shares = [
        f"{method}: " + ", ".join(f"{n} threads {count / sum(counts.values()):.0%}" for n, count in counts.items())
        for method, counts in chose.items()
    ]
    return "Steps per torch thread count (where a method chose it; generate runs on the caller's): " + "; ".join(shares)


NOISY_STEAL = 0.05  # a hypervisor that takes this share of the CPU makes step times jump from run to run


def _steal_note(steal: float | None) -> str:
    if steal is None:
        return ""
    return f"; CPU steal {steal:.0%} of the run's CPU time" + (" (noisy timings)" if steal >= NOISY_STEAL else "")


def markdown(results: dict[str, Any]) -> str:
    """report.md: settings, the overall table, one table per family, plots."""
    meta = results["settings"]
    shown = columns(results)
    lines = [
        "# recap bench report",
        "",
        f"- model: `{meta['model']}` ({meta['device']}, {meta['dtype']})"
        + (f": **{meta['model_note']}**" if meta.get("model_note") else ""),
        f"- workload: {meta['workload']}, {meta['requests']} requests, max_new_tokens {meta['max_new_tokens']}",
        f"- persistent memory: **{meta['memory']}** ({meta['memory_note']})",
        f"- protocol: {meta['protocol']}",
        f"- date: {meta['date']}, machine: {meta['machine']}" + _steal_note(meta.get("cpu_steal")),
        f"- decoding: {meta.get('decoding', 'greedy: generate(do_sample=False)')}",
        "",
        "Speedup is measured against the model's own `generate` with the same arguments on the same request."
        + (
            " *rounds*: the lowest and highest mean speedup of a single repeat round (round j pairs generate's "
            "j-th run of a request with the method's j-th, seconds apart): how far one run's noise moves the mean."
            if any(key == "speedup_rounds" for _, key, _ in shown)
            else ""
        ),
        "",
    ]
    costs = results.get("costs")
    if costs:
        base = costs["verify_ms"][0]
        lines.extend([
            "## Verification cost on this machine",
            "",
            f"`generate` spends {_fmt(costs['generate_ms_per_token'], '.2f')} ms per token. One tree forward "
            "(top-k included):",
            "",
            "| nodes | " + " | ".join(str(s) for s in costs["sizes"]) + " |",
            "|---|" + "---|" * len(costs["sizes"]),
            "| ms | " + " | ".join(f"{ms:.2f}" for ms in costs["verify_ms"]) + " |",
            "| x 1 node | " + " | ".join(f"{ms / base:.2f}" for ms in costs["verify_ms"]) + " |",
            "",
            "The ceiling of a method is the speedup it would reach with zero host overhead and no prefill: its "
            "tokens per step x generate's ms per token (in the runs below: "
            f"{_fmt(results.get('generate_ms_per_token'), '.2f')} ms, prefill excluded) / its mean ms per verify "
            "forward in those runs; *of ceiling* is its mean speedup over that.",
            "",
        ])  # fmt: skip
    header = "| method | " + " | ".join(c[0] for c in shown) + " |"
    rule = "|" + "---|" * (len(shown) + 1)

    def table(title: str, summaries: dict[str, dict[str, Any]]) -> None:
        lines.extend([f"## {title}", "", header, rule])
        lines.extend("| " + " | ".join(row) + " |" for row in table_rows(summaries, shown))
        lines.append("")

    table("Overall", results["overall"])
    threads = threads_line(results["overall"])
    if threads:
        lines.extend([threads, ""])
    for family, summaries in results["families"].items():
        table(f"Family: {family}", summaries)
    mismatches = results.get("mismatches", [])
    if mismatches:
        lines.extend(["## MISMATCHES (lossless violated)", ""])
        lines.extend(f"- {m['method']} on {m['request']}: {m['detail']}" for m in mismatches)
        lines.append("")
    failures = results.get("failures", [])
    if failures:
        lines.extend(["## Failed runs of peers (left out of their aggregates)", ""])
        lines.extend(f"- {f['method']} on {f['request']}: {f['error'][:300]}" for f in failures)
        lines.append("")
    lines.extend(["## Plots", "", "![speedup](speedup.png)", "", "![accepted lengths](accepted_lengths.png)", ""])
    return "\n".join(lines)


def plot(results: dict[str, Any], out: Path) -> list[Path]:
    """speedup.png (per family and method) and accepted_lengths.png (histograms)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    families = list(results["families"])
    methods = [m for m in results["overall"] if m != REFERENCE]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(families) + 2), 4))
    width = 0.8 / max(1, len(methods))
    for j, method in enumerate(methods):
        values = [results["families"][f].get(method, {}).get("speedup_mean", 0) for f in families]
        ax.bar([i + j * width for i in range(len(families))], values, width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(families))], families)
    ax.set_ylabel("speedup vs generate (mean)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=120)
    plt.close(fig)
    written.append(out / "speedup.png")

    with_hist = [m for m in methods if results["overall"][m].get("histogram")]
    if with_hist:
        fig, axes = plt.subplots(1, len(with_hist), figsize=(3 * len(with_hist), 3), squeeze=False)
        for ax, method in zip(axes[0], with_hist):
            hist = results["overall"][method]["histogram"]
            ax.bar([int(k) for k in hist], list(hist.values()))
            ax.set_title(method, fontsize=8)
            ax.set_xlabel("tokens per step")
        fig.tight_layout()
        fig.savefig(out / "accepted_lengths.png", dpi=120)
        plt.close(fig)
        written.append(out / "accepted_lengths.png")
    return written


def write(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, out)
    (out / "report.md").write_text(markdown(results))
