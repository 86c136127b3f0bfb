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
from ..decode import generate
from ..drafters import memory_k
from ..memory import TokenMemory

REFERENCE = "generate"
PEERS = ("hf-prompt-lookup",)  # the model library's own methods, which may not support a model
ALL_METHODS = ("generate", "hf-prompt-lookup", "ar", "pld", "token_recycling", "recap")


@dataclass(frozen=True)
class MethodSpec:
    """A named way to decode: ``kind`` is a recap method or one of the library's own."""

    name: str
    kind: str
    config: RecapConfig = field(default_factory=RecapConfig)


def ablation_specs() -> list[MethodSpec]:
    """RECAP variants: key orders, fusion modes, suffix path, persistence, node budgets (fixed and adaptive)."""
    base = RecapConfig()
    variants = {
        "recap[orders=1]": base.replace(key_orders=(1,)),
        "recap[orders=1,2]": base.replace(key_orders=(1, 2)),
        "recap[fusion=strict]": base.replace(fusion="strict"),
        "recap[fusion=fixed]": base.replace(fusion="fixed"),
        "recap[no-suffix]": base.replace(suffix_tokens=0),
        "recap[no-persistence]": base.replace(persistent=False),
        "recap[no-fallback]": base.replace(frequency_fallback=False),
        "recap[budget=31]": base.replace(node_budget=31),
        "recap[budget=95]": base.replace(node_budget=95),
        "recap[adaptive-budget]": base.replace(adaptive_budget=True),
    }
    return [MethodSpec(name, "recap", config) for name, config in variants.items()]


def parse_methods(names: str) -> list[MethodSpec]:
    """Methods by name: the methods and the RECAP variants of ``ablation_specs``."""
    variants = {spec.name: spec for spec in ablation_specs()}
    specs = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name in variants:
            specs.append(variants[name])
            continue
        if name not in ALL_METHODS:
            raise ValueError(
                f"unknown method {name!r}; choose from {', '.join(ALL_METHODS)} or a variant: {', '.join(variants)}"
            )
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
    accepted_by_source: dict[str, int] | None = None

    @property
    def digest(self) -> str:
        return hashlib.sha256(",".join(map(str, self.tokens)).encode()).hexdigest()[:16]


class MethodRunner:
    """Runs one method, keeping its persistent memory across requests ("warm") or not ("cold")."""

    def __init__(self, spec: MethodSpec, model: torch.nn.Module, memory_mode: str) -> None:
        self.spec = spec
        self.model = model
        self.memory_mode = memory_mode
        self.memory: TokenMemory | None = None
        self.reset()

    def reset(self) -> None:
        """A fresh persistent memory (for methods that have one)."""
        if self.spec.kind in ("recap", "token_recycling"):
            k = memory_k(self.spec.kind, self.spec.config)
            self.memory = TokenMemory(output_vocab_size(self.model), k=k, method=self.spec.kind)

    def __call__(self, inputs: Mapping[str, Any], max_new_tokens: int) -> Run:
        if self.memory_mode == "cold":
            self.reset()
        kind = self.spec.kind
        if kind in ("generate", "hf-prompt-lookup"):
            extra = {"prompt_lookup_num_tokens": 10} if kind == "hf-prompt-lookup" else {}
            start = time.perf_counter()
            with torch.inference_mode():
                out = self.model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens, **extra)
            seconds = time.perf_counter() - start
            return Run(self.spec.name, out[0, inputs["input_ids"].shape[1] :].tolist(), seconds)
        start = time.perf_counter()
        result = generate(self.model, inputs, kind, max_new_tokens, config=self.spec.config, memory=self.memory)
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
            accepted_by_source=stats.accepted_by_source,
        )
