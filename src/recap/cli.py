"""The ``recap`` command: generate, bench, memory."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from .drafters import METHODS, PERSISTENT_METHODS
from .errors import RecapError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Lossless speculative decoding for VLMs and LLMs.")
memory_app = typer.Typer(no_args_is_help=True, help="Inspect saved persistent memories.")
app.add_typer(memory_app, name="memory")

ModelOption = Annotated[
    str,
    typer.Option("--model", "-m", help="embedded model name (e.g. tiny-qwen2.5-vl), local directory or cached hub id"),
]
DeviceOption = Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:1, ...")]
DtypeOption = Annotated[str, typer.Option(help="auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16, float16")]
MemoryFileOption = Annotated[
    Path | None,
    typer.Option("--memory-file", help="persistent memory: loaded before if the file exists, saved after"),
]


def fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code)


def open_memory_file(path: Path | None, model, processor, method: str, k: int):
    """The memory in ``path`` (validated against the model's vocabulary and the tokenizer's
    fingerprint) or a new one if the file does not exist yet; None without a path."""
    if path is None:
        return None
    from .backends.hf import output_vocab_size
    from .memory import TokenMemory
    from .persist import load_memory, tokenizer_fingerprint

    if method not in PERSISTENT_METHODS:
        fail(f"--memory-file needs a method with a persistent memory ({', '.join(PERSISTENT_METHODS)}), not {method}")
    if path.exists():
        memory = load_memory(path, expected=processor)
        vocab = output_vocab_size(model)
        if memory.vocab_size != vocab:
            fail(f"{path} covers a vocabulary of {memory.vocab_size} tokens but the model has {vocab}")
        if memory.method != method:
            fail(f"{path} holds a {memory.method} memory; use it with --method {memory.method} or pick another file")
        return memory
    return TokenMemory(output_vocab_size(model), k=k, method=method, fingerprint=tokenizer_fingerprint(processor))


@app.command()
def generate(
    model: ModelOption,
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="the user's question or instruction")],
    image: Annotated[Path | None, typer.Option("--image", "-i", help="image file (for vision-language models)")] = None,
    method: Annotated[str, typer.Option(help=f"one of {', '.join(METHODS)}")] = "recap",
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 128,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object: text, token_ids, stats")] = False,
    memory_file: MemoryFileOption = None,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "auto",
) -> None:
    """Generate an answer greedily, accelerated by speculative decoding (same tokens as plain greedy)."""
    from . import generate as recap_generate
    from .config import RecapConfig
    from .loading import build_inputs, decode, load_model
    from .persist import save_memory

    if method not in METHODS:
        fail(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    try:
        loaded, processor = load_model(model, device=device, dtype=dtype)
        config = RecapConfig()
        memory = open_memory_file(memory_file, loaded, processor, method, config.k if method == "recap" else 8)
        inputs = build_inputs(processor, prompt, image)
        result = recap_generate(
            loaded, inputs, method=method, max_new_tokens=max_new_tokens, config=config, memory=memory
        )
        if memory_file is not None:
            save_memory(memory, memory_file)
    except (RecapError, ValueError, OSError) as exc:
        fail(str(exc))
    text = decode(processor, result.token_ids)
    if as_json:
        print(json.dumps({"text": text, "token_ids": result.token_ids, "stats": result.stats.to_dict()}))
    else:
        print(text)
        typer.secho(result.stats.summary(), err=True, fg=typer.colors.CYAN)


@memory_app.command("info")
def memory_info_command(file: Annotated[Path, typer.Argument(help="a memory file written by recap")]) -> None:
    """Show what a memory file holds (validating it fully)."""
    from .persist import memory_info

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
