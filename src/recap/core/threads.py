"""How many torch threads a CPU decode step runs on, learned from step times as decoding goes.

No count is right everywhere, and the right one changes while a request runs. On this project's
2-core AMD EPYC, with both cores free, ``generate`` on tiny-qwen2.5-vl takes 5.4 ms a token on 1
or 2 threads, and at a 0.5B shape 2 threads are ~1.8x faster than 1. With another process keeping
one core busy, a forward split over 2 threads waits at every parallel region for the thread that
shares its core: 15 ms a token on 2 threads, 5.6 on 1.

``ThreadChoice`` runs, now and then, a short trial of a neighbouring count (half or double the
current one, between 1 and the caller's own count) and moves down to it when its steps ran faster
than the current count's by a wide margin (in 70% of the time by default), and back up when they
did not run slower. The margin down is wide on purpose: with both cores free, one thread runs
tiny-qwen2.5-vl's small trees up to 20% faster and its big ones 45% slower, so a narrow margin
moved to one thread on noise and small trees, and the bench lost 3-5% against fixed threads; a
busy core's 2.5-3x is far beyond it. Up needs no margin, so a move down on a wash (a trial timed
in a slow moment) is undone at the next trial instead of sticking for the rest of the process. A step's speed is
its log time over the median time of its tree size (the speed reading of
``recap.core.step_cost``), so trial steps of any size compare with the current count's steps of
any other. Trials have a bounded price: what they took beyond the current count's speed is at
most ``explore_share`` of the time, and a trial whose first steps run clearly slower ends early.
On a steady machine running the caller's count, each trial that does not move the count doubles
the steps to the next one (up to ``max_backoff`` times ``every``): a quiet machine stops paying for
trials that keep finding nothing. A change of speed (the speed reading moved by a quarter since the
last trial: another process took a core, or left it) brings the next trial back to ``every`` steps,
and below the caller's count the trials back up stay at ``every``.
The caller's count is never exceeded; this object only decides, the decode loop sets the count
(and sets the caller's back when the request ends).
"""

from __future__ import annotations

import math
import statistics

_CLEARLY_SLOWER = math.log(1.25)  # a trial whose first two timed steps both ran this much slower ends
_SPEED_MOVED = math.log(1.25)  # a speed reading this far from the one after the last trial ends the back-off


class ThreadChoice:
    """The thread count of the next step, and trials of the neighbouring counts (not thread-safe:
    ``StepCost`` calls it under its lock).

    ``trial_steps``: timed steps a trial takes; ``margin``: a lower trial count must run in at most
    this fraction of the current count's time (the median over its steps) to be taken, a higher
    one in at most the current count's time;
    ``explore_share``: the most of the time that trials may take beyond the current count's speed;
    ``every``: steps between trials at least; ``max_backoff``: on a steady machine the steps between
    trials double after each trial that did not move, up to this many times ``every``.
    """

    def __init__(
        self,
        trial_steps: int = 4,
        margin: float = 0.7,
        explore_share: float = 0.01,
        every: int = 32,
        max_backoff: int = 8,
    ) -> None:
        if trial_steps < 1 or not 0 < margin < 1 or explore_share < 0 or every < 1 or max_backoff < 1:
            raise ValueError(
                f"ThreadChoice needs trial_steps >= 1, 0 < margin < 1, explore_share >= 0, every >= 1, "
                f"max_backoff >= 1; got {trial_steps}, {margin}, {explore_share}, {every}, {max_backoff}"
            )
        self.trial_steps = trial_steps
        self.log_margin = math.log(margin)
        self.explore_share = explore_share
        self.every = every
        self.max_backoff = max_backoff
        self.trials = 0  # trials started
        self._interval = every  # steps from one trial's end to the next's start (``every`` backed off)
        self._mark: float | None = None  # the speed reading after the last trial (None: read at the next step)
        self.base = 0  # the caller's thread count: the most any step uses (0: not begun)
        self.current = 0  # the count steps run on outside trials
        self.switches = 0  # how often ``current`` moved
        self._trial: int | None = None  # the count on trial
        self._trial_speeds: list[float] = []  # log speeds of the trial's timed steps
        self._trial_runs = 0  # trial steps run, timed or not
        self._since = every  # steps at the current count since the last trial (the first comes once speed is known)
        self._lower_next = True  # trials alternate between the lower and the higher neighbour
        self._spent = 0.0  # seconds trials took beyond the current count's speed
        self._total = 0.0  # seconds of all steps

    def begin(self, base: int) -> None:
        """A request starts on a caller whose torch thread count is ``base``: a new count starts
        the choice afresh at it."""
        if base < 1:
            raise ValueError(f"a thread count is >= 1, got {base}")
        if base != self.base:
            self.base = self.current = base
            self._trial, self._trial_speeds, self._trial_runs, self._since = None, [], 0, self.every
            self._interval, self._mark = self.every, None

    def next(self, speed_known: bool) -> int:
        """The thread count of the next step. ``speed_known``: the current count's speed has been
        read (a trial needs it to compare with)."""
        if (
            self._trial is None
            and speed_known
            and self._since >= self._interval
            and self._spent <= self.explore_share * self._total
        ):
            lower, higher = max(1, self.current // 2), min(self.base, 2 * self.current)
            options = [n for n in ((lower, higher) if self._lower_next else (higher, lower)) if n != self.current]
            if options:
                self._trial, self._trial_speeds, self._trial_runs = options[0], [], 0
                self._lower_next = options[0] > self.current
                self.trials += 1
        return self._trial if self._trial is not None else self.current

    def record(self, threads: int, seconds: float, log_speed: float | None, current_log_speed: float) -> bool:
        """A step ran on ``threads`` and took ``seconds``; ``log_speed`` is its log time over its
        size's median (None where that size has too few times), ``current_log_speed`` the current
        count's. Returns True when the current count moved to the trial's: its timed steps' log
        speeds (``trial_speeds``) are then the current count's speed reading."""
        self._total += seconds
        if threads != self._trial:
            self._since += 1
            if self._mark is None:
                self._mark = current_log_speed
            elif abs(current_log_speed - self._mark) > _SPEED_MOVED:  # the machine changed: look again soon
                self._interval, self._mark = self.every, current_log_speed
            return False
        self._trial_runs += 1
        if log_speed is not None:
            self._trial_speeds.append(log_speed)
            self._spent += max(0.0, seconds * (1 - math.exp(current_log_speed - log_speed)))
        speeds = self._trial_speeds
        clearly_slower = len(speeds) >= 2 and min(speeds) > current_log_speed + _CLEARLY_SLOWER
        if not (len(speeds) >= self.trial_steps or clearly_slower or self._trial_runs >= 2 * self.trial_steps):
            return False
        trial, self._trial, self._since, self._mark = self._trial, None, 0, None
        # fewer threads must prove a wide margin; back towards the caller's count it is enough not
        # to run slower (the caller's count is the default: a move down on a wash does not stick)
        margin = self.log_margin if trial < self.current else 0.0
        if speeds and statistics.median(speeds) < current_log_speed + margin:
            self.current = trial
            self.switches += 1
            self._interval = self.every
            return True
        # nothing found: on the caller's count the next trial waits twice as long (below it, trials
        # back up keep their pace: the other process may be gone)
        at_base = self.current == self.base
        self._interval = min(2 * self._interval, self.every * self.max_backoff) if at_base else self.every
        return False

    @property
    def trial_speeds(self) -> list[float]:
        """The log speeds of the last trial's timed steps."""
        return list(self._trial_speeds)
