"""What verification costs on this model and machine: the time of a tree forward per tree size
and the time ``generate`` spends per token, measured interleaved in one run.

With them the bench reports each method's zero-overhead ceiling: the speedup it would reach if
drafting, acceptance, the cache commit and memory writes cost nothing and prefill were
excluded, i.e. (tokens per step) x (generate's time per token) / (its mean verify time).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..backends.hf import HFTarget
from ..core.tree import DraftTree

CURVE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # the sizes the curve is measured at


def _random_tree(rng: np.random.Generator, size: int, tokens: Sequence[int]) -> DraftTree:
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, size)]
    return DraftTree.from_lists(rng.choice(tokens, size=size).tolist(), parents)


def measure_costs(
    model: torch.nn.Module,
    inputs: Mapping[str, Any],
    max_nodes: int,
    repeats: int = 5,
    calls: int = 5,
    generate_tokens: int = 24,
) -> dict[str, Any]:
    """{"sizes": [...], "verify_ms": [...] (median ms of one tree forward, top-k included, per
    size), "generate_ms_per_token": ms}. Sizes are ``CURVE_SIZES`` up to ``max_nodes``; each
    repeat measures every size, then generate, so drift hits all alike. Generate's time per token
    is that of its tokens after the first (None if the prompt's answer ends too soon)."""
    sizes = [s for s in CURVE_SIZES if s < max_nodes] + [max_nodes]
    prompt = inputs["input_ids"][0].tolist()
    target = HFTarget(model, k=8)
    text = [t for t in prompt if t not in target.placeholder_ids] or [0]
    rng = np.random.default_rng(0)
    target.prefill(inputs, [])
    verify: dict[int, list[float]] = {s: [] for s in sizes}
    per_token: list[float] = []
    try:
        for _ in range(repeats):
            for size in sizes:
                tree = _random_tree(rng, size, text)
                times = []
                for _ in range(calls):
                    start = time.perf_counter()
                    target.verify(tree)
                    times.append(time.perf_counter() - start)
                    target.commit([])  # discard the tree: the context stays as it was
                verify[size].append(statistics.median(times))
            with torch.inference_mode():
                start = time.perf_counter()
                model.generate(**inputs, do_sample=False, max_new_tokens=1)
                one = time.perf_counter() - start
                start = time.perf_counter()  # (no min_new_tokens: its logits processor would slow generate down)
                out = model.generate(**inputs, do_sample=False, max_new_tokens=1 + generate_tokens)
                many = time.perf_counter() - start
            extra = out.shape[1] - len(prompt) - 1
            if extra >= 4:
                per_token.append(max(many - one, 0.0) / extra)
    finally:
        target.close()
    return {
        "sizes": sizes,
        "verify_ms": [1000 * statistics.median(verify[s]) for s in sizes],
        "generate_ms_per_token": 1000 * statistics.median(per_token) if per_token else None,
    }
