"""A server restarted from its snapshot against the same server kept running:
``python -m recap.vllm.restart_bench``.

On one model, for RECAP's chain (``-k``) and tree mode (``--tree``), with the requests of
``recap.vllm.bench`` (the suite, greedy, float32), ``batch`` at a time:

- engine A (``RECAP_VLLM_SNAPSHOT`` set) serves the warm-up stream W (the suite's requests at
  ``--warmup-seed``, in order), then its snapshot is saved, the call the save at shutdown makes
  (``Snapshots.save``), and A serves the measured requests R (the suite at ``--seed``): **a**;
- engine B starts from that snapshot (taken after W, before R: a copy, so A's later saves do not
  touch it) and serves R: **b**, a server restarted between W and R;
- engine C starts with nothing (no snapshot) and serves R: **c**, a server restarted without one;
- engine D starts from a damaged snapshot (the first half of A's file, as a torn copy would leave
  it) and serves R: **d**, which must be C's run (a cold start, the same counters), with one
  warning line from recap and the file moved aside to ``.bad``.

Periodic snapshots are off in A (``RECAP_VLLM_SNAPSHOT_SECONDS`` huge), so B starts from the state A
had after W. Reported: tokens per forward (``bench.measure``: output tokens / target forwards per
request) of each, ``b / a``, whether B's spec-decode counters equal A's, and whether every output
equals vLLM's output without speculation (a reference engine serves W and R too) and B's equal
A's. Tokens per forward do not depend on the machine's speed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from . import bench

MODES = {"chain": "recap", "tree": "recap-tree"}
NO_PERIODIC_SAVES = "1e12"  # seconds between snapshots: none while the bench runs


@contextlib.contextmanager
def _warnings() -> Iterator[list[str]]:
    """recap's warning lines (logger ``recap``) while the block runs."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler, logger = Keep(logging.WARNING), logging.getLogger("recap")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def _engine(path: Path, method: str, k: int, batch: int, tree: int, snapshot: Path | None, seconds: str | None):
    """A new engine (and its RECAP proposer) with ``RECAP_VLLM_SNAPSHOT=snapshot`` (None: unset)."""
    from .proposer import live_proposers

    before = set(map(id, live_proposers()))
    with bench.environment(
        RECAP_VLLM_SNAPSHOT=None if snapshot is None else str(snapshot), RECAP_VLLM_SNAPSHOT_SECONDS=seconds
    ):
        llm = bench.make_llm(path, method, k, max_num_seqs=batch, memory="warm", tree=tree)
    proposer = next((p for p in live_proposers() if id(p) not in before), None)
    return llm, proposer


def _summary(run_: dict[str, Any], reference: Sequence[list[int]]) -> dict[str, Any]:
    outputs = run_["outputs"]
    keys = ("tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "tokens_per_forward", "seconds")
    return {
        **{key: run_[key] for key in keys},
        "match": sum(o == r for o, r in zip(outputs, reference)) / len(reference),
    }


def run_mode(
    path: Path,
    mode: str,
    batch: int,
    k: int,
    tree: int,
    warmup: Sequence[dict[str, Any]],
    measured: Sequence[dict[str, Any]],
    lengths: tuple[Sequence[int], Sequence[int]],
    reference: tuple[Sequence[list[int]], Sequence[list[int]]],
    folder: Path,
) -> dict[str, Any]:
    """A, B, C and D of one mode (see the module docstring); ``folder`` holds the snapshots."""
    method = MODES[mode]
    live, restart = folder / f"{mode}-b{batch}-server.safetensors", folder / f"{mode}-b{batch}-after-warmup.safetensors"
    llm, proposer = _engine(path, method, k, batch, tree, live, NO_PERIODIC_SAVES)
    try:
        assert proposer is not None and proposer.snapshots is not None, "engine A has no RECAP snapshot"
        warm = bench.measure(llm, warmup, lengths[0], batch)
        proposer.snapshots.save(proposer.memory)  # what the save at shutdown does (Snapshots._last_save)
        shutil.copyfile(live, restart)
        rows = proposer.memory.rows_filled
        context_rows = proposer.memory.context_rows
        a = bench.measure(llm, measured, lengths[1], batch)
        saves = proposer.snapshots.saves
        tree_reason = proposer.tree_reason
    finally:
        del llm, proposer  # the engine and its memory go; the next engine starts in this process
        bench._free_engine()
    llm, proposer = _engine(path, method, k, batch, tree, restart, None)
    try:
        assert proposer is not None
        restored = (proposer.memory.rows_filled, proposer.memory.context_rows)
        b = bench.measure(llm, measured, lengths[1], batch)
    finally:
        del llm, proposer
        bench._free_engine()
    llm, proposer = _engine(path, method, k, batch, tree, None, None)
    try:
        assert proposer is not None and proposer.memory.rows_filled == 0
        c = bench.measure(llm, measured, lengths[1], batch)
    finally:
        del llm, proposer
        bench._free_engine()
    damaged = folder / f"{mode}-b{batch}-damaged.safetensors"
    damaged.write_bytes(restart.read_bytes()[: restart.stat().st_size // 2])
    with _warnings() as lines:
        llm, proposer = _engine(path, method, k, batch, tree, damaged, None)
        try:
            assert proposer is not None
            cold_start = proposer.memory.rows_filled == 0
            d = bench.measure(llm, measured, lengths[1], batch)
        finally:
            del llm, proposer
            bench._free_engine()
    return {
        "mode": mode, "batch": batch, "tree_fallback": tree_reason,
        "snapshot": {"rows": rows, "context_rows": context_rows, "restored": list(restored), "saves_in_a": saves},
        "warmup": _summary(warm, reference[0]), "a": _summary(a, reference[1]), "b": _summary(b, reference[1]),
        "c": _summary(c, reference[1]), "d": _summary(d, reference[1]),
        "damaged": {"cold_start": cold_start, "moved_aside": damaged.with_name(damaged.name + ".bad").exists(),
                    "d_counts_equal_c": all(d[key] == c[key] for key in bench.COUNTERS), "warnings": lines},
        "b_equals_a": b["outputs"] == a["outputs"],
        "b_counts_equal_a": all(b[key] == a[key] for key in bench.COUNTERS),  # drafts, draft and accepted tokens
        "b_over_a": b["tokens_per_forward"] / a["tokens_per_forward"],
    }  # fmt: skip


def reference_outputs(
    path: Path,
    warmup: Sequence[dict[str, Any]],
    measured: Sequence[dict[str, Any]],
    lengths: tuple[Sequence[int], Sequence[int]],
    batch: int,
) -> tuple[list[list[int]], list[list[int]]]:
    """vLLM's outputs of W and R without speculation, ``batch`` at a time."""
    llm = bench.make_llm(path, "none", max_num_seqs=batch)
    try:
        return bench.generate(llm, warmup, lengths[0], batch), bench.generate(llm, measured, lengths[1], batch)
    finally:
        del llm
        bench._free_engine()


def run(
    model: str,
    modes: Sequence[str],
    batches: Sequence[int],
    samples: int = 5,
    max_tokens: int = 200,
    k: int = 4,
    tree: int = bench.TREE_NODES,
    warmup_seed: int = 0,
    seed: int = 1,
    families: str = "all",
    log=print,
) -> dict[str, Any]:
    """Every (batch, mode) on ``model``: the reference, then A, B, C and D of each mode."""
    from ..bench.workloads import suite_requests
    from .models import model_path

    path = model_path(model)
    warm_requests = suite_requests(families, samples, warmup_seed)
    requests = suite_requests(families, samples, seed)
    warmup, measured = bench.prompts_for(path, warm_requests), bench.prompts_for(path, requests)
    lengths = ([max_tokens] * len(warmup), [max_tokens] * len(measured))
    result: dict[str, Any] = {
        "model": model, "warmup": [r.id for r in warm_requests], "requests": [r.id for r in requests],
        "max_tokens": max_tokens, "k": k, "tree": tree, "runs": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="recap-restart-") as folder:
        for batch in batches:
            reference = reference_outputs(path, warmup, measured, lengths, batch)
            for mode in modes:
                run_ = run_mode(path, mode, batch, k, tree, warmup, measured, lengths, reference, Path(folder))
                result["runs"].append(run_)
                log(summary_line(model, run_))
    return result


def summary_line(model: str, r: dict[str, Any]) -> str:
    return (
        f"{model} {r['mode']} batch {r['batch']}: tokens/forward a {r['a']['tokens_per_forward']:.3f}  "
        f"b {r['b']['tokens_per_forward']:.3f}  c {r['c']['tokens_per_forward']:.3f}  "
        f"d {r['d']['tokens_per_forward']:.3f}  b/a {r['b_over_a']:.4f}  "
        f"match W {r['warmup']['match']:.3f} a {r['a']['match']:.3f} b {r['b']['match']:.3f} "
        f"c {r['c']['match']:.3f} d {r['d']['match']:.3f}  b == a {r['b_equals_a']}  "
        f"b's counters == a's {r['b_counts_equal_a']}  damaged: {r['damaged']}"
    )


def markdown(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| model | mode | batch | W (A) | a: A after W | b: B from the snapshot | c: C cold | d: D damaged "
        "| b / a | match | D |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for r in result["runs"]:
            mode = "chain, k=" + str(result["k"]) if r["mode"] == "chain" else f"tree, {result['tree']} nodes"
            runs = [r[key] for key in ("warmup", "a", "b", "c", "d")]
            match = "all equal" if all(x["match"] == 1.0 for x in runs) and r["b_equals_a"] else "NOT EQUAL"
            cells = " | ".join(f"{x['tokens_per_forward']:.3f}" for x in runs)
            d = r["damaged"]
            said = [line for line in d["warnings"] if "snapshot" in line]
            if d["cold_start"] and d["moved_aside"] and d["d_counts_equal_c"] and len(said) == 1:
                damaged = "cold (as C), 1 warning line"
            else:
                damaged = (
                    f"CHECK: cold start {d['cold_start']}, moved aside {d['moved_aside']}, counters as C's "
                    f"{d['d_counts_equal_c']}, {len(said)} warning lines"
                )
            lines.append(
                f"| {result['model']} | {mode} | {r['batch']} | {cells} | {r['b_over_a']:.4f} | {match} | {damaged} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recap.vllm.restart_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help="embedded model name or folder (repeatable)")
    parser.add_argument("--modes", default="chain,tree", help="comma-separated, from " + ", ".join(MODES))
    parser.add_argument("--batch", default="1", help="comma-separated batch sizes")
    parser.add_argument("--samples", type=int, default=5, help="requests per suite family (W and R each)")
    parser.add_argument("--families", default="all")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("-k", type=int, default=4, help="chain mode: tokens drafted per step")
    parser.add_argument("--tree", type=int, default=bench.TREE_NODES, help="tree mode: draft nodes per step")
    parser.add_argument("--warmup-seed", type=int, default=0, help="suite seed of the warm-up stream W")
    parser.add_argument("--seed", type=int, default=1, help="suite seed of the measured requests R")
    parser.add_argument("--out", type=Path, help="folder for restart.json and restart.md")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if bad := [m for m in modes if m not in MODES]:
        parser.error(f"unknown modes {bad}: choose from {', '.join(MODES)}")
    if args.seed == args.warmup_seed:
        parser.error("--seed and --warmup-seed must differ: R would repeat W")
    bench.engine_env()
    from . import tap

    tap.prepare()
    results = []
    for model in args.model or ["tiny-qwen2.5-vl"]:
        results.append(
            run(model, modes, [int(b) for b in args.batch.split(",")], args.samples, args.max_tokens, args.k,
                args.tree, args.warmup_seed, args.seed, args.families)
        )  # fmt: skip
    text = markdown(results)
    print(text)
    if args.out:
        bench.write_results(args.out, "restart", results, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
