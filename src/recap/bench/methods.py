"""The methods a benchmark compares, all on the same model object."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..backends.hf import output_vocab_size
from ..config import RecapConfig
from ..core.memory import TokenMemory
from ..drafters import PERSISTENT_METHODS, memory_k
from ..entry import generate

REFERENCE = "generate"
PEERS = ("hf-prompt-lookup",)  # the model library's own methods, which may not support a model
ALL_METHODS = ("generate", "hf-prompt-lookup", "ar", "pld", "token_recycling", "recap")


@dataclass(frozen=True)
class MethodSpec:
    """A named way to decode: ``kind`` is a recap method or one of the library's own."""

    name: str
    kind: str
    config: RecapConfig = field(default_factory=RecapConfig)


VARIANT_HELP = (
    "recap[OPTIONS], options comma-separated: paper (the paper's setting as the base), budget=N (a fixed "
    "budget of N nodes), adaptive (choose the size per step, at most the budget), hit-mass / calibrated "
    "(scores), orders=1+2 (key lengths), fusion=entropy|fixed|strict, suffix=N, no-suffix, write=committed|full-tree "
    "(the rows learned: the accepted path's or every verified node's), row-value=X and row-nodes=N (the "
    "adaptive size counts each of the first N drafts' rows as worth X tokens), rows-anywhere (count them also "
    "where no tree pays on its drafts alone; rows-need-drafts: the default), no-persistence, "
    "no-fallback, no-persistent-context, persistent-context, fallback, fixed-threads (the caller's torch thread "
    "count at every step); e.g. recap[paper,budget=31]"
)


def variant_config(options: str) -> RecapConfig:
    """The config of ``recap[options]`` (see ``VARIANT_HELP``); a ValueError names a bad option."""
    parts = [p.strip() for p in options.split(",") if p.strip()]
    config = RecapConfig.paper() if "paper" in parts else RecapConfig()
    changes: dict[str, object] = {}
    adaptive = None
    last_key = None
    for part in parts:
        key, _, value = part.partition("=")
        if not value and key.isdigit() and last_key == "orders":  # recap[orders=1,2]
            changes["key_orders"] = (*changes["key_orders"], int(key))
            continue
        last_key = key
        try:
            if key == "paper":
                continue
            elif key == "budget":
                changes["node_budget"] = int(value)
            elif key in ("adaptive", "fixed"):
                adaptive = key == "adaptive"
            elif key in ("hit-mass", "calibrated"):
                changes["scoring"] = key
            elif key == "orders":
                changes["key_orders"] = tuple(int(o) for o in value.split("+"))
            elif key == "fusion":
                changes["fusion"] = value
            elif key == "suffix":
                changes["suffix_tokens"] = int(value)
            elif key == "write":
                changes["write_scope"] = value
            elif key == "row-value":
                changes["row_value"] = float(value)
            elif key in ("rows-need-drafts", "rows-anywhere"):
                changes["row_value_needs_drafts"] = key == "rows-need-drafts"
            elif key == "row-nodes":
                changes["row_value_nodes"] = int(value)
            elif key == "no-suffix":
                changes["suffix_tokens"] = 0
            elif key in ("no-persistence", "no-fallback", "no-persistent-context"):
                field = {"no-persistence": "persistent", "no-fallback": "frequency_fallback"}.get(key)
                changes[field or "persistent_context"] = False
            elif key == "fixed-threads":
                changes["adaptive_threads"] = False
            elif key in ("fallback", "persistent-context"):
                changes["frequency_fallback" if key == "fallback" else "persistent_context"] = True
            else:
                raise ValueError(f"unknown option {part!r}")
        except ValueError as exc:
            raise ValueError(f"recap[{options}]: {exc}. {VARIANT_HELP}") from None
    if "node_budget" in changes and adaptive is None:
        adaptive = False  # budget=N alone: that budget at every step
    if adaptive is not None:
        changes["adaptive_budget"] = adaptive
    return config.replace(**changes)


def ablation_specs() -> list[MethodSpec]:
    """RECAP without each of its parts (the default setting otherwise), and the paper's setting."""
    names = (
        "paper", "hit-mass", "fixed,budget=63", "no-persistent-context", "no-fallback", "no-suffix",
        "orders=1", "orders=1+2", "fusion=strict", "fusion=fixed", "no-persistence",
    )  # fmt: skip
    return [MethodSpec(f"recap[{name}]", "recap", variant_config(name)) for name in names]


def budget_specs(budgets: list[int]) -> list[MethodSpec]:
    """At each fixed budget: the paper's RECAP and ours (calibrated scores, fallback, persistent rows)."""
    specs = []
    for budget in budgets:
        for name in (f"paper,budget={budget}", f"budget={budget}"):
            specs.append(MethodSpec(f"recap[{name}]", "recap", variant_config(name)))
    return specs


def split_methods(names: str) -> list[str]:
    """Comma-separated names; commas inside [...] belong to the name."""
    out, depth, current = [], 0, ""
    for ch in names:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(current)
            current = ""
        else:
            current += ch
    out.append(current)
    return [n.strip() for n in out if n.strip()]


def parse_methods(names: str) -> list[MethodSpec]:
    """Methods by name (``ALL_METHODS``) and RECAP variants ``recap[...]`` (``VARIANT_HELP``);
    the reference ``generate`` is added first if missing."""
    specs = []
    for name in split_methods(names):
        if name.startswith("recap[") and name.endswith("]"):
            specs.append(MethodSpec(name, "recap", variant_config(name[len("recap[") : -1])))
            continue
        if name not in ALL_METHODS:
            choices = ", ".join(ALL_METHODS)
            raise ValueError(f"unknown method {name!r}; choose from {choices} or a variant: {VARIANT_HELP}")
        specs.append(MethodSpec(name, name))
    if REFERENCE not in [s.name for s in specs]:
        specs.insert(0, MethodSpec(REFERENCE, REFERENCE))
    return specs


@dataclass
class Run:
    """One method on one request."""

    method: str
    tokens: list[int]
    seconds: float
    steps: int | None = None
    mean_accepted_length: float | None = None
    accepted_lengths: list[int] | None = None
    nodes: int | None = None
    host_seconds: float | None = None
    verify_seconds: float | None = None
    prefill_seconds: float | None = None
    accepted_by_source: dict[str, int] | None = None
    steps_by_threads: dict[int, int] | None = None  # torch threads -> steps, where the method chose them

    @property
    def digest(self) -> str:
        return hashlib.sha256(",".join(map(str, self.tokens)).encode()).hexdigest()[:16]


class MethodRunner:
    """Runs one method, keeping its persistent memory across requests ("warm") or not ("cold")."""

    def __init__(self, spec: MethodSpec, model: torch.nn.Module, memory_mode: str) -> None:
        self.spec = spec
        self.model = model
        self.memory_mode = memory_mode
        self.memory: TokenMemory | None = None  # the persistent memory of recap and token_recycling
        if spec.kind in PERSISTENT_METHODS:
            k = memory_k(spec.kind, spec.config)
            self.memory = TokenMemory(output_vocab_size(model), k=k, method=spec.kind)

    def __call__(
        self, inputs: Mapping[str, Any], max_new_tokens: int, sampling: Mapping[str, Any] | None = None, seed: int = 0
    ) -> Run:
        """One request. ``sampling``: generate's sampling arguments (``do_sample=True``, temperature,
        ...), drawn after ``torch.manual_seed(seed)``; greedy without."""
        if self.memory_mode == "cold" and self.memory is not None:
            self.memory.clear()  # every row, as RecapConfig(persistent=False) does; the calibration stays
        kind = self.spec.kind
        decoding = dict(sampling) if sampling else {"do_sample": False}
        torch.manual_seed(seed)
        if kind in ("generate", "hf-prompt-lookup"):
            extra = {"prompt_lookup_num_tokens": 10} if kind == "hf-prompt-lookup" else {}
            start = time.perf_counter()
            with torch.inference_mode():
                out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, **decoding, **extra)
            seconds = time.perf_counter() - start
            return Run(self.spec.name, out[0, inputs["input_ids"].shape[1] :].tolist(), seconds)
        start = time.perf_counter()
        result = generate(
            self.model, inputs, kind, max_new_tokens, config=self.spec.config, memory=self.memory, **decoding
        )
        seconds = time.perf_counter() - start
        stats = result.stats
        return Run(
            self.spec.name,
            result.token_ids,
            seconds,
            steps=stats.steps,
            mean_accepted_length=stats.mean_accepted_length,
            accepted_lengths=stats.accepted_lengths,
            nodes=stats.nodes_verified,
            host_seconds=stats.time_draft + stats.time_update,
            verify_seconds=stats.time_verify,
            prefill_seconds=stats.time_prefill,
            accepted_by_source=stats.accepted_by_source,
            steps_by_threads=stats.steps_by_threads or None,
        )
