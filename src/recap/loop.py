"""The decode loop of one request: prefill, then propose -> verify -> accept -> commit -> observe.

It wires a drafter (``recap.drafters``) to a target (``recap.backends``) under generate's token
rules (``recap.core.rules``) and knows no model: the entries (``recap.entry``, the bench) build
the pieces of a request and call ``run``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from . import kernels
from .backends import Target
from .core.accept import Acceptance, accept_greedy
from .core.rules import TokenRules
from .core.sampling import walk
from .core.stats import DecodeStats
from .core.step_cost import StepCost
from .core.tree import DraftTree
from .drafters import Drafter


@dataclass
class GenerationResult:
    """token_ids: the new tokens only (the prompt excluded); stats: what the call did."""

    token_ids: list[int]
    stats: DecodeStats


def run(
    target: Target,
    drafter: Drafter,
    rules: TokenRules,
    inputs: Mapping[str, Any],
    prompt_ids: list[int],
    streamer: Any = None,
    cost: StepCost | None = None,
    choose_threads: bool = False,
) -> GenerationResult:
    """The decode loop of one request: prefill ``inputs`` (the model's forward inputs for the
    prompt ``prompt_ids``), then propose -> verify -> accept -> commit -> observe until ``rules``
    stop it. Plain greedy decoding (``rules.fast``) accepts by the compiled argmax comparison;
    processors or sampling pick each token along the tree with ``sampling.walk``. The drafter
    learns from the raw top-k of every verified node either way. ``streamer`` gets each step's
    committed tokens (the caller puts the prompt and calls ``end``, as generate does); ``cost``,
    if given, records each step's time by tree size (the drafter sizes its trees from it).
    ``choose_threads`` (with ``cost``): every step runs on the torch thread count ``cost`` finds
    fastest, at most the caller's (``recap.core.threads``); the caller's count is set back at the end."""
    kernels.ensure_ready()  # compile or load every kernel now, never in the middle of a request
    stats = DecodeStats(method=drafter.name)
    with _Threads(cost if choose_threads else None, stats) as threads:
        start = time.perf_counter()
        threads.set(prefill=True)
        positions = drafter.prefill_positions(prompt_ids)
        prefill = target.prefill(inputs, positions)
        drafter.begin(prompt_ids, positions, prompt_topk=prefill.topk)
        first = prefill.first
        if not rules.fast:
            with torch.inference_mode():
                first = rules.choose(prefill.logits)
        stats.time_prefill = time.perf_counter() - start
        done = rules.push(first)
        history = [*prompt_ids, first]
        new_tokens = [first]
        if streamer is not None:
            streamer.put(torch.tensor([first]))
        try:
            while not done:
                t0 = time.perf_counter()
                count = threads.set()
                tree = drafter.propose(history)
                t1 = time.perf_counter()
                verified = target.verify(tree)
                t2 = time.perf_counter()
                if rules.fast:
                    acceptance = accept_greedy(tree, verified.greedy)
                    committed, done = rules.cut(_committed(tree, acceptance))
                else:
                    with torch.inference_mode():
                        acceptance, done = walk(tree, functools.partial(rules.choose_row, verified.logits), rules.push)
                    committed = _committed(tree, acceptance)
                new_tokens.extend(committed)
                history.extend(committed)
                if streamer is not None:
                    streamer.put(torch.tensor(committed))
                stats.record_step(tree, len(committed))
                drafts_committed = min(len(committed), acceptance.accepted_drafts)
                if drafts_committed:
                    stats.count_sources(tree.sources[acceptance.path[1 : 1 + drafts_committed]].tolist())
                if not done:
                    target.commit(acceptance.path)
                drafter.observe(tree, verified.topk, acceptance, committed)
                t3 = time.perf_counter()
                stats.time_draft += t1 - t0
                stats.time_verify += t2 - t1
                stats.time_update += t3 - t2
                if cost is not None and not verified.timing_kernels:  # a step still timing kernels is no price
                    cost.record(len(tree), t3 - t0, count)
        finally:
            drafter.end()
            target.close()
    stats.new_tokens = len(new_tokens)
    stats.time_total = time.perf_counter() - start
    return GenerationResult(token_ids=new_tokens, stats=stats)


class _Threads:
    """The torch thread count of a request's forwards where ``cost`` chooses it: set before each
    forward, the caller's set back when the request ends (nothing changes without ``cost``)."""

    def __init__(self, cost: StepCost | None, stats: DecodeStats) -> None:
        self.cost, self.stats = cost, stats
        self.caller = torch.get_num_threads()

    def __enter__(self) -> _Threads:
        if self.cost is not None:
            self.cost.begin_threads(self.caller)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cost is not None and torch.get_num_threads() != self.caller:
            torch.set_num_threads(self.caller)

    def set(self, prefill: bool = False) -> int | None:
        """Set the count of the next forward (a step's, or the prefill's: never a trial's); returns it."""
        if self.cost is None:
            return None
        count = self.cost.threads.current if prefill else self.cost.next_threads()
        if count != torch.get_num_threads():
            torch.set_num_threads(count)
        if not prefill:
            self.stats.steps_by_threads[count] = self.stats.steps_by_threads.get(count, 0) + 1
        return count


def _committed(tree: DraftTree, acceptance: Acceptance) -> list[int]:
    """The tokens a step commits: the accepted drafts, then the bonus token."""
    if len(acceptance.path) == 1:
        return [acceptance.bonus]
    return [*tree.tokens[acceptance.path[1:]].tolist(), acceptance.bonus]
