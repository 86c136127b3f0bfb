"""The cost side of choosing a tree size: seconds per decode step as a function of the
number of tree nodes, learned on the machine at hand as decoding goes.

A bigger tree commits more tokens per step but may cost more per step. On a GPU a 64-node
forward costs about what a 1-node one does, so the largest tree wins; on a CPU the cost grows
with the tree and a small one (or none) is faster. The drafter knows, for every size, how many
tokens it expects the step to commit (``DraftTree.probs``); this object knows what each size
costs, and the size with the most expected tokens per second is verified (``best_size``; the
compiled tree search applies the same rule as it goes, and stops early on a steep curve).

Sizes come from a ladder (1 = a plain step, 2, 3, 4, 6, 8, 12, 16, ...). The cost of a size is
the median of its last ``window`` step times (a stray slow step on a shared machine does not
move it), made non-decreasing in size (pool-adjacent-violators) and interpolated for sizes
not yet measured. The first calls probe a spread of sizes; after that every ``explore_every``-th
call runs a neighbour of the last size picked (alternately smaller and larger) and every
``sweep_every``-th call the next size of a sweep over the whole ladder, so that costs stay
current on every size while the choice follows the drafter's confidence step by step.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque

import numpy as np

LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def ladder(max_nodes: int) -> list[int]:
    """Ladder sizes up to ``max_nodes`` (which is included)."""
    sizes = [s for s in LADDER if s < max_nodes]
    return [*sizes, max_nodes]


class StepCost:
    """Per-size step times of one model on one machine (thread-safe).

    ``max_nodes``: the largest tree (root included) the drafter may verify.
    """

    def __init__(self, max_nodes: int, window: int = 32, explore_every: int = 16, sweep_every: int = 64) -> None:
        if max_nodes < 1:
            raise ValueError(f"a tree has at least 1 node, got max_nodes={max_nodes}")
        self.sizes = ladder(max_nodes)
        self.window = window
        self.explore_every = explore_every
        self.sweep_every = sweep_every
        self._times = [deque(maxlen=window) for _ in self.sizes]
        self._dense: np.ndarray | None = None  # dense(), refreshed after every few records
        self._fresh = 0  # records since the last refresh
        self._calls = 0
        self._last_pick = max_nodes
        self._lock = threading.Lock()
        self._probes = self._probe_order()

    def _probe_order(self) -> list[int]:
        """The first sizes tried: the largest, a plain step, then the ladder's quartiles."""
        m = len(self.sizes) - 1
        picks = [m, 0, m // 2, m // 4, (3 * m) // 4, m // 8]
        return list(dict.fromkeys(picks))

    def bucket(self, nodes: int) -> int:
        """Index of the smallest ladder size >= ``nodes`` (the largest if none)."""
        for i, size in enumerate(self.sizes):
            if nodes <= size:
                return i
        return len(self.sizes) - 1

    def record(self, nodes: int, seconds: float) -> None:
        """One step verified a tree of ``nodes`` nodes and took ``seconds`` in all (drafting,
        verifying, committing and learning)."""
        with self._lock:
            self._times[self.bucket(nodes)].append(seconds)
            self._fresh += 1

    def measured(self) -> dict[int, float]:
        """Median seconds of each size measured so far."""
        with self._lock:
            return {size: statistics.median(t) for size, t in zip(self.sizes, self._times) if t}

    def costs(self) -> np.ndarray:
        """[len(sizes)] estimated seconds per step of each ladder size: medians made
        non-decreasing, interpolated between measured sizes, flat beyond them. All ones
        before any measurement (as if verification were free)."""
        with self._lock:
            points = [(i, statistics.median(t), len(t)) for i, t in enumerate(self._times) if t]
        if not points:
            return np.ones(len(self.sizes))
        # pool adjacent violators: a weighted non-decreasing fit through the medians
        blocks: list[list[float]] = []  # [value, weight, first point, last point]
        for j, (_, value, weight) in enumerate(points):
            blocks.append([value, float(weight), j, j])
            while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
                v2, w2, _, last = blocks.pop()
                v1, w1, first, _ = blocks.pop()
                blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, first, last])
        fitted = np.empty(len(points))
        for value, _, first, last in blocks:
            fitted[first : last + 1] = value
        xs = np.asarray([self.sizes[i] for i, _, _ in points], dtype=np.float64)
        return np.interp(np.asarray(self.sizes, dtype=np.float64), xs, fitted)

    def plan(self) -> int | None:
        """The size the next step must verify, or None when the drafter should pick the best
        one (``dense`` costs, ``best_size``). Forced sizes: the first calls probe a spread of
        the ladder, every ``sweep_every``-th call takes the next size of a sweep over it, and
        every ``explore_every``-th call a neighbour of the last size picked."""
        with self._lock:
            call = self._calls
            self._calls += 1
            last = self._last_pick
        if call < len(self._probes):
            return self.sizes[self._probes[call]]
        if self.sweep_every and call % self.sweep_every == 0:
            return self.sizes[(call // self.sweep_every) % len(self.sizes)]
        if self.explore_every and call % self.explore_every == 0:
            at = self.bucket(last) + (-1 if (call // self.explore_every) % 2 else 1)
            return self.sizes[min(max(at, 0), len(self.sizes) - 1)]
        return None

    def picked(self, size: int) -> None:
        """The drafter picked ``size`` (exploration looks around it)."""
        with self._lock:
            self._last_pick = size

    def dense(self) -> np.ndarray:
        """[max_nodes + 1] float64: the estimated seconds of a step verifying s nodes at index s
        (``costs`` interpolated; index 0 unused). Refreshed after every 16 new step times."""
        with self._lock:
            stale = self._dense is None or self._fresh >= 16
        if stale:  # medians and the fit cost tens of microseconds: not on every step
            sizes = np.arange(self.sizes[-1] + 1, dtype=np.float64)
            dense = np.interp(sizes, np.asarray(self.sizes, dtype=np.float64), self.costs())
            with self._lock:
                self._dense, self._fresh = dense, 0
        return self._dense

    def choose(self, expected: np.ndarray) -> int:
        """``plan``, else ``best_size`` over ``expected`` (see there), within the tree built."""
        forced = self.plan()
        size = min(forced, len(expected)) if forced is not None else best_size(expected, self.dense())
        if forced is None:
            self.picked(size)
        return size


def best_size(expected: np.ndarray, costs: np.ndarray) -> int:
    """The tree size s (root included) with the most expected tokens per second,
    ``expected[s - 1] / costs[s]``, the larger on ties. ``expected[n - 1]``: the tokens a tree of
    the drafter's ``n`` best nodes is expected to commit (1 for the root alone, a plain step)."""
    sizes = np.arange(1, min(len(expected), len(costs) - 1) + 1)
    rates = np.asarray(expected[: len(sizes)], dtype=np.float64) / costs[sizes]
    return int(sizes[len(sizes) - 1 - int(np.argmax(rates[::-1]))])
