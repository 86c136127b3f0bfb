"""The cost side of choosing a tree size: seconds per decode step as a function of the
number of tree nodes, learned on the machine at hand as decoding goes.

A bigger tree commits more tokens per step but may cost more per step. On a GPU a 64-node
forward costs about what a 1-node one does, so the largest tree wins; on a CPU the cost grows
with the tree and a small one (or none) is faster. The drafter knows, for every size, how many
tokens it expects the step to commit (``DraftTree.probs``); this object knows what each size
costs, and ``choose`` picks the size with the most expected tokens per second.

Sizes come from a ladder (1 = a plain step, 2, 3, 4, 6, 8, 12, 16, ...). The cost of a size is
the median of its last ``window`` step times (a stray slow step on a shared machine does not
move it), made non-decreasing in size (pool-adjacent-violators) and interpolated for sizes
not yet measured. The first calls probe a spread of sizes; after that every ``explore_every``-th
call runs a neighbour of the best size (alternately smaller and larger) and every
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

    def __init__(self, max_nodes: int, window: int = 32, explore_every: int = 8, sweep_every: int = 32) -> None:
        if max_nodes < 1:
            raise ValueError(f"a tree has at least 1 node, got max_nodes={max_nodes}")
        self.sizes = ladder(max_nodes)
        self.window = window
        self.explore_every = explore_every
        self.sweep_every = sweep_every
        self._times = [deque(maxlen=window) for _ in self.sizes]
        self._calls = 0
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

    def choose(self, expected: np.ndarray) -> int:
        """The tree size for the next step: a ladder size below ``len(expected)``, or
        ``len(expected)`` itself (the whole tree the drafter built).

        ``expected[n - 1]`` is the number of tokens the drafter expects a tree of its ``n``
        best nodes to commit (n = 1: the root alone, a plain step, commits exactly 1).
        """
        available = len(expected)
        with self._lock:
            call = self._calls
            self._calls += 1
        options = [size for size in self.sizes if size < available] + [available]
        if call < len(self._probes):
            return min(self.sizes[self._probes[call]], available)
        if self.sweep_every and call % self.sweep_every == 0:
            return min(self.sizes[(call // self.sweep_every) % len(self.sizes)], available)
        costs = np.interp(np.asarray(options, dtype=np.float64), np.asarray(self.sizes, dtype=np.float64), self.costs())
        rates = np.asarray([expected[size - 1] for size in options]) / costs
        best = len(options) - 1 - int(np.argmax(rates[::-1]))  # ties: the larger tree
        if self.explore_every and call % self.explore_every == 0:
            best = min(max(best + (-1 if (call // self.explore_every) % 2 else 1), 0), len(options) - 1)
        return options[best]
