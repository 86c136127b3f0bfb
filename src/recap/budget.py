"""Choosing RECAP's node budget on the machine at hand: the tree size that commits the most
tokens per second.

A bigger tree commits more tokens per step but costs more per step. On a GPU a 64-token
forward costs about as much as a 1-token one, so the largest tree wins; on a CPU the cost
grows with the tree, and a smaller one is faster. The tuner learns both sides from the
steps it sees:

- tokens(B): best-first search adds nodes in score order, so a budget-B search drafts
  exactly the nodes of rank < B of a bigger one. From a step run with budget >= B, the
  tokens a budget-B tree would have committed are the leading accepted nodes of rank < B
  (grafted suffix nodes are drafted at any budget), plus the bonus token.
- seconds(B): a least-squares line through the median step time of each budget tried.

It tries each candidate budget at first, then runs the best one, and every
``explore_every``-th step the largest, which keeps tokens(B) known for every B.
Budgets never change the output, only the speed.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Sequence


def candidate_budgets(max_budget: int, count: int = 3) -> list[int]:
    """``max_budget`` and its next halves (at least 1), largest first: 63 -> 63, 31, 15. Not smaller:
    a step writes memory rows only for the nodes it verified, so tiny trees starve the memories,
    a loss the tuner's per-step estimate cannot see (measured: allowed down to 3 nodes, it chose
    3-7 and ran at 1.00x plain decoding; allowed down to 15, 1.10x; a fixed 31, 1.12x)."""
    return sorted({max(1, max_budget >> shift) for shift in range(count)}, reverse=True)


class BudgetTuner:
    """Per-step node budget that maximises committed tokens per second (see the module doc).

    Shared by the calls on one model (thread-safe); the last ``window`` steps count.
    """

    def __init__(
        self, max_budget: int, window: int = 512, explore_every: int = 8, candidates: list[int] | None = None
    ) -> None:
        if max_budget < 1:
            raise ValueError(f"an adaptive budget needs node_budget >= 1, got {max_budget}")
        self.candidates = sorted(candidates or candidate_budgets(max_budget), reverse=True)
        self.explore_every = explore_every
        self._steps: deque[tuple[int, float, tuple[int, ...]]] = deque(maxlen=window)  # budget, seconds, ranks
        self._chosen = 0
        self._best: tuple[int, int] | None = None  # (budget, step it was estimated at)
        self._lock = threading.Lock()

    def choose(self) -> int:
        """The budget of the next step."""
        with self._lock:
            n = self._chosen
            self._chosen += 1
        if n < 2 * len(self.candidates):  # try every candidate twice first
            return self.candidates[n % len(self.candidates)]
        if n % self.explore_every == 0:
            return self.candidates[0]
        if self._best is None or n - self._best[1] >= self.explore_every:  # re-estimated once per cycle
            self._best = (self.best(), n)
        return self._best[0]

    def record(self, budget: int, seconds: float, accepted_ranks: Sequence[int]) -> None:
        """One step: its budget, its duration, and the best-first ranks of its accepted
        draft nodes from the root down (-1 for a node any budget drafts)."""
        with self._lock:
            self._steps.append((budget, seconds, tuple(accepted_ranks)))

    def tokens(self, budget: int) -> float | None:
        """Mean tokens a step with ``budget`` commits, from the steps that drafted at least
        that many nodes (None before there is one)."""
        with self._lock:
            steps = list(self._steps)
        totals = [1 + _leading_below(ranks, budget) for used, _, ranks in steps if used >= budget]
        return sum(totals) / len(totals) if totals else None

    def seconds(self, budget: int) -> float | None:
        """Predicted seconds of a step with ``budget`` (None before any step)."""
        line = self._cost_line()
        return None if line is None else _on_line(line, budget)

    def _cost_line(self) -> tuple[float, float, float] | None:
        """(mean budget, mean seconds, slope) of a least-squares line through the median step
        time of each budget tried (medians, so that a stray slow step, a garbage collection or
        a busy core, does not move it); None before any step."""
        with self._lock:
            times: dict[int, list[float]] = {}
            for used, seconds, _ in self._steps:
                times.setdefault(used, []).append(seconds)
        if not times:
            return None
        points = [(used, statistics.median(values)) for used, values in times.items()]
        mean_x = sum(x for x, _ in points) / len(points)
        mean_y = sum(y for _, y in points) / len(points)
        spread = sum((x - mean_x) ** 2 for x, _ in points)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
        return mean_x, mean_y, max(0.0, slope)  # a bigger tree never costs less

    def throughput(self) -> dict[int, float]:
        """Predicted tokens per second of each candidate budget that has data."""
        line = self._cost_line()
        if line is None:
            return {}
        out = {}
        for budget in self.candidates:
            tokens = self.tokens(budget)
            if tokens is not None:
                out[budget] = tokens / _on_line(line, budget)
        return out

    def best(self) -> int:
        """The candidate with the highest predicted tokens per second (the largest before any data)."""
        rates = self.throughput()
        return max(rates, key=rates.__getitem__) if rates else self.candidates[0]


def _on_line(line: tuple[float, float, float], budget: int) -> float:
    mean_x, mean_y, slope = line
    return max(1e-9, mean_y + slope * (budget - mean_x))


def _leading_below(ranks: Sequence[int], budget: int) -> int:
    """How many of ``ranks``, from the first, are below ``budget`` without a gap."""
    count = 0
    for rank in ranks:
        if rank >= budget:
            break
        count += 1
    return count
