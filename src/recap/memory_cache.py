"""One persistent memory per model in the user's cache, so a second process starts warm.

``cached_memory(model, processor)`` returns the memory kept for that model, method and k in
``recap.core.persist.cache_dir() / "memory"`` (``$RECAP_CACHE`` or ``~/.cache/recap``), or a fresh
one, and the path to save it back to::

    memory, path = recap.cached_memory(model, processor)
    result = recap.generate(model, inputs, memory=memory)
    memory.save(path)

The file is named after the model: an embedded model by its name (``tiny-qwen2.5-vl``,
``tiny-qwen2.5-vl@0.5b``), any other model by its folder's or hub id's name plus a hash of the
resolved path (or the id) and the tokenizer's fingerprint, so two models never share a file. A
cache file that is damaged or does not fit (another vocabulary, tokenizer, method or k) is moved
aside to ``<name>.bad`` with one warning, and a fresh memory is returned: the cache never makes a
run fail. Saving is atomic (``TokenMemory.save``); two processes saving at once leave one of the two
memories, complete (the last writer wins).

Beside it, ``<name>.step-costs.json`` keeps the step-cost model's times (``step_costs_path``,
``load_step_costs``, ``save_step_costs``): they belong to this machine (``machine_fingerprint``), and a
process that starts from them skips the start-up probes of the tree sizes, several plain steps at a real
model's size. The file also keeps the linear kernel chosen per layer shape and row count on a CPU
(``backends.few_row_linear``), so that the first forward of each tree size does not time both kernels again.
Another machine's (or torch build's, device's, dtype's, thread count's) times are not used.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from . import zoo
from .backends import few_row_linear
from .config import RecapConfig
from .core.memory import TokenMemory, load_memory
from .core.persist import cache_dir, tokenizer_fingerprint, write_atomic
from .core.step_cost import StepCost
from .core.vocab import output_vocab_size
from .drafters import PERSISTENT_METHODS, memory_k
from .errors import InputError, MemoryFileError
from .version import __version__

SUFFIX = ".safetensors"


class CachedMemory(NamedTuple):
    memory: TokenMemory
    path: Path  # where to save it back (``memory.save(path)``)


def _embedded(identity: str) -> str | None:
    """The embedded model's name (with its ``@shape``, if any) that ``identity`` names, else None."""
    base = identity.split("@", 1)[0]
    if base in zoo.NAMES:
        return identity
    folder = Path(identity).expanduser()
    try:
        if folder.is_dir() and folder.resolve().parent == zoo.ROOT.resolve() and folder.name in zoo.NAMES:
            return folder.name
    except OSError:
        pass
    return None


def model_key(identity: str, fingerprint: str) -> str:
    """The file-name stem of a model's memory: the embedded name, or a readable name plus a hash of
    the resolved folder (or the hub id) and the tokenizer fingerprint."""
    name = _embedded(identity)
    if name is not None:
        return re.sub(r"[^A-Za-z0-9._@-]", "_", name)
    folder = Path(identity).expanduser()
    if folder.exists():
        resolved = folder.resolve()
        readable, ident = resolved.name, f"path:{resolved}"
    else:
        readable, ident = identity.replace("/", "--"), f"hub:{identity}"
    digest = hashlib.sha256(f"{ident}\0{fingerprint}".encode()).hexdigest()[:16]
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', readable)[:64]}-{digest}"


def _identity(model: Any, name: str | None) -> str:
    if name:
        return str(name)
    identity = getattr(getattr(model, "config", None), "name_or_path", "") or ""
    if not identity:
        raise InputError(
            "cannot tell which model this is (model.config.name_or_path is empty, e.g. a model built from a "
            "config); pass name='...' to cached_memory, a name that identifies the model"
        )
    return str(identity)


def _resolve_k(method: str, k: int | None) -> int:
    if method not in PERSISTENT_METHODS:
        raise InputError(f"only {', '.join(PERSISTENT_METHODS)} keep a persistent memory, not {method!r}")
    return memory_k(method, RecapConfig()) if k is None else int(k)


def memory_cache_path(
    model: Any, processor: Any = None, method: str = "recap", k: int | None = None, *, name: str | None = None
) -> Path:
    """The cache file of ``model``'s ``method`` memory with ``k`` candidates per row (default: the
    method's default k). ``name`` overrides ``model.config.name_or_path`` as the model's identity."""
    k = _resolve_k(method, k)
    fingerprint = tokenizer_fingerprint(processor if processor is not None else model)
    return cache_dir() / "memory" / f"{model_key(_identity(model, name), fingerprint)}.{method}-k{k}{SUFFIX}"


def _file_state(path: Path) -> tuple[int, int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=4)  # the caller of cached_memory


def cached_memory(
    model: Any,
    processor: Any = None,
    method: str = "recap",
    k: int | None = None,
    *,
    name: str | None = None,
    warn: Callable[[str], None] | None = None,
) -> CachedMemory:
    """(memory, path): the memory saved for ``model`` in the user's cache, or a fresh one, and the file
    to save it back to. ``processor``: its tokenizer (or the tokenizer itself) checks the file's
    fingerprint. A damaged or mismatched cache file is renamed to ``<file>.bad``, ``warn`` (default:
    ``warnings.warn``) gets one line naming it and the problem, and a fresh memory comes back."""
    path = memory_cache_path(model, processor, method, k, name=name)
    k = _resolve_k(method, k)
    vocab = output_vocab_size(model)
    fingerprint = tokenizer_fingerprint(processor if processor is not None else model)
    fresh = TokenMemory(vocab, k=k, method=method, fingerprint=fingerprint)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only cache: the memory still works, saving it will say why it cannot
        pass
    return CachedMemory(open_or_fresh(path, fresh, processor if processor is not None else model, warn), path)


def open_or_fresh(path: Path, fresh: TokenMemory, expected: Any = None, warn: Callable[[str], None] | None = None):
    """The memory saved at ``path`` if it is a valid memory like ``fresh`` (vocabulary, method, k;
    ``expected``: the model or tokenizer it must fit), else ``fresh``. A damaged or mismatched file is
    renamed to ``<file>.bad`` and ``warn`` (default: ``warnings.warn``) gets one line naming it and
    the problem: never a failure. (The CLI's cache file and a vLLM server's snapshot use this.)"""
    state = _file_state(path)
    if state is None:
        return fresh
    vocab, method, k = fresh.vocab_size, fresh.method, fresh.k
    try:
        memory = load_memory(path, expected=expected)
        problem = None
        if memory.vocab_size != vocab:
            problem = f"memory file {path} covers {memory.vocab_size} tokens but the model has {vocab} output logits"
        elif memory.method != method or memory.k != k:
            problem = f"memory file {path} holds a {memory.method} memory with k={memory.k}, not {method} k={k}"
    except MemoryFileError as exc:
        problem = str(exc)
    if problem is None:
        return memory
    _move_aside(path, state, problem, "started with a fresh memory", warn)
    return fresh


def _move_aside(
    path: Path, state: tuple[int, int, int], problem: str, then: str, warn: Callable[[str], None] | None
) -> None:
    """Rename a bad cache file to ``<file>.bad`` (unless another process has just replaced it) and say so."""
    bad = path.with_name(path.name + ".bad")
    if _file_state(path) == state:
        try:
            os.replace(path, bad)
            where = f"moved it to {bad.name}"
        except OSError as exc:
            where = f"could not move it aside ({exc.strerror or exc})"
    else:  # another process has just written a new file there: leave it
        where = "left it (it changed meanwhile)"
    (warn or _warn)(f"{problem}; {where} and {then}")


# -- the step-cost model's times ------------------------------------------------------------
STEP_COSTS_FORMAT = "recap-step-costs"
STEP_COSTS_VERSION = 1


def step_costs_path(memory_path: Path) -> Path:
    """The step-cost file kept beside a cached memory file: ``<name>.step-costs.json``."""
    return memory_path.with_name(memory_path.name.removesuffix(SUFFIX) + ".step-costs.json")


def _processor_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_fingerprint(model: torch.nn.Module) -> dict[str, Any]:
    """What a model's step times depend on besides the model: the processor, its cores, the torch
    build, the device, the dtype and the caller's torch thread count."""
    parameter = next(model.parameters())
    device = parameter.device
    return {
        "processor": _processor_name(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "dtype": str(parameter.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
    }


def save_step_costs(cost: StepCost, path: Path, machine: dict[str, Any]) -> bool:
    """Write ``cost``'s step times to ``path`` atomically, with the ``machine`` they were measured on
    (``machine_fingerprint``). False, nothing written, while its start-up probes are not done."""
    times = cost.snapshot()
    if times is None:
        return False
    data = {
        "format": STEP_COSTS_FORMAT,
        "format_version": STEP_COSTS_VERSION,
        "machine": machine,
        "max_nodes": cost.sizes[-1],
        "times": {str(size): values for size, values in times.items()},  # seconds at the reference speed
        # [out, in, bias, rows, threads, kernel] of each linear shape decided on this machine's CPU
        "linear_kernels": [[*key, kernel] for key, kernel in few_row_linear.choices().items()],
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "recap_version": __version__,
    }
    write_atomic(path, json.dumps(data, indent=1).encode("utf-8"))
    return True


def load_step_costs(
    cost: StepCost, path: Path, machine: dict[str, Any], warn: Callable[[str], None] | None = None
) -> bool:
    """Start ``cost`` (before its first step) from the times saved at ``path`` if they were measured
    on this ``machine`` for the same tree sizes, and take the linear kernel choices saved with them
    (``few_row_linear.restore``); True if it did. No file, or another machine's times:
    False, nothing said. A damaged file (any part of it) is renamed to ``<file>.bad`` with one line to ``warn``
    (default: ``warnings.warn``), and none of it is taken: never a failure."""
    state = _file_state(path)
    if state is None:
        return False
    try:
        data = json.loads(path.read_bytes())
        if not isinstance(data, dict) or data.get("format") != STEP_COSTS_FORMAT:
            raise ValueError(f"it is not a {STEP_COSTS_FORMAT} file")
        if data.get("format_version") != STEP_COSTS_VERSION:
            raise ValueError(f"format version {data.get('format_version')!r}, this recap reads {STEP_COSTS_VERSION}")
        times = data.get("times")
        if not isinstance(times, dict) or not all(isinstance(v, list) for v in times.values()):
            raise ValueError("'times' must map sizes to lists of seconds")
        kernels = data.get("linear_kernels", [])  # absent from the files of recap before it
        if not isinstance(kernels, list) or not all(isinstance(k, list) and len(k) == 6 for k in kernels):
            raise ValueError("'linear_kernels' must be a list of [out, in, bias, rows, threads, kernel]")
        if data.get("machine") != machine or data.get("max_nodes") != cost.sizes[-1]:
            return False  # another machine's times (or another ladder): this process probes, and saves its own
        choices = {tuple(k[:5]): k[5] for k in kernels}
        few_row_linear.checked(choices)  # the whole file is checked before any of it is taken
        restored = cost.restore({int(size): values for size, values in times.items()})
        few_row_linear.restore(choices)
        return restored
    except (OSError, ValueError, TypeError) as exc:  # a JSON error is a ValueError
        problem = f"step-cost file {path} is not valid ({exc})"
    _move_aside(path, state, problem, "timed the tree sizes afresh", warn)
    return False
