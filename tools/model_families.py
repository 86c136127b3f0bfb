"""Survey: every decoder-only and image-text architecture of transformers, built tiny and
offline, run through recap's lossless check; writes the family table of docs/models.md (between
its ``<!-- families:start -->`` and ``<!-- families:end -->`` markers) and tests/family_status.json
(what tests/test_families.py holds each family to).

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python tools/model_families.py [--only gpt2,llama] [--no-write]
    .venv/bin/python tools/model_families.py --new   # only the families without a record, merged in

Each family runs in a forked child (memory cap, time limit), so one that cannot be built
small (default vision towers of several GB) cannot take the survey down.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import families  # noqa: E402

TABLE_PAGE = ROOT / "docs" / "models.md"
STATUS = ROOT / "tests" / "family_status.json"
START, END = "<!-- families:start -->", "<!-- families:end -->"
LIMIT_SECONDS, LIMIT_BYTES = 300, 6 << 30


def run_one(family: families.Family, lengths: tuple[int, ...]) -> families.Outcome:
    """``families.check`` in a child process, so a crash or a memory blow-up stays there."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read)
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))
        signal.alarm(LIMIT_SECONDS)
        try:
            outcome = families.check(family, lengths)
        except BaseException as exc:  # noqa: BLE001 - report anything, even MemoryError
            outcome = families.Outcome("crash", f"harness: {type(exc).__name__}: {exc}"[:240])
        os.write(write, json.dumps([outcome.status, outcome.detail]).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 1 << 16):
        data += chunk
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if not data:
        reason = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
        return families.Outcome("not-tried", f"the tiny model's check was killed ({reason}; time or memory limit)")
    return families.Outcome(*json.loads(data))


def recorded_outcomes() -> dict[tuple[str, str], families.Outcome]:
    """The outcomes the table of docs/models.md records, by (kind, model type)."""
    text = TABLE_PAGE.read_text().split(START)[1].split(END)[0]
    kind, recorded = None, {}
    for line in text.splitlines():
        if line.startswith("**"):
            kind = "text" if line.startswith("**Decoder-only") else "image-text"
        elif line.startswith("| `"):
            model_type, _, status = (cell.strip() for cell in line.strip("| ").split(" | ", 2))
            name, _, detail = status.partition(": ")
            recorded[(kind, model_type.strip("`"))] = families.Outcome(name, detail.replace("\\|", "|"))
    return recorded


def table(results: dict[families.Family, families.Outcome]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = []
    for kind, title in (("text", "Decoder-only causal LMs"), ("image-text", "Image-text-to-text models")):
        rows = [(f, o) for f, o in results.items() if f.kind == kind]
        counts = {s: sum(o.status == s for _, o in rows) for s in ("pass", "refused", "not-tried", "mismatch", "crash")}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        lines += [f"**{title}** ({len(rows)}: {summary})", "", "| family | class | status |", "|---|---|---|"]
        for family, outcome in rows:
            status = outcome.status if not outcome.detail else f"{outcome.status}: {cell(outcome.detail)}"
            lines.append(f"| `{family.model_type}` | `{family.class_name}` | {status} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--only", default="", help="comma-separated model types (default: all)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write the table or the status file")
    parser.add_argument(
        "--new", action="store_true",
        help="survey only the families this transformers offers that have no record (a new release), and write "
        "them in among the recorded ones; records of families it no longer offers are dropped",
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    only = {t for t in args.only.split(",") if t}
    offered = families.all_families()
    recorded = recorded_outcomes() if args.new else {}
    chosen = [f for f in offered if (not only or f.model_type in only) and (f.kind, f.model_type) not in recorded]
    results = {}
    for family in chosen:
        start = time.perf_counter()
        results[family] = outcome = run_one(family, families.SURVEY_LENGTHS)
        print(
            f"{family.kind:10s} {family.model_type:28s} {outcome.status:9s} {time.perf_counter() - start:5.1f}s "
            f"{outcome.detail[:150]}",
            flush=True,
        )
    bad = [f.model_type for f, o in results.items() if o.status in ("mismatch", "crash")]
    if args.no_write or only:
        return 1 if bad else 0
    if args.new:  # every family offered, in the survey's order: the new outcomes among the recorded ones
        results = {f: results.get(f) or recorded[(f.kind, f.model_type)] for f in offered}
    text = TABLE_PAGE.read_text()
    head, rest = text.split(START)
    _, tail = rest.split(END)
    TABLE_PAGE.write_text(f"{head}{START}\n{table(results)}{END}{tail}")
    status = {f"{f.kind}:{f.model_type}": o.status for f, o in results.items()}
    STATUS.write_text(json.dumps(status, indent=1, sort_keys=True) + "\n")
    wrote = f"{TABLE_PAGE.relative_to(ROOT)} and {STATUS.relative_to(ROOT)}"
    print(f"wrote {wrote}; mismatches or crashes: {bad or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
