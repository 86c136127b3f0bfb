"""The checks for the first GPU machine lent, in one command (``make gpu-check``), about 8 minutes on one GPU.

    PYTHONPATH=src:. python3 -m tools.gpu_check [--out DIR]

Runs from the repository with the machine's own python3 (torch, transformers, numba, pytest, typer, rich,
safetensors preinstalled; no virtual environment): the lossless tests on CUDA (float32 across the
architectures, the bfloat16 near-tie tests), ``recap bench`` on both embedded models (CUDA, float32, so any
mismatch is a bug) and on the 7B-shape model (``tiny-qwen2.5-vl@7b``, bfloat16: trained-tiny predictions at
real-shape compute), and the verify-cost curve (ms of one tree forward per tree size) of the tiny model and
the 7B shape. Writes one markdown report, ``DIR/gpu_check.md`` (default: ``$OUT`` where set, else
``gpu_check_out``), with the bench's results.json files and a log beside it. Without CUDA it runs the
CPU-safe parts in seconds (a one-request bench smoke and a small cost curve on the tiny model) and says,
one line each, which CUDA parts it skipped. A part that fails or runs out of its time is reported with
the tail of its output; the others still run. Without numba the drafting runs as plain Python
(``recap.jit``): correct, but the bench's timings are then pessimistic, and the report says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ("tiny-qwen2.5-vl", "tiny-llava-next")
BIG = "tiny-qwen2.5-vl@7b"
LOSSLESS_TESTS = ("tests/test_lossless.py::test_every_method_matches_generate", "tests/test_precision.py")
BENCH_ARGS = ("--suite", "ocr,chart,describe", "--samples", "2", "--max-new-tokens", "128")
BENCH_METHODS = "generate,pld,token_recycling,recap"
MIN_TRANSFORMERS = (5, 19)  # pyproject's pin; GPU machines here have had 5.17 preinstalled


class Check:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.lines: list[str] = []
        self.log = (out / "gpu_check.log").open("w")
        self.env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])
        )
        self.env["PYTHONUNBUFFERED"] = "1"

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def skip(self, part: str, why: str) -> None:
        print(f"skipped: {part} ({why})", flush=True)
        self.lines.append(f"- skipped: {part} ({why})")

    def run(self, title: str, command: list[str], timeout: int, extra_env: dict[str, str] | None = None):
        """(return code or None if it ran out of time, output, seconds)."""
        print(f"== {title}: {' '.join(command)} (at most {timeout} s)", flush=True)
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                command,
                cwd=ROOT,
                env={**self.env, **(extra_env or {})},
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            code = None
            output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        seconds = time.perf_counter() - start
        self.log.write(f"\n===== {title} ({seconds:.0f} s, rc {code})\n{output}\n")
        self.log.flush()
        return code, output, seconds

    def tail(self, output: str, lines: int = 15) -> None:
        self.lines.extend(["```", *output.strip().splitlines()[-lines:], "```", ""])


def environment(check: Check, cuda: bool) -> None:
    import torch
    import transformers

    import recap
    from recap.jit import HAVE_NUMBA

    check.say("# recap GPU check")
    check.say()
    device = torch.cuda.get_device_name(0) if cuda else f"no CUDA device ({platform.processor() or platform.machine()})"
    check.say(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    check.say(f"- device: {device}; {os.cpu_count()} CPU cores")
    check.say(
        f"- python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"transformers {transformers.__version__}, recap {recap.__version__}"
    )
    version = tuple(int(part) for part in transformers.__version__.split(".")[:2] if part.isdigit())
    if version < MIN_TRANSFORMERS:
        check.say(
            f"- transformers {transformers.__version__} is older than recap supports "
            f"({'.'.join(map(str, MIN_TRANSFORMERS))}): with 5.17 on a CPU these parts and the lossless tests passed; "
            "a failure here may be the version's"
        )
    if HAVE_NUMBA:
        import numba

        check.say(f"- numba {numba.__version__}: the drafting kernels are compiled")
    else:
        check.say("- numba missing: recap.jit runs the kernels as plain Python (correct); host timings are pessimistic")
    check.say()


def lossless(check: Check) -> None:
    check.say("## Lossless tests on CUDA")
    check.say()
    command = [sys.executable, "-m", "pytest", *LOSSLESS_TESTS, "-q", "-rf", "-p", "no:cacheprovider"]
    code, output, seconds = check.run("lossless tests", command, 240, {"RECAP_TEST_DEVICE": "cuda"})
    summary = next((line for line in reversed(output.splitlines()) if " in " in line and "=" in line), "")
    if code is None:
        check.say(f"TIMED OUT after {seconds:.0f} s ({', '.join(LOSSLESS_TESTS)})")
    else:
        check.say(f"{'PASSED' if code == 0 else 'FAILED'}: `{' '.join(LOSSLESS_TESTS)}` on cuda: {summary.strip('= ')}")
    check.say()
    failed = [line for line in output.splitlines() if line.startswith("FAILED")]
    if failed or code:
        check.tail("\n".join(failed) or output, 30)


def bench(check: Check, model: str, dtype: str, device: str, args: tuple[str, ...], methods: str, timeout: int) -> None:
    from recap.bench.report import COLUMNS, table_rows

    folder = Path(tempfile.mkdtemp(prefix="recap-gpu-check-"))
    command = [sys.executable, "-m", "recap.cli", "bench", "--model", model, "--device", device, "--dtype", dtype]
    command += [*args, "--methods", methods, "--out", str(folder)]
    code, output, seconds = check.run(f"bench {model}", command, timeout)
    check.say(f"## Bench: `{model}` ({device}, {dtype})")
    check.say()
    results_file = folder / "results.json"
    if not results_file.is_file():
        check.say(f"FAILED (rc {code}, {seconds:.0f} s): no results")
        check.tail(output)
        return
    results = json.loads(results_file.read_text())
    shutil.copyfile(results_file, check.out / f"{model.replace('@', '_at_')}.results.json")
    settings = results["settings"]
    if settings.get("model_note"):
        check.say(f"**{settings['model_note']}**")
        check.say()
    check.say(f"{settings['workload']}, {seconds:.0f} s in all, rc {code}")
    check.say()
    check.say("| method | " + " | ".join(c[0] for c in COLUMNS) + " |")
    check.say("|" + "---|" * (len(COLUMNS) + 1))
    for row in table_rows(results["overall"]):
        check.say("| " + " | ".join(row) + " |")
    check.say()
    costs = results.get("costs")
    if costs:
        check.say(
            "verify ms per tree size: "
            + ", ".join(f"{n}: {ms:.2f}" for n, ms in zip(costs["sizes"], costs["verify_ms"]))
        )
        check.say(f"; generate {costs['generate_ms_per_token'] or 0:.2f} ms per token")
        check.say()
    mismatches = results.get("mismatches") or []
    if mismatches:
        note = (
            " (bfloat16: a divergence at a near-tie is expected, see docs/results.md#precision)"
            if dtype != "float32"
            else " (float32: A BUG)"
        )
        check.say(f"**{len(mismatches)} outputs differ from generate**{note}")
        check.say()
    elif code:
        check.tail(output)


def cost_curve(check: Check, model_name: str, device: str, dtype: str, max_nodes: int, repeats: int) -> None:
    import torch

    from recap.bench.verify_costs import measure_costs
    from recap.bench.workloads import suite_requests
    from recap.loading import build_inputs, load_model, model_device

    start = time.perf_counter()
    try:
        model, processor = load_model(model_name, device=device, dtype=dtype)
        request = suite_requests("ocr", 1, seed=0)[0]
        inputs = build_inputs(processor, request.prompt, request.image, device=model_device(model))
        costs = measure_costs(model, inputs, max_nodes, repeats=repeats, calls=3, generate_tokens=16)
    except Exception as exc:  # reported, the other parts still run
        check.say(f"## Verify cost: `{model_name}` ({device}, {dtype})")
        check.say()
        check.say(f"FAILED: {type(exc).__name__}: {exc}")
        check.say()
        return
    finally:
        model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    base = costs["verify_ms"][0]
    check.say(f"## Verify cost: `{model_name}` ({device}, {dtype}, {time.perf_counter() - start:.0f} s)")
    check.say()
    check.say("| nodes | " + " | ".join(str(s) for s in costs["sizes"]) + " |")
    check.say("|---|" + "---|" * len(costs["sizes"]))
    check.say("| ms | " + " | ".join(f"{ms:.2f}" for ms in costs["verify_ms"]) + " |")
    check.say("| x 1 node | " + " | ".join(f"{ms / base:.2f}" for ms in costs["verify_ms"]) + " |")
    check.say()
    check.say(f"generate: {costs['generate_ms_per_token'] or 0:.2f} ms per token")
    check.say()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_check_out"))
    parser.add_argument("--cpu", action="store_true", help="run the CPU-safe parts only, even where CUDA is available")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    cuda = torch.cuda.is_available() and not args.cpu
    check = Check(args.out)
    environment(check, cuda)
    started = time.perf_counter()
    if cuda:
        lossless(check)
        for model in TINY:
            bench(check, model, "float32", "cuda", BENCH_ARGS, BENCH_METHODS, 100)
        bench(check, BIG, "bfloat16", "cuda", BENCH_ARGS, "generate,pld,recap", 170)
        cost_curve(check, TINY[0], "cuda", "float32", 256, repeats=3)
        cost_curve(check, BIG, "cuda", "bfloat16", 256, repeats=3)
    else:
        reason = "no CUDA device" if not torch.cuda.is_available() else "--cpu"
        check.say("## CPU-safe parts")
        check.say()
        check.skip("the lossless tests on CUDA (float32 across architectures, bfloat16 near-ties)", reason)
        check.skip(f"the CUDA bench of {', '.join(TINY)} (float32)", reason)
        check.skip(f"the CUDA bench of {BIG} (bfloat16)", reason)
        check.skip(f"the CUDA verify-cost curves of {TINY[0]} and {BIG}", reason)
        check.say()
        smoke = ("--suite", "ocr", "--samples", "1", "--max-new-tokens", "16", "--no-costs")
        bench(check, TINY[0], "float32", "cpu", smoke, "generate,recap", 300)
        cost_curve(check, TINY[0], "cpu", "float32", 8, repeats=1)
    check.say(f"All parts: {time.perf_counter() - started:.0f} s.")
    report = args.out / "gpu_check.md"
    report.write_text("\n".join(check.lines) + "\n")
    check.log.close()
    print(f"wrote {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
