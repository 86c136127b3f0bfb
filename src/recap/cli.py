"""The ``recap`` command: generate, bench, memory."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from .drafters import METHODS, PERSISTENT_METHODS, memory_k
from .errors import RecapError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Lossless speculative decoding for VLMs and LLMs.")
memory_app = typer.Typer(no_args_is_help=True, help="Inspect saved persistent memories.")
app.add_typer(memory_app, name="memory")

ModelOption = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="embedded model name (e.g. tiny-qwen2.5-vl, or tiny-qwen2.5-vl@7b: its predictions at a real model's "
        "shape), local directory or cached hub id",
    ),
]
DeviceOption = Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:1, ...")]
DtypeOption = Annotated[str, typer.Option(help="auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16, float16")]
MemoryFileOption = Annotated[
    Path | None,
    typer.Option("--memory-file", help="persistent memory: loaded before if the file exists, saved after"),
]
NoMemoryFileOption = Annotated[
    bool,
    typer.Option(
        "--no-memory-file",
        help="keep no memory file (by default generate keeps one per model in $RECAP_CACHE or ~/.cache/recap)",
    ),
]


def fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)


def check_memory_file(path: Path | None, method: str) -> None:
    """Fail fast, before the (possibly slow) model load: ``--memory-file`` with a method that
    has no persistent memory, or an existing file that is not a valid memory for ``method``."""
    if path is None:
        return
    from .core.persist import memory_info

    if method not in PERSISTENT_METHODS:
        fail(f"--memory-file needs a method with a persistent memory ({', '.join(PERSISTENT_METHODS)}), not {method}")
    if not path.parent.is_dir():
        fail(f"the folder of --memory-file {path} does not exist; create it first")
    if path.exists():
        held = memory_info(path)["method"]  # validates the whole file; raises MemoryFileError naming it
        if held != method:
            fail(f"{path} holds a {held} memory; use it with --method {held} or pick another file")


def open_memory_file(path: Path | None, model, processor, method: str, k: int):
    """The memory in ``path`` (validated against the model's vocabulary and the tokenizer's
    fingerprint) or a new one if the file does not exist yet; None without a path. Called
    after ``check_memory_file``, which has checked the method and the file itself."""
    if path is None:
        return None
    from .backends.hf import output_vocab_size
    from .core.memory import TokenMemory, load_memory
    from .core.persist import tokenizer_fingerprint

    if path.exists():
        memory = load_memory(path, expected=processor)
        vocab = output_vocab_size(model)
        if memory.vocab_size != vocab:
            fail(f"{path} covers a vocabulary of {memory.vocab_size} tokens but the model has {vocab}")
        return memory
    return TokenMemory(output_vocab_size(model), k=k, method=method, fingerprint=tokenizer_fingerprint(processor))


def warn(message: str) -> None:
    typer.secho(f"warning: {message}", err=True, fg=typer.colors.YELLOW)


def open_cached_memory(name: str, model, processor, method: str, k: int):
    """(memory, path) of ``recap generate``'s default: the model's memory file in the user's cache
    (``recap.memory_cache``; a damaged or mismatched one is moved aside with one warning line)."""
    from .memory_cache import cached_memory

    return cached_memory(model, processor, method, k, name=name, warn=warn)


def cached_step_costs(model, memory_path: Path, config):
    """(step-cost model, file, machine) of ``recap generate``'s cached memory: the model's step-cost model,
    started from the times saved beside the memory file on this machine (``recap.memory_cache``), if any."""
    from .entry import step_cost
    from .memory_cache import load_step_costs, machine_fingerprint, step_costs_path

    cost, path, machine = (
        step_cost(model, config.node_budget + 1),
        step_costs_path(memory_path),
        machine_fingerprint(model),
    )
    load_step_costs(cost, path, machine, warn=warn)
    return cost, path, machine


@app.command()
def generate(
    model: ModelOption,
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="the user's question or instruction")],
    image: Annotated[Path | None, typer.Option("--image", "-i", help="image file (for vision-language models)")] = None,
    method: Annotated[str, typer.Option(help=f"one of {', '.join(METHODS)}")] = "recap",
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 128,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object: text, token_ids, stats")] = False,
    temperature: Annotated[float | None, typer.Option(min=0.0, help="sample with this temperature")] = None,
    top_p: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="sample from the top-p nucleus")] = None,
    top_k: Annotated[int | None, typer.Option(min=0, help="sample from the k most likely tokens")] = None,
    seed: Annotated[int | None, typer.Option(help="torch.manual_seed before decoding (reproducible sampling)")] = None,
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="print tokens as they are committed")] = True,
    memory_file: MemoryFileOption = None,
    no_memory_file: NoMemoryFileOption = False,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
) -> None:
    """Generate an answer, accelerated by speculative decoding: the same tokens as the model's own generate
    with the same settings (greedy by default; --temperature, --top-p or --top-k sample, --seed reproduces)."""
    from transformers import TextStreamer

    from .config import RecapConfig
    from .core.memory import save_memory
    from .entry import generate as recap_generate
    from .loading import build_inputs, decode, load_model, model_device, sampling_arguments

    if method not in METHODS:
        fail(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    if memory_file is not None and no_memory_file:
        fail("--memory-file and --no-memory-file contradict each other: give one of them")
    sampling = sampling_arguments(temperature, top_p, top_k)
    try:
        check_memory_file(memory_file, method)
        loaded, processor = load_model(model, device=device, dtype=dtype)
        note = getattr(loaded.config, "recap_note", None)  # the real-shape embedded models say what they are
        if note:
            typer.secho(f"{model}: {note}", err=True, fg=typer.colors.CYAN)
        config = RecapConfig()
        k = memory_k(method, config)
        memory, save_to, cached = open_memory_file(memory_file, loaded, processor, method, k), memory_file, False
        if memory_file is None and not no_memory_file and method in PERSISTENT_METHODS:
            (memory, save_to), cached = open_cached_memory(model, loaded, processor, method, k), True
        # beside the cached memory, this machine's step times of the model: a second run skips the start-up probes
        costs = cached_step_costs(loaded, save_to, config) if cached and method == "recap" else None
        inputs = build_inputs(processor, prompt, image, device=model_device(loaded))
        tokenizer = getattr(processor, "tokenizer", processor)
        streamer = (
            TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if stream and not as_json else None
        )
        if seed is not None:
            import torch

            torch.manual_seed(seed)
        result = recap_generate(
            loaded,
            inputs,
            method=method,
            max_new_tokens=max_new_tokens,
            config=config,
            memory=memory,
            streamer=streamer,
            **sampling,
        )
        if save_to is not None and not cached:
            save_memory(memory, save_to)
    except (RecapError, ValueError, OSError) as exc:
        fail(str(exc))
    if cached:  # the cache never makes a run fail
        try:
            save_memory(memory, save_to)
        except (ValueError, OSError) as exc:
            warn(f"could not save the memory to {save_to} ({exc}); the next run starts cold")
    if costs is not None:
        from .memory_cache import save_step_costs

        try:
            save_step_costs(*costs)
        except (ValueError, OSError) as exc:
            warn(f"could not save the step costs to {costs[1]} ({exc}); the next run times the tree sizes afresh")
    text = decode(processor, result.token_ids)
    if as_json:
        shown = str(save_to) if save_to is not None else None
        print(
            json.dumps(
                {"text": text, "token_ids": result.token_ids, "stats": result.stats.to_dict(), "memory_file": shown}
            )
        )
    else:
        if streamer is None:
            print(text)
        typer.secho(result.stats.summary(), err=True, fg=typer.colors.CYAN)


@app.command()
def bench(
    model: ModelOption = "tiny-qwen2.5-vl",
    suite_families: Annotated[
        str, typer.Option("--suite", help="suite families, comma-separated, or 'all' (ignored with --data)")
    ] = "all",
    data: Annotated[Path | None, typer.Option(help='JSONL file of {"image": path, "prompt": text} rows')] = None,
    samples: Annotated[int, typer.Option(min=1, help="requests per suite family (with --data: rows at most)")] = 5,
    seed: Annotated[
        int,
        typer.Option(
            help="suite seed (the embedded models were trained on other seeds); when sampling, request i is also "
            "decoded after torch.manual_seed(seed + i) by every method"
        ),
    ] = 0,
    temperature: Annotated[
        float | None, typer.Option(min=0.0, help="sampling mode: every method samples like generate(do_sample=True)")
    ] = None,
    top_p: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="sampling mode: top-p")] = None,
    top_k: Annotated[int | None, typer.Option(min=0, help="sampling mode: top-k")] = None,
    methods: Annotated[
        str | None,
        typer.Option(
            help="comma-separated methods (generate, hf-prompt-lookup, ar, pld, token_recycling, recap) or RECAP "
            "variants such as 'recap[paper,budget=31]'; 'generate' is always added as the reference. Default: all "
            "methods that can run on the model"
        ),
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 200,
    memory: Annotated[
        str, typer.Option(help="warm: persistent memories carried across requests; cold: reset")
    ] = "warm",
    repeats: Annotated[
        int,
        typer.Option(
            min=1,
            help="decode each request this many times per method, each time from the same memory state, and keep "
            "the median run: steadier ratios on a machine whose speed jumps (shared or virtual CPUs); takes this "
            "many times as long",
        ),
    ] = 1,
    ablate: Annotated[
        bool, typer.Option("--ablate", help="add RECAP without each of its parts, and the paper's setting")
    ] = False,
    budgets: Annotated[
        str | None,
        typer.Option(help="comma-separated node budgets: adds the paper's RECAP and ours at each fixed budget"),
    ] = None,
    costs: Annotated[
        bool, typer.Option("--costs/--no-costs", help="measure the verify cost per tree size and the ceilings")
    ] = True,
    out: Annotated[Path | None, typer.Option(help="output folder (default bench_out/<model>)")] = None,
    memory_file: MemoryFileOption = None,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
    threads: Annotated[int, typer.Option(help="torch CPU threads (0: leave the default)")] = 0,
) -> None:
    """Measure every method's speed against the model's own generate, and check every output is identical."""
    import torch
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from .bench import plan as bench_plan
    from .bench import write
    from .bench.report import NOISY_STEAL, columns, table_rows, threads_line
    from .core.memory import save_memory
    from .loading import load_model, sampling_arguments

    if memory not in ("warm", "cold"):
        fail(f"--memory must be warm or cold, not {memory!r}")
    if memory_file is not None and memory == "cold":
        fail("--memory-file carries RECAP's memory across requests; it cannot be combined with --memory cold")
    if threads:
        torch.set_num_threads(threads)
    sampling = sampling_arguments(temperature, top_p, top_k)
    console = Console(width=max(140, shutil.get_terminal_size().columns))
    try:
        plan = bench_plan.plan(methods, ablate, budgets, data, suite_families, samples, seed, sampling)
        if memory_file is not None and "recap" not in [spec.name for spec in plan.specs]:
            fail("--memory-file holds RECAP's memory, but recap is not among --methods")
        check_memory_file(memory_file, "recap")
        loaded, processor = load_model(model, device=device, dtype=dtype)
        left_out = bench_plan.drop_unrunnable_defaults(plan, loaded, methods_given=methods is not None)
        if left_out:
            console.print(left_out)
        recap_memory = open_memory_file(memory_file, loaded, processor, "recap", bench_plan.MEMORY_FILE_K)
        first = next(iter(loaded.parameters()))
        settings = {"model": model, "device": str(first.device), "dtype": str(first.dtype).replace("torch.", "")}
        note = getattr(loaded.config, "recap_note", None)  # the real-shape embedded models say what they are
        if note:
            settings["model_note"] = note
            console.print(f"{model}: {note}")
        results, cost_table = bench_plan.execute(
            plan, loaded, processor, settings, max_new_tokens, memory, recap_memory, costs, seed, say=console.print,
            repeats=repeats,
        )  # fmt: skip
        workload = plan.workload
        out = out or Path("bench_out") / Path(model).name
        write(results, out)
        if memory_file is not None:
            save_memory(recap_memory, memory_file)
    except (RecapError, ValueError, OSError) as exc:
        fail(str(exc))
    decoding = ", ".join(f"{k} {v}" for k, v in sampling.items() if k != "do_sample") if sampling else "greedy"
    kept = f", median of {repeats} runs" if repeats > 1 else ""
    table = Table(title=f"{model}: {workload}, memory {memory}, max_new_tokens {max_new_tokens}, {decoding}{kept}")
    table.add_column("method", no_wrap=True)
    shown = columns(results)
    for title, key, _ in shown:
        widest = max(map(len, title.split()))  # headers wrap between words, never inside one
        table.add_column(title, justify="right", min_width=9 if key == "speedup_rounds" else widest)  # "1.06-1.31"
    for row in table_rows(results["overall"], shown):
        table.add_row(*(escape(cell) for cell in row))
    if cost_table:
        sizes = ", ".join(f"{n}: {ms:.2f}" for n, ms in zip(cost_table["sizes"], cost_table["verify_ms"]))
        console.print(
            f"verify ms per tree size ({sizes}); generate: {cost_table['generate_ms_per_token'] or 0:.2f} ms per token"
        )
    console.print(table)
    threads = threads_line(results["overall"])
    if threads:
        console.print(escape(threads))
    steal = results["settings"].get("cpu_steal")
    if steal is not None and steal >= NOISY_STEAL:
        console.print(
            f"note: the hypervisor took {steal:.0%} of this machine's CPU time during the run (steal), so step times "
            "jumped from request to request: rerun for the spread before trusting a ratio"
        )
    console.print(f"wrote {out / 'results.json'}, {out / 'report.md'} and plots")
    if results["failures"]:
        failed = sorted({f["method"] for f in results["failures"]})
        console.print(
            f"[bold yellow]{len(results['failures'])} runs of {', '.join(failed)} raised errors "
            "(left out of their aggregates; see report.md)[/bold yellow]"
        )
    if results["mismatches"]:
        console.print(
            f"[bold red]LOSSLESS VIOLATED: {len(results['mismatches'])} outputs differ from generate; "
            "see report.md[/bold red]"
        )
        raise typer.Exit(1)


@memory_app.command("info")
def memory_info_command(file: Annotated[Path, typer.Argument(help="a memory file written by recap")]) -> None:
    """Show what a memory file holds (validating it fully)."""
    from .core.persist import memory_info

    try:
        info = memory_info(file)
    except (RecapError, ValueError, OSError) as exc:
        fail(str(exc))
    for key, value in info.items():
        print(f"{key:14s} {value}")


def main() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    app(prog_name="recap")


if __name__ == "__main__":
    sys.exit(main())
