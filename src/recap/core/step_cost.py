"""The cost side of choosing a tree size: seconds per decode step as a function of the
number of tree nodes, learned on the machine at hand as decoding goes.

A bigger tree commits more tokens per step but may cost more per step. On a GPU a 64-node
forward costs about what a 1-node one does, so the largest tree wins; on a CPU the cost grows
with the tree and a small one (or none) is faster. The drafter knows, for every size, how many
tokens it expects the step to commit (``DraftTree.probs``); this object knows what each size
costs, and the size with the most expected tokens per second is verified (``best_size``; the
compiled tree search applies the same rule as it goes, and stops early on a steep curve). The
expected tokens include what a verified node is worth later (``RecapConfig.row_value``): its
top-k rows are learned whether it is accepted or not, and later steps draft from them.

Sizes come from a ladder (1 = a plain step, 2, 3, ..., 16, 24, 32, 48, ...). The cost of a size is
the median of its last ``window`` step times, of two the lower (a stray slow step on a shared
machine does not move it; a start-up probe that looked too dear is timed twice, one that took more
than ``STALL_FACTOR`` x s plain steps for its s nodes stalled and is not kept; a size timed once far
above the line of the sizes below it waits for a second time), read as the cost
of the cheapest size at least as big (a tree of s nodes can always be filled with more drafts up to
a bigger size that verifies faster: on two cores a 2-row forward can cost more than an 8-row one),
interpolated between measured sizes, and extrapolated along the slope of the last two beyond the
largest size measured.

The machine's speed drifts (other processes, frequency changes, a shared host), and a size
measured only now and then would be compared with sizes measured at another speed: one size timed
in a fast minute makes every smaller size look as cheap (the "cheapest size at least as big"
reading). So step times are kept in units of a reference speed: a running speed index, the
median of the last ``speed_window`` steps' time over their size's median (a stall does not move
it; a change of speed moves it within a few steps, before the sizes' medians follow), divides
every time recorded. Sizes measured minutes apart then compare as if timed together; ``measured``
and ``costs`` are in seconds at the speed of the first steps timed.

Exploration has a bounded price: the forced sizes take at most ``explore_share`` of the time beyond what the size
last picked would have taken (by their median step times). The first calls probe the ladder upwards from the plain
step: 2 nodes, 4, then each size 4 times the last (a probe whose forward was still timing kernels, see
``backends.few_row_linear``, is not recorded and runs again), and stop at the first size that costs more than
``max_gain`` plain steps: no tree is expected to commit that many tokens, so nothing larger can pay; a size that the
line of the sizes below foretells to cost more than ``max_gain`` times the cheapest one is passed over until the
drafter expects a tree to commit enough (on a GPU, where a big tree costs about what a plain step does, the probes
climb the whole ladder; a process started from an earlier one's times, ``restore``, skips them). After that every
``explore_every``-th call runs a neighbour of the last size picked (alternately smaller and larger) and every
``sweep_every``-th call the next size of a sweep over the sizes worth trying, so that costs stay current while the
choice follows the drafter's confidence step by step."""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np

from .threads import ThreadChoice

# every size up to 16 (where CPU choices fall: a step time is kept under its own size, so a size picked
# often does not stand for a bigger one), then coarser
LADDER = (*range(1, 17), 24, 32, 48, 64, 96, 128, 192, 256)
DENSE_REFRESH = 16  # new step times after which the dense costs are computed again
# times a start-up probe may run again while its size has no step time: the loop records no step whose forward
# was still timing kernels (``backends.few_row_linear``: the first one or two forwards of each new size), and a
# stalled probe's time is not kept (``STALL_FACTOR``)
PROBE_REPEATS = 4
# a start-up probe of s nodes that took more than this many times s plain steps stalled: no forward of s rows costs
# that (on two cores the dearest seen, 2 rows at 0.36B, cost 1.9 plain steps; 64 rows 4.3), so its time is no price
# and the probe runs again. Kept, two stalled probes in a row made a size look dearer than ``max_gain`` plain steps,
# which no sweep could afford to time again for thousands of steps. Only the probes: there the plain step was just
# timed and no speed index scales the times (later, a wrong index or plain time would reject real prices)
STALL_FACTOR = 1.5
# a size with one step time more than this many times the line of the two measured sizes below it is read off its
# neighbours until it has a second time: one stall (a busy core, a garbage collection) of a size measured once made it,
# and every size between it and the next one measured, look dear for thousands of steps (in the step-cost simulation
# at 2% stalls the rule's rate over 400 seeds went from 98.4% of the best size's to 98.6%; at 5%, 97.8 -> 98.0, and
# runs under 93% from 11 to 2). No price measured on two cores is that far off: 64 nodes at a 1.5B shape 1.25x the
# line of 4 and 16, at the tiny models 0.8x; 16 nodes at a 0.5B shape, where 4 ran faster than 1, 1.9x
OFF_LINE = 3.0
# a start-up probe of the largest size that costs more than ``max_gain`` plain steps is timed again only where its
# time is more than this many times the line of the two measured sizes below it (perhaps a stall: on a flat GPU curve
# the largest tree is cheap). Else its price is what the smaller sizes foretold and no probe after it depends on it;
# timing it again cost a forward of the largest tree to confirm what the rule avoids anyway (at a 1.5B shape on two
# cores, 64 nodes: 4.6 plain steps, 1.25x the line of 4 and 16; first-ever 32-token calls in one process, 8 rounds,
# 12.8 s against 14.0 s, generate 12.6 s)
FORETOLD = 1.5
# the smallest size whose step time foretells bigger sizes' (``_tokens_to_reach``): 1 to 3 rows run other kernels (a
# matrix-vector product; 2 rows at a 1.5B shape on two cores cost 0.68 plain steps, 4 rows 1.24), and a line through
# them foretold 1.4 s for 16 nodes, which took 0.53
FORETELLING = 4


def typical(times) -> float:
    """What a step of one size takes, from its step times: their median; of two, the lower (a stray
    slow step, a stall, only ever makes a step slower, and the median of two is their mean)."""
    return min(times) if len(times) == 2 else statistics.median(times)


def _line(points: Sequence[tuple[float, float]], size):
    """The seconds at ``size`` (a number or an array) on the line through two (size, seconds) ``points``,
    never falling."""
    (low, low_time), (high, high_time) = points
    return high_time + max(0.0, (high_time - low_time) / (high - low)) * (size - high)


def ladder(max_nodes: int) -> list[int]:
    """Ladder sizes up to ``max_nodes`` (which is included)."""
    sizes = [s for s in LADDER if s < max_nodes]
    return [*sizes, max_nodes]


class StepCost:
    """Per-size step times of one model on one machine (thread-safe).

    ``max_nodes``: the largest tree (root included) the drafter may verify; ``speed_window``: the
    steps the speed index is the median of (0 keeps the times as measured).
    """

    def __init__(
        self,
        max_nodes: int,
        window: int = 32,
        explore_every: int = 16,
        sweep_every: int = 64,
        max_gain: float = 4.0,
        explore_share: float = 0.02,
        speed_window: int = 9,
    ) -> None:
        if max_nodes < 1:
            raise ValueError(f"a tree has at least 1 node, got max_nodes={max_nodes}")
        if not max_gain > 1:
            raise ValueError(f"max_gain is the most tokens a step may commit, > 1; got {max_gain}")
        self.sizes = ladder(max_nodes)
        self.window = window
        self.explore_every = explore_every
        self.sweep_every = sweep_every
        self.max_gain = max_gain
        self.explore_share = explore_share
        self._spent = 0.0  # estimated seconds forced sizes cost beyond the size the rule last picked
        self._total = 0.0  # seconds (at the reference speed) of all steps recorded
        self._times = [deque(maxlen=window) for _ in self.sizes]  # seconds at the reference speed
        self._log_ratios: deque[float] = deque(maxlen=speed_window)  # the last steps' log(time / median)
        self._log_speed = 0.0  # log of the speed index: how much slower than the reference the machine runs now
        self._dense: np.ndarray | None = None  # dense(), refreshed after every few records
        self._fresh = 0  # records since the last refresh
        self._calls = 0
        self._last_pick = max_nodes
        self._lock = threading.Lock()
        self._probing: int | None = 0  # the next start-up probe's ladder index (None once they are done)
        self._last_probe: int | None = None
        self._probe_repeats = 0  # times the last probe ran again because its step left no time
        self._passed_over: tuple[int, float] | None = None  # a probe's ladder index and the tokens it needs to pay
        self._most = 0.0  # the most tokens a step's tree was expected to commit so far (``expect``)
        self.threads = ThreadChoice()  # the torch thread count of CPU steps, where the loop lets it choose

    def _next_probe(self, index: int) -> int:
        """The probe after ladder size ``index``: after the plain step 2 nodes, after 2 the first size at least 4
        times the plain step, after that the first at least 4 times as big (the largest if none is), so the
        start-up costs a few steps. After the largest, the index past the ladder: nothing more is probed, but the
        call after it can still measure the largest again if it looked too dear once, far above its line
        (``_foretold``).

        Two nodes are probed because one row and two run different kernels on a CPU: a matrix-vector product
        and a matrix product, which the BLAS may run on more threads. On two cores with MKL at a 1.5B shape a
        2-node step took 0.21-0.33 s against 0.30-0.44 s for a plain one; until 2 is timed its cost is read off
        1 and 4, and the rule takes plain steps where a 2-node tree costs less (the cheapest size at least as big,
        see ``costs``)."""
        if index >= len(self.sizes) - 1:
            return len(self.sizes)
        size = self.sizes[index]
        least = 2 if size == 1 else 4 if size == 2 else 4 * size
        bigger = [i for i in range(index + 1, len(self.sizes)) if self.sizes[i] >= least]
        return bigger[0] if bigger else len(self.sizes) - 1

    @property
    def expecting(self) -> bool:
        """Whether ``expect`` is still read: while the start-up probes run or one of them is passed over."""
        return self._probing is not None or self._passed_over is not None

    def expect(self, tokens: float) -> None:
        """A step's drafter expected its whole tree to commit ``tokens`` tokens: more than ``max_gain`` raises the
        most a step is taken to commit where the probes foretell a size out of reach (``_tokens_to_reach``)."""
        with self._lock:
            self._most = max(self._most, tokens)

    def worth_trying(self) -> int:
        """Index of the largest ladder size worth verifying: the sizes up to the first one whose
        fastest of at least 2 steps passes ``max_gain`` plain steps (all of them until that is
        seen; one stalled step only ever looks slower, so it is not enough)."""
        with self._lock:
            if self._times[0]:
                plain = typical(self._times[0])
                for i, times in enumerate(self._times):
                    if self._dear_times(times, plain):
                        return i
        return len(self.sizes) - 1

    def bucket(self, nodes: int) -> int:
        """Index of the smallest ladder size >= ``nodes`` (the largest if none)."""
        for i, size in enumerate(self.sizes):
            if nodes <= size:
                return i
        return len(self.sizes) - 1

    def begin_threads(self, base: int) -> None:
        """A request whose caller runs torch on ``base`` threads lets the steps' count be chosen
        (``ThreadChoice``: ``base`` or fewer)."""
        with self._lock:
            self.threads.begin(base)

    def next_threads(self) -> int:
        """The torch thread count of the next step (after ``begin_threads``)."""
        with self._lock:
            return self.threads.next(speed_known=len(self._log_ratios) >= 3)

    def record(self, nodes: int, seconds: float, threads: int | None = None) -> None:
        """One step verified a tree of ``nodes`` nodes and took ``seconds`` in all (drafting,
        verifying, committing and learning): the speed index moves with it, and it is kept
        divided by the index. ``threads``: the torch thread count it ran on, where the thread
        choice is on; a trial count's step goes to the choice only (and, where the choice moves
        to that count, its speeds become the speed reading)."""
        index = self.bucket(nodes)
        with self._lock:
            times = self._times[index]
            trial = threads is not None and threads != self.threads.current
            log_speed = None
            # a step is read against its size's median once the size has 3 times; a trial step
            # already with 1 (trials right after the start-up then compare too)
            if self._log_ratios.maxlen and len(times) >= (1 if trial else 3) and seconds > 0:
                log_speed = math.log(seconds / typical(times))
            if threads is not None:
                if self.threads.record(threads, seconds, log_speed, self._log_speed):
                    self._log_ratios.clear()
                    self._log_ratios.extend(self.threads.trial_speeds)
                    self._log_speed = statistics.median(self._log_ratios)
                if trial:
                    return
            if log_speed is not None:
                self._log_ratios.append(log_speed)
                self._log_speed = statistics.median(self._log_ratios)
            seconds /= math.exp(self._log_speed)
            if self._probing is not None and index and self._times[0]:
                if seconds > STALL_FACTOR * self.sizes[index] * typical(self._times[0]):
                    self._total += seconds  # a stalled probe, not a price: no forward of s rows costs that many
                    return  # plain steps (the probe runs again)
            # a size timed for the first time refreshes ``dense`` at once: it was read off its neighbours
            # (or the slope beyond the largest size timed), and may be far dearer than that
            self._fresh = self._fresh + 1 if times else DENSE_REFRESH
            times.append(seconds)
            self._total += seconds

    def snapshot(self) -> dict[int, list[float]] | None:
        """Each measured size's step times (seconds at the reference speed, oldest first) once the
        start-up probes are done, else None: what ``restore`` starts a later process from."""
        with self._lock:
            if self._probing is not None:
                return None
            return {size: list(times) for size, times in zip(self.sizes, self._times) if times}

    def restore(self, times: Mapping[int, Sequence[float]]) -> bool:
        """Start from the step times an earlier process measured on this machine (``snapshot``):
        no start-up probes (at a real model's size they cost several plain steps a process). The
        speed index reads this process's steps against those times from its first step, so a machine
        now faster or slower scales them as it does a drift. Only before the first step: False after
        it (nothing changes). A size off the ladder, a time that is not positive, or no plain-step
        time: ValueError."""
        checked = {}
        for size, values in times.items():
            if size not in self.sizes:
                raise ValueError(f"step times of {size} nodes: not a size of this ladder ({self.sizes})")
            values = [float(v) for v in values]
            if not values or not all(math.isfinite(v) and v > 0 for v in values):
                raise ValueError(f"step times of {size} nodes must be positive seconds, got {values}")
            checked[self.sizes.index(size)] = values[-self.window :]
        if 0 not in checked:
            raise ValueError("the step times hold no plain step (size 1), which every other size is read against")
        with self._lock:
            if self._calls or self._total:
                return False
            for index, values in checked.items():
                self._times[index].extend(values)
            self._probing = None
            self._fresh = DENSE_REFRESH
        return True

    @property
    def speed(self) -> float:
        """The speed index: a step now takes this many times what it took at the reference speed."""
        with self._lock:
            return math.exp(self._log_speed)

    def measured(self) -> dict[int, float]:
        """Typical seconds (``typical``: the median, of two the lower; at the reference speed) of
        each size measured so far."""
        with self._lock:
            return {size: typical(t) for size, t in zip(self.sizes, self._times) if t}

    def _measured(self, index: int) -> bool:
        """Whether ladder size ``index`` has a step time."""
        with self._lock:
            return bool(self._times[index])

    def _dear(self, index: int, once: bool = False) -> bool:
        """Whether ladder size ``index`` was dearer than ``max_gain`` plain steps even at its fastest,
        over 2 times or more; ``once``: over exactly one (a stalled step looks so too, so a probe
        that did is measured again before it counts)."""
        with self._lock:
            return bool(self._times[0]) and self._dear_times(self._times[index], typical(self._times[0]), once)

    def _timed_below(self, index: int) -> list[tuple[int, float]]:
        """(size, typical seconds) of each measured ladder size below ``index``, smallest first (lock held)."""
        return [(self.sizes[i], typical(t)) for i, t in enumerate(self._times[:index]) if t]

    def _foretold(self, index: int) -> bool:
        """Whether ladder size ``index`` is the largest, timed once, at most ``FORETOLD`` times the line of the two
        measured sizes below it: a dear start-up probe that need not be timed again."""
        if index != len(self.sizes) - 1:
            return False
        with self._lock:
            below = self._timed_below(index)[-2:]
            times = list(self._times[index])
        return len(times) == 1 and len(below) == 2 and times[0] <= FORETOLD * _line(below, self.sizes[index])

    def _tokens_to_reach(self, index: int) -> float:
        """The tokens a step of ladder size ``index``, not timed yet, must commit to be worth its cost: the cost that
        the line of the two measured sizes below it foretells (never falling; sizes of ``FORETELLING`` nodes or more),
        over the cheapest size measured, which commits at least one token. 0 where it is timed or nothing foretells
        it. The start-up probes pass over a size that needs more than ``max_gain`` tokens (or than the most a tree
        was expected to commit so far, ``expect``, if more), and probe it once the drafter expects that many: a probe
        costs a forward of its size, the first one or two of a new size also time kernels. At a 1.5B shape on two
        cores, 2 nodes at 0.21 s and 4 and 16 at 0.38 and 0.53 foretell 1.13 s for 64 nodes (1.45 measured): 5.4
        tokens, though less than 4 plain steps (0.31 s each). On a flat (GPU) curve about 1."""
        with self._lock:
            if self._times[index]:
                return 0.0
            timed = self._timed_below(index)
        line = [(size, seconds) for size, seconds in timed if size >= FORETELLING][-2:]
        if len(line) < 2:
            return 0.0
        return _line(line, self.sizes[index]) / min(seconds for _, seconds in timed)

    def _dear_times(self, times, plain: float, once: bool = False) -> bool:
        """``_dear`` of one size's ``times`` against a plain step's typical ``plain`` seconds (lock held)."""
        if len(times) != 1 if once else len(times) < 2:
            return False
        return min(times) > self.max_gain * plain

    def costs(self) -> np.ndarray:
        """[len(sizes)] estimated seconds per step of each ladder size: the typical time of the
        cheapest measured size at least as big (so non-decreasing), interpolated between
        measured sizes, flat below the smallest, extrapolated beyond the largest along the slope
        of the last two (flat if only one is measured). A size timed once, ``OFF_LINE`` times above
        the line of the two measured sizes below it, counts as not measured yet. All ones before any
        measurement (as if verification were free)."""
        with self._lock:
            measured = [(self.sizes[i], list(t)) for i, t in enumerate(self._times) if t]
        points: list[tuple[int, float]] = []
        for size, times in measured:
            if len(times) == 1 and len(points) >= 2 and times[0] > OFF_LINE * _line(points[-2:], size):
                continue  # one time far above the line of the sizes below: a stall, not yet a price
            points.append((size, typical(times)))
        if not points:
            return np.ones(len(self.sizes))
        xs = np.asarray([size for size, _ in points], dtype=np.float64)
        envelope = np.minimum.accumulate(np.asarray([cost for _, cost in points])[::-1])[::-1]
        sizes = np.asarray(self.sizes, dtype=np.float64)
        costs = np.interp(sizes, xs, envelope)
        if len(xs) > 1:
            beyond = sizes > xs[-1]
            costs[beyond] = _line(list(zip(xs[-2:], envelope[-2:])), sizes[beyond])
        return costs

    def plan(self) -> int | None:
        """The size the next step must verify, or None when the drafter should pick the best one (``dense`` costs,
        ``best_size``). Forced sizes: the first calls probe the ladder upwards from the plain step (1, 2, 4, 16,
        64, ...: ``_next_probe``), up to the first that costs more than ``max_gain`` plain steps, passing over
        one foretold to need more tokens than a step commits until the drafter expects that many
        (``_tokens_to_reach``); then every ``sweep_every``-th call takes the next size of a sweep over the sizes
        worth trying and every ``explore_every``-th call a neighbour of the last size picked."""
        with self._lock:
            call = self._calls
            self._calls += 1
            last = self._last_pick
            probing = self._probing
            passed_over = self._passed_over
            most = max(self.max_gain, self._most)
        if passed_over is not None and most >= passed_over[1]:  # the drafter now expects enough: probe it after all
            index, need = passed_over[0], self._tokens_to_reach(passed_over[0])
            with self._lock:
                self._passed_over = (index, need) if need > most else None
                if need and need <= most:
                    self._probing = probing = index
        if probing is not None:  # the start-up probes, upwards, while the sizes are worth trying
            previous = self._last_probe
            if previous and self._dear(previous, once=True) and not self._foretold(previous):
                return self.sizes[previous]  # the last probe looked too dear once: measure it again
            if previous is not None and self._probe_repeats < PROBE_REPEATS and not self._measured(previous):
                with self._lock:  # the last probe's step was not recorded (still timing kernels): run it again
                    self._probe_repeats += 1
                return self.sizes[previous]
            more = probing <= self.worth_trying()
            need = self._tokens_to_reach(probing) if more else 0.0
            with self._lock:
                if need > most:  # foretold to need more tokens than a step commits: passed over for now
                    self._passed_over, self._probing, more = (probing, need), None, False
                else:
                    self._probing = self._next_probe(probing) if more else None
                    self._last_probe, self._probe_repeats = probing, 0
            if more:
                return self.sizes[probing]
        if not call:  # the first call of a model restored from earlier times (``restore``): the drafter's choice
            return None
        forced = None
        if self.sweep_every and call % self.sweep_every == 0:
            forced = self.sizes[(call // self.sweep_every) % (self.worth_trying() + 1)]
        elif self.explore_every and call % self.explore_every == 0:
            top = self.worth_trying()
            affordable = top - 1 if top > 0 and self._dear(top) else top  # never explore a size known too dear
            at = self.bucket(last) + (-1 if (call // self.explore_every) % 2 else 1)
            forced = self.sizes[min(max(at, 0), affordable)]
        if forced is None:
            return None
        excess = max(0.0, self._seconds(self.bucket(forced)) - self._seconds(self.bucket(last)))
        with self._lock:
            if self._spent + excess > self.explore_share * self._total:
                return None  # exploring now would take more than its share of the time
            self._spent += excess
        return forced

    def _seconds(self, index: int) -> float:
        """What a step of ladder size ``index`` takes: its own typical time (a forced size runs at that size,
        not filled up to a cheaper one), else the estimate of ``costs``."""
        with self._lock:
            times = self._times[index]
            if times:
                return typical(times)
        return float(self.costs()[index])

    def picked(self, size: int) -> None:
        """The drafter picked ``size`` (exploration looks around it)."""
        with self._lock:
            self._last_pick = size

    def dense(self) -> np.ndarray:
        """[max_nodes + 1] float64: the estimated seconds of a step verifying s nodes at index s
        (``costs`` interpolated; index 0 unused). Refreshed after every ``DENSE_REFRESH`` new step
        times, and after the first time of a size."""
        with self._lock:
            stale = self._dense is None or self._fresh >= DENSE_REFRESH
        if stale:  # medians and the fit cost tens of microseconds: not on every step
            sizes = np.arange(self.sizes[-1] + 1, dtype=np.float64)
            dense = np.interp(sizes, np.asarray(self.sizes, dtype=np.float64), self.costs())
            with self._lock:
                self._dense, self._fresh = dense, 0
        return self._dense

    def choose(
        self, expected: np.ndarray, node_value: float = 0.0, valued_nodes: int = 0, rows_need_drafts: bool = False
    ) -> int:
        """``plan``, else ``best_size`` over ``expected`` (see there), within the tree built."""
        self.expect(float(expected[-1]))
        forced = self.plan()
        if forced is not None:
            return min(forced, len(expected))
        size = best_size(expected, self.dense(), node_value, valued_nodes, rows_need_drafts)
        self.picked(size)
        return size


def best_size(
    expected: np.ndarray,
    costs: np.ndarray,
    node_value: float = 0.0,
    valued_nodes: int = 0,
    rows_need_drafts: bool = False,
) -> int:
    """The tree size s (root included) with the most expected tokens per second,
    ``(expected[s - 1] + node_value * min(s - 1, valued_nodes)) / costs[s]``, the larger on ties.
    ``expected[n - 1]``: the tokens a tree of the drafter's ``n`` best nodes is expected to commit
    (1 for the root alone, a plain step); ``node_value``: the tokens each of the first
    ``valued_nodes`` drafted nodes is worth besides, in later steps (the rows learned from it).
    ``rows_need_drafts``: that worth counts only if some tree beats the plain step on
    ``expected`` alone (else 1: rows may make a paying tree bigger, never buy a tree by themselves)."""
    sizes = np.arange(1, min(len(expected), len(costs) - 1) + 1)
    drafts = np.asarray(expected[: len(sizes)], dtype=np.float64)
    if rows_need_drafts and not np.any(drafts[1:] / costs[sizes[1:]] > drafts[0] / costs[1]):
        return 1
    gains = drafts + node_value * np.minimum(sizes - 1, valued_nodes)
    rates = gains / costs[sizes]
    return int(sizes[len(sizes) - 1 - int(np.argmax(rates[::-1]))])
