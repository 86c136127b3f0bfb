"""Choosing the tree size: step costs learned per size, expected tokens from the drafter."""

from __future__ import annotations

import numpy as np
import pytest

from recap.core import step_cost
from recap.core.step_cost import StepCost, ladder

# milliseconds per step measured for tiny-qwen2.5-vl on this project's 2-core CPU (verify +
# accept + commit, 2 threads), and a GPU-like curve where a 128-node forward costs about a 1-node one
CPU_CURVE = {1: 3.36, 2: 3.78, 3: 4.08, 4: 4.07, 6: 4.83, 8: 5.17, 12: 5.72, 16: 6.11, 24: 6.87, 32: 7.89,
             48: 10.0, 64: 11.33, 96: 14.89, 128: 18.5}  # fmt: skip


def gpu_curve(nodes: int) -> float:
    return 20.0 + 0.01 * nodes


def on_curve(curve: dict[int, float], nodes: int) -> float:
    """A step's cost at ``nodes`` on a curve measured at a few sizes (interpolated)."""
    xs = sorted(curve)
    return float(np.interp(nodes, xs, [curve[x] for x in xs]))


def cpu_curve(nodes: int) -> float:
    return on_curve(CPU_CURVE, nodes)


def expected_tokens(n: int) -> np.ndarray:
    """A drafter's typical estimate: node probabilities falling off with rank."""
    probs = np.concatenate([[1.0], 0.7 * 0.93 ** np.arange(n - 1)])
    return np.cumsum(probs)


def run(cost: StepCost, curve, steps: int, rng: np.random.Generator, noise: float = 0.0) -> list[int]:
    chosen = []
    for _ in range(steps):
        expected = expected_tokens(cost.sizes[-1])
        size = cost.choose(expected)
        chosen.append(size)
        seconds = curve(size) * (1 + noise * rng.standard_normal())
        if rng.random() < noise:  # now and then a stall (a busy core, a garbage collection)
            seconds *= 20
        cost.record(size, seconds / 1000)
    return chosen


def best_size(curve, max_nodes: int) -> int:
    """recap's size rule on a known curve (costs indexed by size, as the drafter passes them)."""
    costs = np.asarray([0.0] + [curve(s) for s in range(1, max_nodes + 1)])
    return step_cost.best_size(expected_tokens(max_nodes), costs)


def test_the_size_rule_is_the_most_tokens_per_second() -> None:
    for curve, max_nodes in ((cpu_curve, 64), (gpu_curve, 128), (lambda s: 1.0 + 0.5 * s, 32)):
        expected = expected_tokens(max_nodes)
        brute = max(range(1, max_nodes + 1), key=lambda s: (expected[s - 1] / curve(s), s))
        assert best_size(curve, max_nodes) == brute
    assert best_size(lambda s: 20.0, 128) == 128  # a flat curve (verification free): the largest tree
    # a weak drafter (at most 1.4 tokens expected) where every tree costs 3 plain steps: the plain step
    weak = np.cumsum(np.concatenate([[1.0], 0.2 * 0.5 ** np.arange(63)]))
    assert step_cost.best_size(weak, np.asarray([0.0, 1.0] + [3.0] * 63)) == 1


def test_rows_valued_per_node_move_the_choice_to_a_tree_only_where_they_pay() -> None:
    weak = np.cumsum(np.concatenate([[1.0], 0.01 * 0.5 ** np.arange(63)]))  # no draft is likely
    dear = np.asarray([0.0, 1.0] + [3.0] * 63)  # every tree costs 3 plain steps
    gentle = np.concatenate([[0.0], 1.0 + 0.02 * np.arange(64)])  # 2% more per node
    assert step_cost.best_size(weak, dear, node_value=0.04, valued_nodes=8) == 1  # rows do not pay 3 steps
    assert step_cost.best_size(weak, gentle) == 1  # the drafts alone do not pay even 2%
    # each of the first 8 nodes' rows worth 0.04 tokens: 1 + 8 * 0.04 in 1.16 plain steps beats 1 in 1
    assert step_cost.best_size(weak, gentle, node_value=0.04, valued_nodes=8) == 9
    flat = np.ones(65)
    assert step_cost.best_size(weak, flat, node_value=0.04, valued_nodes=8) == 64  # free: the largest
    # where the rows count only if some tree pays on its drafts alone: not for the weak drafter (the
    # plain step), but a tree that pays on its drafts (2 nodes, 1.5 tokens in 1.02 steps) grows to 9 nodes
    assert step_cost.best_size(weak, gentle, node_value=0.04, valued_nodes=8, rows_need_drafts=True) == 1
    assert (
        step_cost.best_size(weak, flat, node_value=0.04, valued_nodes=8, rows_need_drafts=True) == 64
    )  # free: any draft pays
    paying = np.cumsum(np.concatenate([[1.0, 0.5], 0.01 * 0.5 ** np.arange(62)]))
    assert step_cost.best_size(paying, gentle) == 2
    assert step_cost.best_size(paying, gentle, node_value=0.04, valued_nodes=8, rows_need_drafts=True) == 9
    for max_nodes, value, valued in ((64, 0.04, 8), (32, 0.1, 40), (16, 0.02, 0)):  # brute force
        expected = expected_tokens(max_nodes)
        costs = np.asarray([0.0] + [cpu_curve(s) for s in range(1, max_nodes + 1)])
        gain = [expected[s - 1] + value * min(s - 1, valued) for s in range(1, max_nodes + 1)]
        brute = max(range(1, max_nodes + 1), key=lambda s: (gain[s - 1] / costs[s], s))
        assert step_cost.best_size(expected, costs, value, valued) == brute


def test_ladder() -> None:
    assert ladder(64) == [*range(1, 17), 24, 32, 48, 64]
    assert ladder(20) == [*range(1, 17), 20] and ladder(1) == [1]


def test_a_gpu_like_cost_curve_gets_the_largest_trees() -> None:
    rng = np.random.default_rng(0)
    for max_nodes in (64, 128):
        cost = StepCost(max_nodes)
        chosen = run(cost, gpu_curve, 400, rng, noise=0.02)
        settled = chosen[100:]
        expected = expected_tokens(max_nodes)
        rate = {s: expected[s - 1] / gpu_curve(s) for s in range(1, max_nodes + 1)}
        near_best = {s for s in rate if rate[s] >= 0.99 * max(rate.values())}  # the rule's own optimum: >= 40
        assert min(near_best) >= 40 and np.mean([s in near_best for s in settled]) > 0.75


def test_the_measured_cpu_curve_gets_its_fastest_size() -> None:
    """On a noisy machine (10% spread, and 1 step in 10 stalled 20x) over 20 runs: the size chosen most is near the
    best in most runs, and the tokens per second achieved, exploration and sweeps included, are within 7% of always
    the best size's in nearly all (over 300 runs: 70% and 91%)."""
    best = best_size(cpu_curve, 64)
    expected = expected_tokens(64)
    rate = {s: expected[s - 1] / cpu_curve(s) for s in range(1, 65)}
    near_best = {s for s in rate if rate[s] >= 0.97 * rate[best]}
    mode_near, fast = 0, 0
    for seed in range(20):
        settled = run(StepCost(64), cpu_curve, 600, np.random.default_rng(seed), noise=0.1)[100:]
        mode_near += max(set(settled), key=settled.count) in near_best
        fast += np.mean([rate[s] for s in settled]) > 0.93 * rate[best]
    assert mode_near >= 10 and fast >= 16


def test_a_start_up_probe_whose_step_was_not_recorded_runs_again() -> None:
    """The loop records no step whose forward was still timing kernels (``few_row_linear``), so a probe
    can leave no time: it runs again, at most ``PROBE_REPEATS`` times, before the probes go on."""
    cost = StepCost(64)
    assert cost.plan() == 1
    cost.record(1, 0.003)
    assert cost.plan() == 2
    cost.record(2, 0.003)
    assert cost.plan() == 4
    for _ in range(step_cost.PROBE_REPEATS):  # not recorded: 4 again
        assert cost.plan() == 4
    assert cost.plan() == 16  # out of repeats: on, with size 4 read off its neighbours
    cost.record(16, 0.004)  # recorded at once: on
    assert cost.plan() == 64
    cost.record(64, 0.006)
    assert cost.measured().keys() == {1, 2, 16, 64}


def test_two_nodes_cheaper_than_a_plain_step_are_found_by_the_start_up_probes() -> None:
    """One row and two run different kernels (a matrix-vector product and a matrix product): on two cores with MKL
    at a 1.5B shape a 2-node step cost 0.21 s against 0.31 s for a plain one. The probes time 2 nodes after the
    plain step, so even a drafter that expects little of its one draft verifies 2 nodes from the first step after
    them. Probing 1, 4, 16, 64 alone read 2 off 1 and 4 (0.33 s), and the rule took plain steps."""
    curve = {1: 0.31, 2: 0.21, 3: 0.36, 4: 0.38, 8: 0.45, 16: 0.53, 64: 1.45}
    weak = np.cumsum(np.concatenate([[1.0], 0.05 * 0.5 ** np.arange(63)]))  # 0.05 tokens for the first draft

    cost = StepCost(64, explore_every=0, sweep_every=0)
    tried = []
    for _ in range(30):
        tried.append(cost.choose(weak))
        cost.record(tried[-1], on_curve(curve, tried[-1]))
    assert tried[:4] == [1, 2, 4, 16]  # 64 nodes need 5.4 tokens (``_tokens_to_reach``): passed over
    assert tried[4:] == [2] * 26
    no_two = StepCost(64, explore_every=0, sweep_every=0)
    assert no_two.restore({size: [on_curve(curve, size)] * 2 for size in (1, 4, 16, 64)})
    assert no_two.choose(weak) == 1


def test_a_size_foretold_to_need_more_tokens_than_a_step_commits_is_probed_only_once_expected() -> None:
    """At a 1.5B shape on two cores 4 and 16 nodes foretell 1.13 s for 64 (1.45 s measured): 5.4 times a 2-node step
    (0.21 s), more than the ``max_gain`` (4) tokens a step is taken to commit, so 64 nodes are passed over (the probe
    took a kernel-timing forward and a timed one, 2.2 and 1.45 s, in a first call of 10 s), and probed once the
    drafter expects a tree to commit 5.4 tokens. Where 2 nodes cost what the line of 1 and 4 says, 64 nodes need 3.6
    tokens and are probed; on a flat curve too, and where the drafter expects more than that from the first."""
    cheap_two = {1: 0.31, 2: 0.21, 3: 0.36, 4: 0.38, 8: 0.45, 16: 0.53, 64: 1.45}

    def probes(curve, expects: float = 0.0) -> list[int]:
        cost = StepCost(64, explore_every=0, sweep_every=0)
        cost.expect(expects)
        tried = []
        while (size := cost.plan()) is not None:
            tried.append(size)
            cost.record(size, on_curve(curve, size))
        return tried

    assert probes(cheap_two) == [1, 2, 4, 16]
    assert probes({**cheap_two, 2: 0.33}) == [1, 2, 4, 16, 64]
    assert probes({1: 0.02, 64: 0.026}) == [1, 2, 4, 16, 64]
    assert probes(cheap_two, expects=6.0) == [1, 2, 4, 16, 64]

    cost = StepCost(64, explore_every=0, sweep_every=0)
    tried = []
    for expects in [1.5] * 12 + [5.0] * 3 + [5.5] * 3:
        tried.append(cost.choose(np.linspace(1.0, expects, 64)))
        cost.record(tried[-1], on_curve(cheap_two, tried[-1]))
    assert tried[:4] == [1, 2, 4, 16] and 64 not in tried[:15]  # 5.0 tokens: not yet
    assert tried[15] == 64  # with 5.5 expected, once (1.45 s, 1.3x the line of 4 and 16: ``FORETOLD``)
    assert 64 not in tried[16:] and cost.measured()[64] == pytest.approx(1.45)


def test_a_size_costs_what_the_cheapest_size_at_least_as_big_costs() -> None:
    cost = StepCost(64, explore_every=0, sweep_every=0)
    assert cost.costs().tolist() == [1.0] * len(cost.sizes)  # nothing measured: verification looks free
    for seconds in (0.004, 0.004, 0.100):  # a stray slow step does not move the median
        cost.record(4, seconds)
    for seconds in (0.003, 0.003):  # cheaper than size 4: a 4-node tree can be filled up to 16 nodes
        cost.record(16, seconds)
    cost.record(32, 0.006)
    costs = dict(zip(cost.sizes, cost.costs()))
    assert costs[4] == costs[16] == pytest.approx(0.003)
    assert costs[1] == costs[4]  # flat below the smallest measured size
    assert costs[24] == pytest.approx(0.003 + 0.003 * 8 / 16)  # interpolated
    assert costs[64] == pytest.approx(0.006 + (0.006 - 0.003) / 16 * 32)  # the last slope, beyond
    assert list(costs.values()) == sorted(costs.values())
    assert best_size(lambda s: float(cost.dense()[s]), 64) >= 16  # never the dearer 4-node tree
    cost.record(64, 0.010)
    cost.record(70, 0.5)  # larger than the ladder: counted with the largest size
    assert cost.measured()[64] == pytest.approx(0.010)  # of two times the lower (the median would be their mean)
    cost.record(64, 0.012)
    assert cost.measured()[64] == pytest.approx(0.012)  # of three and more the median


def test_a_size_timed_for_the_first_time_counts_at_once() -> None:
    """A size never timed is read off the sizes that were (here the flat slope beyond 4 nodes, as
    cheap as a plain step); once it has been timed, the next choice sees its real price, not the
    costs computed before it (refreshed only every ``DENSE_REFRESH`` step times otherwise)."""
    cost = StepCost(8, explore_every=0, sweep_every=0)
    for _ in range(3):
        cost.record(1, 0.001)
        cost.record(4, 0.001)
    strong = np.cumsum(np.concatenate([[1.0], 0.3 * np.ones(7)]))  # 0.3 tokens more for every node
    assert cost.dense()[8] == pytest.approx(0.001) and step_cost.best_size(strong, cost.dense()) == 8
    cost.record(8, 0.0025)  # 2.5 plain steps: no tree of 8 nodes pays
    assert cost.dense()[8] == pytest.approx(0.0025)
    assert step_cost.best_size(strong, cost.dense()) == 4


def test_one_time_far_above_the_line_of_the_sizes_below_waits_for_a_second() -> None:
    """A size timed once, more than ``OFF_LINE`` times the line through the two measured sizes below it, is a
    stall until a second time says otherwise: read off its neighbours, it does not make every size between it and
    the next one measured look dear. Its second time settles it either way (of two times the lower counts)."""
    cost = StepCost(64, explore_every=0, sweep_every=0)
    for size, seconds in ((1, 0.003), (4, 0.004), (16, 0.006), (64, 0.011)):
        cost.record(size, seconds)
    on_line = dict(zip(cost.sizes, cost.costs()))
    cost.record(32, 0.120)  # a stall: 15x the line of 4 and 16 at 32 nodes (0.008)
    assert dict(zip(cost.sizes, cost.costs())) == on_line  # read off 16 and 64, as before it was timed
    cost.record(32, 0.0075)
    assert cost.costs()[cost.sizes.index(32)] == pytest.approx(0.0075)
    truly_dear = StepCost(64, explore_every=0, sweep_every=0)
    for size, seconds in ((1, 0.003), (4, 0.004), (16, 0.006), (32, 0.030), (32, 0.031)):
        truly_dear.record(size, seconds)
    assert truly_dear.costs()[truly_dear.sizes.index(32)] == pytest.approx(0.030)  # twice: a price
    near = StepCost(64, explore_every=0, sweep_every=0)
    for size, seconds in ((1, 0.003), (4, 0.004), (16, 0.006), (64, 0.022)):  # 1.9x the line (0.0116): a price
        near.record(size, seconds)
    assert near.costs()[near.sizes.index(64)] == pytest.approx(0.022)


def test_a_stalled_probe_of_the_largest_tree_is_measured_again() -> None:
    """On a flat (GPU-like) curve the start-up probe of the largest tree stalls (20 plain steps):
    it is measured again at once, and of its two times the lower counts, so the largest trees are
    still chosen. Before, the stall stood for the largest size (probed only once, the median of
    two being their mean), and the rule settled on smaller trees for good."""
    cost = StepCost(64, explore_every=0, sweep_every=0)
    expected = expected_tokens(64)
    tried = []
    for _ in range(12):
        size = cost.choose(expected)
        tried.append(size)
        cost.record(size, 0.4 if len(tried) == 5 else 0.02)  # the fifth step, the 64-node probe, stalls
    assert tried[:6] == [1, 2, 4, 16, 64, 64]
    assert tried[6:] == [64] * 6


def test_a_dear_probe_of_the_largest_tree_is_timed_again_only_if_far_above_the_line() -> None:
    """The largest size's start-up probe costs more than ``max_gain`` plain steps. Near the line of the two sizes
    below it (at most ``FORETOLD`` times), that is its price and the probes end: no later probe depends on it, and
    timing it again costs one more forward of the largest tree. Far above the line (a stall?) it is timed again."""
    for largest, again in ((0.021, False), (0.040, True)):  # line of 4 and 16 at 64: 0.015 (1.4x and 2.7x)
        curve = {1: 0.005, 2: 0.006, 4: 0.0075, 16: 0.009, 64: largest}
        cost = StepCost(64, explore_every=0, sweep_every=0)
        tried = []
        for _ in range(6):
            tried.append(cost.plan() or 0)
            if tried[-1]:
                cost.record(tried[-1], curve[tried[-1]])
        assert tried == [1, 2, 4, 16, 64, 64 if again else 0]
        assert cost.measured()[64] == largest


def test_a_probe_that_stalls_twice_is_no_price() -> None:
    """Both times of the 4-node start-up probe stall (20 times its cost, as in a burst of other work): more than
    ``STALL_FACTOR`` x 4 plain steps, which no 4-row forward costs, so neither is kept as its price. Kept, they made
    the size look dearer than ``max_gain`` plain steps, and the rule held to 1-3 nodes where 24 is best."""
    cost = StepCost(64, explore_every=0, sweep_every=0)
    tried = []
    for _ in range(60):
        size = cost.choose(expected_tokens(64))
        tried.append(size)
        stalled = size == 4 and tried.count(4) <= 2
        cost.record(size, cpu_curve(size) * (20 if stalled else 1) / 1000)
    assert tried[:5] == [1, 2, 4, 4, 4]  # a probe that left no time runs again: stalled, stalled, then timed
    assert cost.measured()[4] == pytest.approx(cpu_curve(4) / 1000)
    assert cost.worth_trying() == len(cost.sizes) - 1
    expected = expected_tokens(64)
    rate = {s: expected[s - 1] / cpu_curve(s) for s in range(1, 65)}
    assert rate[tried[-1]] >= 0.97 * rate[best_size(cpu_curve, 64)]


def test_start_up_probes_stop_where_no_tree_can_pay() -> None:
    """On a curve where every tree costs far more than the tokens it could commit (a big model on
    two cores), the probes climb from the plain step and stop at the first size dearer than
    ``max_gain`` plain steps, measured twice: the largest trees are never tried."""
    cost = StepCost(256, max_gain=4.0)
    curve = {1: 0.111, 2: 0.211, 3: 0.2, 4: 0.187, 6: 0.185, 8: 0.180, 12: 0.2, 16: 0.225, 24: 0.33, 32: 0.5,
             48: 0.6, 64: 0.73, 96: 0.9, 128: 1.1, 192: 1.5, 256: 1.9}  # fmt: skip
    tried = []
    for _ in range(200):
        size = cost.plan() or 1
        tried.append(size)
        cost.record(size, on_curve(curve, size))
    assert tried[:6] == [1, 2, 4, 16, 64, 64]  # then each probe 4x the last; 64 > 4 x 0.111: probed twice, no more
    assert max(tried) == 64 and tried.count(64) <= 2 + 200 // 64  # and now and then in a sweep


def test_choose_stays_within_the_tree_built() -> None:
    cost = StepCost(64)
    for _ in range(50):
        assert cost.choose(np.cumsum(np.ones(10))) <= 10
        assert cost.choose(np.ones(1)) == 1


def test_exploration_takes_a_bounded_share_of_the_time() -> None:
    """Where the plain step is the fastest (a weak drafter on the 0.36B curve, where every tree
    costs 1.6 plain steps or more), the forced sizes of exploration and sweeps cost at most
    ``explore_share`` of the time beyond the start-up probes; they still happen, so the costs stay
    current."""
    curve = {1: 0.111, 2: 0.211, 3: 0.2, 4: 0.187, 6: 0.185, 8: 0.180, 12: 0.2, 16: 0.225, 24: 0.33, 32: 0.4,
             48: 0.45, 64: 0.473}  # fmt: skip
    weak = np.cumsum(np.concatenate([[1.0], 0.2 * 0.5 ** np.arange(63)]))
    cost = StepCost(64, explore_share=0.005)
    chosen = []
    for _ in range(3000):
        size = cost.choose(weak)
        chosen.append(size)
        cost.record(size, on_curve(curve, size))
    after_probes = chosen[10:]
    seconds = [on_curve(curve, s) for s in after_probes]
    overhead = sum(seconds) / (len(after_probes) * curve[1]) - 1
    assert 0 < overhead <= 0.006, overhead
    assert sum(s > 1 for s in after_probes) >= 5  # forced sizes still measured now and then


def test_sizes_timed_at_different_speeds_compare_as_if_timed_together() -> None:
    """The machine slows down 1.6x while only plain steps run: the 8-node size, timed before,
    still costs more than the plain step. Kept as measured, its old median would make the plain
    step look as cheap as it (the cheapest size at least as big), and every tree free."""
    rng = np.random.default_rng(7)
    tracked, as_measured = StepCost(8, explore_every=0, sweep_every=0), StepCost(8, speed_window=0)
    for cost in (tracked, as_measured):
        for _ in range(20):
            cost.record(1, 0.0010 * (1 + 0.03 * rng.standard_normal()))
            cost.record(8, 0.0013 * (1 + 0.03 * rng.standard_normal()))
        for _ in range(300):  # slower now, with a stall now and then
            cost.record(1, 0.0016 * (1 + 0.03 * rng.standard_normal()) * (20 if rng.random() < 0.02 else 1))
    costs = dict(zip(tracked.sizes, tracked.costs()))
    assert costs[8] / costs[1] == pytest.approx(1.3, rel=0.05) and tracked.speed == pytest.approx(1.6, rel=0.05)
    flat = dict(zip(as_measured.sizes, as_measured.costs()))
    assert flat[1] == flat[8] and as_measured.speed == 1.0
    weak = np.cumsum(np.concatenate([[1.0], 0.02 * 0.5 ** np.arange(7)]))  # 0.04 tokens expected at most
    assert step_cost.best_size(weak, tracked.dense()) == 1 and step_cost.best_size(weak, as_measured.dense()) == 8


def test_restored_step_times_skip_the_start_up_probes_and_follow_the_machine() -> None:
    """A process started from an earlier one's times (``snapshot`` -> ``restore``) forces no probe:
    its first choice is the best size on those costs. On a machine now 1.5x slower its choices and
    relative costs stay those of the curve (the speed index scales them). Nothing is restored into a
    model that has taken a step, and bad times are refused."""
    rng = np.random.default_rng(11)
    earlier = StepCost(64)
    assert earlier.snapshot() is None  # the probes are not done
    run(earlier, cpu_curve, 400, rng, noise=0.03)
    times = earlier.snapshot()
    assert times is not None and 1 in times and all(len(t) <= earlier.window for t in times.values())
    later = StepCost(64)
    assert later.restore(times)
    assert later.plan() is None  # no probe forced
    assert np.allclose(later.costs(), earlier.costs())
    best = best_size(cpu_curve, 64)
    chosen = run(later, lambda s: 1.5 * cpu_curve(s), 300, rng, noise=0.03)
    assert chosen[0] in {s for s in range(1, 65) if abs(s - best) <= 2}
    assert max(set(chosen), key=chosen.count) == best and later.speed == pytest.approx(1.5, rel=0.1)
    costs = dict(zip(later.sizes, later.costs()))
    assert costs[16] / costs[1] == pytest.approx(cpu_curve(16) / cpu_curve(1), rel=0.1)
    used = StepCost(64)
    used.record(1, 0.003)
    assert not used.restore(times) and used.snapshot() is None  # a model in use keeps its own probes
    for bad, match in (({1: [0.003], 17: [0.004]}, "not a size"), ({1: [0.003, -1.0]}, "positive"),
                       ({1: []}, "positive"), ({4: [0.003]}, "plain step")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            StepCost(64).restore(bad)


def test_a_drifting_machine_still_gets_its_fastest_size() -> None:
    """The measured CPU curve on a machine whose speed wanders by up to 1.5x over minutes: the
    size chosen most often is still near the best, and the tokens per second close to it."""
    rng = np.random.default_rng(3)
    cost = StepCost(64)
    best = best_size(cpu_curve, 64)
    clock = [0]

    def drifting(size: int) -> float:
        clock[0] += 1
        return cpu_curve(size) * (1.25 + 0.25 * np.sin(clock[0] / 150))

    settled = run(cost, drifting, 1500, rng, noise=0.05)[100:]
    expected = expected_tokens(64)
    rate = {s: expected[s - 1] / cpu_curve(s) for s in range(1, 65)}
    near_best = {s for s in rate if rate[s] >= 0.97 * rate[best]}
    assert max(set(settled), key=settled.count) in near_best
    assert np.mean([rate[s] for s in settled]) > 0.93 * rate[best]


def run_threads(cost: StepCost, step_ms, steps: int, base: int = 2) -> list[int]:
    """Plain steps whose time depends on the thread count they run on: ``step_ms(threads, step)``."""
    cost.begin_threads(base)
    counts = []
    for step in range(steps):
        threads = cost.next_threads()
        counts.append(threads)
        cost.record(1, step_ms(threads, step) / 1000, threads)
    return counts


def test_a_busy_core_moves_the_steps_to_fewer_threads_and_back() -> None:
    """One core of two busy (2 threads take 3x as long as 1) from step 200 to 600: the steps move
    to one thread within a few trials, and back to two once two are faster again (as soon as
    the trials' bounded price lets a trial run)."""
    rng = np.random.default_rng(11)

    def step_ms(threads: int, step: int) -> float:
        busy = 200 <= step < 600
        ms = {1: 9.0, 2: 27.0 if busy else 5.0}[threads]
        return ms * (1 + 0.05 * rng.standard_normal())

    cost = StepCost(64, explore_every=0, sweep_every=0)
    counts = run_threads(cost, step_ms, 1000)
    assert set(counts[:200]) <= {1, 2} and counts[:200].count(2) > 180  # trials of 1 thread, priced
    assert counts[300:600].count(1) > 280
    assert counts[800:].count(2) > 190
    assert cost.threads.switches == 2


def test_thread_trials_take_a_bounded_share_of_the_time() -> None:
    """Two threads twice as fast as one (a big model, both cores free): trials of one thread
    cost at most ``explore_share`` of the time, and the choice never moves."""
    cost = StepCost(64, explore_every=0, sweep_every=0)
    counts = run_threads(cost, lambda threads, step: 10.0 / threads, 3000)
    extra = sum(5.0 for c in counts if c == 1) / (len(counts) * 5.0)  # a 1-thread step costs 5 ms more
    assert 0 < extra <= cost.threads.explore_share + 0.002, extra
    assert cost.threads.switches == 0 and cost.threads.current == 2


def test_thread_trials_back_off_on_a_steady_machine_and_resume_when_its_speed_moves() -> None:
    """Both cores free and one thread no faster (a tiny model): each trial that finds nothing
    doubles the wait for the next, up to ``max_backoff`` x ``every`` steps; a core taken at step
    3000 moves the speed reading, the next trial comes within ``every`` steps and the steps go to
    one thread."""
    rng = np.random.default_rng(7)

    def step_ms(threads: int, step: int) -> float:
        ms = 15.0 if threads == 2 and step >= 3000 else 5.0
        return ms * (1 + 0.05 * rng.standard_normal())

    cost = StepCost(64, explore_every=0, sweep_every=0)
    choice = cost.threads
    starts = []
    cost.begin_threads(2)
    for step in range(3400):
        before = choice.trials
        threads = cost.next_threads()
        if choice.trials > before:
            starts.append(step)
        cost.record(1, step_ms(threads, step) / 1000, threads)
    quiet = [s for s in starts if s < 3000]
    gaps = np.diff(quiet)
    assert gaps[0] < gaps[1] < gaps[2] and gaps[0] < 3 * choice.every  # 64, 128, 256 (+ the trial's steps)
    assert min(gaps[4:]) >= choice.every * choice.max_backoff  # at most once per 256 steps
    assert len(quiet) <= 4 + 3000 // (choice.every * choice.max_backoff)  # unbacked: ~3000 / 36
    busy = [s for s in starts if s >= 3000]
    assert busy and busy[0] < 3000 + 2 * choice.every
    assert choice.current == 1


def test_the_thread_choice_never_exceeds_the_callers_count() -> None:
    """A caller on one thread gets one thread at every step; a caller on 8 tries 4 and 16 never."""
    cost = StepCost(8, explore_every=0, sweep_every=0)
    assert set(run_threads(cost, lambda threads, step: 5.0, 300, base=1)) == {1}
    cost = StepCost(8, explore_every=0, sweep_every=0)
    assert set(run_threads(cost, lambda threads, step: 40.0 / threads, 300, base=8)) == {8, 4}


@pytest.mark.parametrize("seed", range(5))
def test_a_busy_core_from_the_first_step_is_found_within_the_first_requests(seed: int) -> None:
    """A core busy from the start (2 threads take 3x as long as 1) and trees of many sizes, most
    with few times yet: the first trial comes as soon as the speed is read, its steps are read
    against their sizes' estimated costs, and the steps move to one thread within a few dozen
    (here the worst case: sizes spread evenly over 16 ladder sizes)."""
    rng = np.random.default_rng(seed)
    cost = StepCost(16, explore_every=0, sweep_every=0)
    cost.begin_threads(2)
    counts = []
    for _ in range(200):
        threads = cost.next_threads()
        counts.append(threads)
        nodes = int(rng.integers(1, 17))
        ms = cpu_curve(nodes) * (3.0 if threads == 2 else 1.0) * (1 + 0.05 * rng.standard_normal())
        cost.record(nodes, ms / 1000, threads)
    assert cost.threads.current == 1
    # each of the 16 sizes is its own ladder size: the speed is read once sizes have 3 times each
    assert counts.index(1) < 40 and counts[48:].count(1) > 145


def test_fewer_threads_on_a_wash_go_back_to_the_callers_count() -> None:
    """A core busy for the first 150 steps moves the steps to one thread; once free, one thread
    and two run equally fast (a tiny model): the steps go back to the caller's two at the first
    trial the bounded price lets run (trials of one thread go on, at no price), instead of staying
    on one for the rest of the process."""
    rng = np.random.default_rng(5)

    def step_ms(threads: int, step: int) -> float:
        ms = 15.0 if threads == 2 and step < 150 else 5.0
        return ms * (1 + 0.05 * rng.standard_normal())

    cost = StepCost(64, explore_every=0, sweep_every=0)
    counts = run_threads(cost, step_ms, 1000)
    assert counts[100:150].count(1) > 40
    assert cost.threads.current == 2 and counts[700:].count(2) > 250
