"""Sample-then-walk on a toy target (no model): token-for-token equal to plain sampling under one seed,
the right distribution (chi-square), and a sabotaged walk that the same test catches."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

from recap.core.rules import TokenRules
from recap.core.sampling import children_by_token, walk
from recap.core.tree import DraftTree

V = 5
_rng = np.random.default_rng(0)
# p(next | last token): a toy bigram target, some rows peaked, some flat
TABLE = torch.tensor(_rng.dirichlet([0.3] * V, size=V) * 0.7 + _rng.dirichlet([3.0] * V, size=V) * 0.3)
LOGITS = TABLE.log().float()  # [V, V]


def draft_tree(root: int, width: int = 2, depth: int = 3) -> DraftTree:
    """The ``width`` most likely tokens after each node, ``depth`` levels (point-mass drafts), plus a
    duplicate of the first child holding a different grandchild (as a fused tree can)."""
    tokens, parents = [root], [-1]
    frontier = [0]
    for _ in range(depth):
        nxt = []
        for node in frontier:
            for token in TABLE[tokens[node]].argsort(descending=True)[:width].tolist():
                tokens.append(token)
                parents.append(node)
                nxt.append(len(tokens) - 1)
        frontier = nxt
    first = tokens[1]
    tokens += [first, TABLE[first].argsort(descending=True)[width].item()]
    parents += [0, len(tokens) - 2]
    return DraftTree.from_lists(tokens, parents)


def rules(prompt: list[int], processors: list | None = None, max_length: int = 1000) -> TokenRules:
    criteria = StoppingCriteriaList([MaxLengthCriteria(max_length)])
    return TokenRules(LogitsProcessorList(processors or []), criteria, True, torch.tensor([prompt]))


def plain(prompt: list[int], n: int, processors: list | None = None) -> list[int]:
    """Plain sampling: one draw per token from the processed distribution after the sequence."""
    r = rules(prompt, processors)
    out = []
    for _ in range(n):
        token = r.choose(LOGITS[[prompt[-1] if not out else out[-1]]])
        r.push(token)
        out.append(token)
    return out


def speculative(prompt: list[int], n: int, processors: list | None = None, sabotage: bool = False) -> list[int]:
    """Tokens read off draft trees with ``walk``, the target's logits of each node its bigram row."""
    return speculative_steps(prompt, n, processors, sabotage)[0]


def speculative_steps(
    prompt: list[int], n: int, processors: list | None = None, sabotage: bool = False
) -> tuple[list[int], int]:
    """(tokens, trees walked)."""
    r = rules(prompt, processors)
    out: list[int] = []
    steps = 0
    while len(out) < n:
        steps += 1
        tree = draft_tree(prompt[-1] if not out else out[-1])
        logits = LOGITS[tree.tokens]  # [N, V]: the target's logits after each node

        def choose(node: int, logits=logits, tree=tree) -> int:
            token = r.choose_row(logits, node)
            kids = [int(t) for i, t in enumerate(tree.tokens) if tree.parents[i] == node]
            if sabotage and kids and token not in kids:
                return kids[0]  # the broken rule: emit the draft on a mismatch
            return token

        acceptance, _ = walk(tree, choose, r.push)
        out += [*tree.tokens[acceptance.path[1:]].tolist(), acceptance.bonus]
    return out[:n], steps


def chi_square_p_value(observed: Counter, expected: dict, runs: int) -> float:
    """P(chi-square >= statistic) with cells of expected count < 5 pooled into one."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for key, p in expected.items():
        e = p * runs
        if e < 5:
            pooled_obs += observed.get(key, 0)
            pooled_exp += e
            continue
        stat += (observed.get(key, 0) - e) ** 2 / e
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    return upper_gamma((cells - 1) / 2, stat / 2)


def upper_gamma(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x) (Numerical Recipes: series below a + 1, else a
    continued fraction)."""
    if x <= 0:
        return 1.0
    log_prefix = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = 0
        while abs(term) > 1e-15 * abs(total):
            n += 1
            term *= x / (a + n)
            total += term
        return 1.0 - math.exp(log_prefix) * total
    b, c, d = x + 1 - a, 1e300, 1 / (x + 1 - a)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > 1e-300 else 1e-300)
        c = b + an / c
        c = c if abs(c) > 1e-300 else 1e-300
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_prefix) * h


def test_walk_emits_plain_samplings_tokens_under_the_same_seed() -> None:
    processors = [RepetitionPenaltyLogitsProcessor(1.8), TemperatureLogitsWarper(0.7)]  # prefix-dependent
    steps = tokens = 0
    for seed in range(30):
        for procs in (None, processors):
            torch.manual_seed(seed)
            expected = plain([1, 3], 15, procs)
            torch.manual_seed(seed)
            got, walked = speculative_steps([1, 3], 15, procs)
            assert got == expected, f"seed {seed} processors {procs is not None}"
            steps, tokens = steps + walked, tokens + len(got)
    assert tokens > 1.5 * steps, "the walks should accept drafts (more than one token per tree)"


def test_first_tokens_follow_the_target_distribution_and_a_broken_walk_does_not() -> None:
    runs, prompt = 4000, [2]
    expected = {
        (a, b, c): float(TABLE[2, a] * TABLE[a, b] * TABLE[b, c]) for a in range(V) for b in range(V) for c in range(V)
    }
    torch.manual_seed(0)
    good = Counter(tuple(speculative(prompt, 3)) for _ in range(runs))
    torch.manual_seed(0)
    broken = Counter(tuple(speculative(prompt, 3, sabotage=True)) for _ in range(runs))
    assert chi_square_p_value(good, expected, runs) > 1e-3
    assert chi_square_p_value(broken, expected, runs) < 1e-6


def test_walk_follows_duplicate_siblings_and_reports_the_real_path() -> None:
    #        0(root 7)
    #   1(x=4)      2(x=4, duplicate)
    #   3(y=1)      4(z=2)
    tree = DraftTree.from_lists([7, 4, 4, 1, 2], [-1, 0, 0, 1, 2])
    assert children_by_token(tree) == {(0, 4): 1, (1, 1): 3, (1, 2): 4}
    picks = iter([4, 2, 0])
    seen = []

    def choose(node: int) -> int:
        seen.append(node)
        return next(picks)

    acceptance, stopped = walk(tree, choose, lambda token: False)
    assert seen == [0, 1, 4] and acceptance.path == [0, 2, 4] and acceptance.bonus == 0 and not stopped


def test_walk_stops_at_the_stopping_token_without_drawing_further() -> None:
    tree = DraftTree.from_lists([7, 4, 1, 2], [-1, 0, 1, 2])
    calls = []
    acceptance, stopped = walk(tree, lambda node: calls.append(node) or int(tree.tokens[node + 1]), lambda t: t == 1)
    assert stopped and calls == [0, 1] and acceptance.path == [0, 1] and acceptance.bonus == 1


def test_chi_square_p_values() -> None:
    assert upper_gamma(1.0, 2.0) == pytest.approx(math.exp(-2.0))  # chi-square with 2 df at 4
    assert upper_gamma(5.0, 5.0) == pytest.approx(0.4404932851, rel=1e-8)
    assert upper_gamma(5.0, 500.0) < 1e-150


def test_rules_stop_on_eos_and_max_length_like_generate() -> None:
    criteria = StoppingCriteriaList([MaxLengthCriteria(8), EosTokenCriteria([3, 4])])
    r = TokenRules(LogitsProcessorList(), criteria, False, torch.tensor([[0, 1, 2]]))
    assert r.fast and not r.tracks
    assert r.cut([5, 6]) == ([5, 6], False)
    assert r.cut([7, 4, 9]) == ([7, 4], True)
    r = TokenRules(LogitsProcessorList(), criteria, False, torch.tensor([[0, 1, 2]]))
    assert r.cut([5, 6, 7, 8, 9, 5]) == ([5, 6, 7, 8, 9], True)  # 3 + 5 = max_length 8
