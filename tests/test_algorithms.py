"""The model-free algorithm core against brute-force references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from recap import DraftTree, RecapConfig, Source, TokenMemory, TopK
from recap.core.accept import Acceptance, accept_greedy
from recap.core.calibration import N_CELLS
from recap.core.suffix import SuffixIndex
from recap.core.topk import row_concentration
from recap.drafters import RecapDrafter
from recap.drafters.prompt_lookup import lookup_continuation
from recap.drafters.token_recycling import Template, TokenRecyclingDrafter
from recap.reference.fusion import fuse_rows
from recap.reference.tree_builder import Scoring, build_tree, layout
from recap.reference.verify import accept_greedy as accept_greedy_reference
from recap.reference.verify import ancestor_mask as reference_mask


# -- suffix index ---------------------------------------------------------------------------
def naive_continuation(text: list[int], n: int) -> list[int]:
    """Longest suffix that also ends earlier; tokens after its first earlier occurrence."""
    length = len(text)
    for size in range(length - 1, 0, -1):
        suffix = text[length - size :]
        for end in range(size - 1, length - 1):
            if text[end - size + 1 : end + 1] == suffix:
                return text[end + 1 : end + 1 + n]
    return []


@pytest.mark.parametrize("alphabet", [2, 3, 5, 20])
def test_suffix_index_matches_naive_search(alphabet: int) -> None:
    rng = np.random.default_rng(alphabet)
    for _ in range(40):
        text = rng.integers(0, alphabet, size=int(rng.integers(1, 60))).tolist()
        index = SuffixIndex()
        for i, token in enumerate(text):
            index.append(token)
            assert index.continuation(4) == naive_continuation(text[: i + 1], 4), text[: i + 1]


def test_suffix_index_examples() -> None:
    index = SuffixIndex()
    index.extend([1, 2, 3, 9, 1, 2])
    assert index.longest_repeat() == (2, 1)
    assert index.continuation(2) == [3, 9]
    index.extend([7])
    assert index.continuation(4) == []


# -- acceptance ----------------------------------------------------------------------------
def random_tree(rng: np.random.Generator, n: int, vocab: int) -> DraftTree:
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    return DraftTree.from_lists(rng.integers(0, vocab, size=n).tolist(), parents)


def test_accept_greedy_matches_checking_every_path() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        tree = random_tree(rng, int(rng.integers(1, 30)), vocab=3)
        greedy = rng.integers(0, 3, size=len(tree))
        best: list[int] = [0]
        for node in range(len(tree)):
            path = tree.path(node)
            if all(tree.tokens[c] == greedy[p] for p, c in zip(path, path[1:])) and len(path) > len(best):
                best = path
        for accept in (accept_greedy, accept_greedy_reference):
            result = accept(tree, greedy)
            assert result.path == best
            assert result.bonus == greedy[best[-1]]


# -- tree type -----------------------------------------------------------------------------
def test_ancestor_mask_matches_paths() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        tree = random_tree(rng, int(rng.integers(1, 40)), vocab=50)
        mask = tree.ancestor_mask()
        assert np.array_equal(mask, reference_mask(tree))
        for i in range(len(tree)):
            assert set(np.nonzero(mask[i])[0].tolist()) == set(tree.path(i))


def test_additive_tree_mask_opens_the_prefix_and_each_path() -> None:
    from recap.kernels.verify import additive_tree_mask

    rng = np.random.default_rng(2)
    for _ in range(50):
        tree = random_tree(rng, int(rng.integers(1, 40)), vocab=50)
        length = int(rng.integers(0, 30))
        mask = additive_tree_mask(tree.parents, length, -7.0)
        assert mask.shape == (1, 1, len(tree), length + len(tree)) and mask.dtype == np.float32
        assert (mask[0, 0, :, :length] == 0).all()
        assert np.array_equal(mask[0, 0, :, length:] == 0, reference_mask(tree))
        assert set(np.unique(mask).tolist()) <= {0.0, -7.0}


def test_draft_tree_rejects_bad_parents() -> None:
    with pytest.raises(ValueError, match="parents must precede"):
        DraftTree.from_lists([1, 2, 3], [-1, 2, 0])
    with pytest.raises(ValueError, match="root"):
        DraftTree.from_lists([1, 2], [0, 0])


# -- fusion --------------------------------------------------------------------------------
def row(ids: list[int], probs: list[float]) -> tuple[list[int], list[float], float]:
    return ids, probs, float(row_concentration(np.asarray([probs], dtype=np.float32))[0])


def test_concentration_formula() -> None:
    probs = np.asarray([[0.5, 0.25, 0.0], [1.0, 0.0, 0.0]], dtype=np.float32)
    entropy = -(0.5 * math.log(0.5) + 0.25 * math.log(0.25) + 0.25 * math.log(0.25))
    assert row_concentration(probs) == pytest.approx([math.exp(-entropy), 1.0], rel=1e-5)


def test_entropy_fusion_formula() -> None:
    r3, r2, r1 = row([5, 6], [0.6, 0.1]), row([6, 7], [0.5, 0.4]), row([7, 5], [0.3, 0.2])
    spec = (1.0, 2.0, 4.0)
    tokens, q, sources = fuse_rows([(3, r3), (2, r2), (1, r1)], "entropy", spec)
    w = {3: 4.0 * r3[2], 2: 2.0 * r2[2], 1: 1.0 * r1[2]}
    total = sum(w.values())
    expected = {
        5: (w[3] * 0.6 + w[1] * 0.2) / total,
        6: (w[3] * 0.1 + w[2] * 0.5) / total,
        7: (w[2] * 0.4 + w[1] * 0.3) / total,
    }
    assert dict(zip(tokens, q)) == pytest.approx(expected)
    assert q == sorted(q, reverse=True)
    assert dict(zip(tokens, sources)) == {5: 3, 6: 3, 7: 2}


def test_fixed_and_strict_fusion() -> None:
    r2, r1 = row([1, 2], [0.9, 0.1]), row([2, 3], [0.8, 0.2])
    tokens, q, _ = fuse_rows([(2, r2), (1, r1)], "fixed", (1, 2, 4))
    expected = {1: 0.7 * 0.9 / 0.9, 2: (0.7 * 0.1 + 0.2 * 0.8) / 0.9, 3: 0.2 * 0.2 / 0.9}
    assert dict(zip(tokens, q)) == pytest.approx(expected)
    tokens, q, sources = fuse_rows([(2, r2), (1, r1)], "strict", (1, 2, 4))
    assert (tokens, q, sources) == ([1, 2], [0.9, 0.1], [2, 2])
    assert fuse_rows([], "entropy", (1, 2, 4)) == ([], [], [])


# -- tree builder --------------------------------------------------------------------------
def table_candidates(table: dict[int, list[tuple[int, float]]]):
    """Candidates keyed by the last token only (order 1)."""

    def candidates(context: tuple[int, ...]):
        cands = table.get(context[-1], [])
        return [t for t, _ in cands], [q for _, q in cands], [1] * len(cands)

    return candidates


def brute_force_best(table, root: int, budget: int, max_depth: int, width: int, hit_mass) -> list[tuple[int, ...]]:
    """Every reachable node (as its token path) with its score; the `budget` best."""
    scored = []
    frontier = [((root,), 1.0, frozenset())]
    while frontier:
        path, score, edges = frontier.pop()
        if len(path) - 1 >= max_depth:
            continue
        kept = [(t, q) for t, q in table.get(path[-1], []) if (path[-1], t) not in edges][:width]
        for t, q in kept:
            child_score = score * hit_mass(len(path)) * q
            scored.append((child_score, path[1:] + (t,)))
            frontier.append((path + (t,), child_score, edges | {(path[-1], t)}))
    scored.sort(key=lambda item: -item[0])
    return [p for _, p in scored[:budget]]


def tree_paths(tree: DraftTree) -> list[tuple[int, ...]]:
    return [tuple(tree.tokens[tree.path(i)[1:]].tolist()) for i in range(1, len(tree))]


def paper_scoring(hit_mass, max_depth: int = 10) -> Scoring:
    return Scoring(False, np.asarray([hit_mass(d) for d in range(1, max_depth + 1)]), np.full(N_CELLS, 0.5))


def grow(table, root, budget, max_depth, width, hit_mass, blocked=frozenset()) -> DraftTree:
    built = build_tree(
        (root,), table_candidates(table), budget=budget, max_depth=max_depth, max_width=width,
        scoring=paper_scoring(hit_mass, max_depth), placeholder_ids=blocked,
    )  # fmt: skip
    return layout(built, len(built))[0]


def random_table(rng: np.random.Generator, vocab: int, size: int) -> dict[int, list[tuple[int, float]]]:
    return {
        t: list(zip(rng.permutation(vocab)[:size].tolist(), sorted(rng.uniform(0.01, 1, size), reverse=True)))
        for t in range(vocab)
    }


def test_build_tree_is_best_first_within_budget_depth_and_width() -> None:
    rng = np.random.default_rng(2)
    config = RecapConfig()
    for trial in range(30):
        width = int(rng.integers(1, 4))
        table = random_table(rng, 6, 3)
        budget, depth = int(rng.integers(0, 25)), int(rng.integers(1, 6))
        tree = grow(table, 0, budget, depth, width, config.hit_mass)
        expected = brute_force_best(table, 0, budget, depth, width, config.hit_mass)
        assert sorted(tree_paths(tree)) == sorted(expected), trial
        assert len(tree) - 1 <= budget and int(tree.depths.max()) <= depth
        assert max(np.bincount(tree.parents[1:] + 1, minlength=1).tolist() + [0]) <= max(width, 1)


def test_the_first_nodes_of_a_built_tree_are_the_tree_of_every_smaller_budget() -> None:
    rng = np.random.default_rng(4)
    hit_mass = RecapConfig().hit_mass
    for trial in range(20):
        table = random_table(rng, 8, 4)
        scoring = paper_scoring(hit_mass, 6)
        built = build_tree((0,), table_candidates(table), budget=40, max_depth=6, max_width=3, scoring=scoring)
        assert built.scores == sorted(built.scores, reverse=True)  # best first
        suffix = [int(t) for t in rng.integers(8, size=3)]
        for budget in (1, 5, 17):
            small = build_tree((0,), table_candidates(table), budget=budget, max_depth=6, max_width=3, scoring=scoring)
            expected = set(tree_paths(layout(small, len(small))[0]))
            assert set(tree_paths(layout(built, budget + 1)[0])) == expected, trial
            grafted = layout(built, budget + 1, suffix, [0.5] * 3, [-1] * 3)[0]
            assert set(tree_paths(grafted)) == expected | {tuple(suffix[:n]) for n in range(1, 4)}, trial


def test_build_tree_skip_rules_and_depth_first_layout() -> None:
    # 1 -> 2 -> 1 -> 2 would reuse the edge (1, 2); 9 is blocked
    table = {1: [(9, 0.9), (2, 0.8), (3, 0.1)], 2: [(1, 0.9)], 3: [], 9: [(1, 1.0)]}
    tree = grow(table, 1, 10, 10, 8, lambda d: 1.0, blocked={9})
    paths = tree_paths(tree)
    assert (9,) not in paths
    assert paths == [(2,), (2, 1), (2, 1, 3), (3,)]  # depth-first, best child first
    assert (2, 1, 2) not in paths
    assert tree.sources.tolist() == [Source.ROOT] + [1] * 4


def test_graft_reuses_existing_nodes() -> None:
    built = build_tree(
        (5,), table_candidates({5: [(6, 0.9)], 6: [(7, 0.9)]}), budget=2, max_depth=5, max_width=2,
        scoring=paper_scoring(lambda d: 1.0),
    )  # fmt: skip
    tree, cells = layout(built, len(built), [6, 8, 9], [0.5, 0.4, 0.3], [11, 12, 13])
    assert tree_paths(tree) == [(6,), (6, 7), (6, 8), (6, 8, 9)]
    assert tree.sources.tolist() == [0, 1, 1, Source.SUFFIX, Source.SUFFIX]
    assert cells.tolist()[3:] == [12, 13]
    assert tree.probs[3] == pytest.approx(tree.probs[1] * 0.4)


def test_calibrated_scores_estimate_path_acceptance() -> None:
    """With calibrated scoring a node's score is the product of its edges' cell probabilities."""
    probs = np.linspace(0.01, 0.99, N_CELLS)
    table = {0: [(1, 0.9), (2, 0.05)], 1: [(3, 0.5)], 2: [], 3: []}
    built = build_tree(
        (0,), table_candidates(table), budget=10, max_depth=5, max_width=4, scoring=Scoring(True, np.ones(5), probs)
    )
    assert built.scores == built.probs
    from recap.core.calibration import cell_index

    p1, p2 = probs[cell_index(1, 1, 0.9)], probs[cell_index(1, 2, 0.5)]
    assert dict(zip(built.tokens, built.probs))[3] == pytest.approx(p1 * p2)


# -- memories and drafters -----------------------------------------------------------------
def test_token_memory_first_occurrence_in_a_batch_latest_across_batches() -> None:
    memory = TokenMemory(10, k=2)
    topk = TopK(np.asarray([[1, 2], [3, 4], [5, 6]]), np.asarray([[0.5, 0.1], [0.6, 0.2], [0.7, 0.3]], np.float32))
    memory.write(np.asarray([4, 4, 7]), topk)
    assert memory.row(4)[0] == [1, 2] and memory.row(7)[0] == [5, 6] and memory.row(3) is None
    memory.write(np.asarray([4]), topk, rows=np.asarray([1]))
    assert memory.row(4)[0] == [3, 4]
    assert memory.rows_filled == 2
    memory.write(np.asarray([-1, 10]), topk, rows=np.asarray([0, 1]))  # out of range: ignored
    assert memory.rows_filled == 2


def make_topk(n: int, k: int = 8, offset: int = 100) -> TopK:
    ids = np.arange(n * k).reshape(n, k) + offset
    probs = np.tile(np.linspace(0.5, 0.01, k, dtype=np.float32), (n, 1))
    return TopK(ids, probs)


@pytest.mark.parametrize("scope", ["full-tree", "committed"])
def test_recap_writes_every_key_order_per_scope(scope: str) -> None:
    memory = TokenMemory(1000)
    drafter = RecapDrafter(RecapConfig(write_scope=scope, suffix_tokens=0), memory)
    drafter.begin([11, 12, 13], [], None)
    tree = DraftTree.from_lists([13, 20, 21, 22], [-1, 0, 1, 0])
    drafter._root_context[:] = (11, 12, 13)
    topk = make_topk(4)
    accepted = accept_greedy(tree, np.asarray([20, 21, 99, 99]))
    assert accepted.path == [0, 1, 2]
    drafter.observe(tree, topk, accepted, [20, 21, 99])
    nodes = [0, 1, 2, 3] if scope == "full-tree" else [0, 1, 2]
    keys = {
        0: ((13,), (12, 13), (11, 12, 13)),
        1: ((20,), (13, 20), (12, 13, 20)),
        2: ((21,), (20, 21), (13, 20, 21)),
        3: ((22,), (13, 22), (12, 13, 22)),
    }
    for node, (k1, k2, k3) in keys.items():
        expected = topk.ids[node].tolist() if node in nodes else None
        got1 = memory.row(k1[0])
        assert (got1[0] if got1 else None) == expected
        for order, key in ((2, k2), (3, k3)):
            got = drafter.context[order].get(key)
            assert (got[0] if got else None) == expected, (node, order)


def test_recap_drafts_from_contextual_memory_and_never_drafts_blocked_tokens() -> None:
    memory = TokenMemory(1000)
    config = RecapConfig(suffix_tokens=0, node_budget=8)
    drafter = RecapDrafter(config, memory, placeholder_ids=frozenset({500}))
    drafter.begin([1, 2, 3], [], None)
    # the 1-token memory says 3 -> 500 (blocked) or 7; the 3-token memory says (1,2,3) -> 9
    memory.write(np.asarray([3]), TopK(np.asarray([[500, 7]]), np.asarray([[0.9, 0.05]], np.float32)))
    drafter.context[3].write_many([(1, 2, 3)], [([9, 8], [0.8, 0.1], 0.5)], stamp=drafter.stamp)
    tree = drafter.propose([1, 2, 3])
    tokens = tree.tokens.tolist()
    assert 500 not in tokens
    assert tokens[1] == 9 and tree.sources[1] == Source.ORDER3


def test_recap_config_validation_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="fusion"):
        RecapConfig(fusion="mean")
    with pytest.raises(ValueError, match="key_orders"):
        RecapConfig(key_orders=(1, 4))
    with pytest.raises(ValueError, match="max_width"):
        RecapConfig(max_width=9)
    assert RecapConfig(key_orders=(3, 1)).key_orders == (1, 3)
    with pytest.raises(ValueError, match="row_value=1.5: must be in"):
        RecapConfig(row_value=1.5)
    with pytest.raises(ValueError, match="row_value_nodes"):
        RecapConfig(row_value_nodes=-1)
    with pytest.raises(ValueError, match="unknown"):
        RecapConfig().replace(budget=3)


def test_token_recycling_template_and_drafts() -> None:
    template = Template.default()
    assert len(template.parents) == 81 and int(template.depths.max()) == 6
    assert np.bincount(template.depths).tolist() == [1, 8, 21, 25, 15, 8, 3]
    table = TokenMemory(50, k=8, method="token_recycling")
    drafter = TokenRecyclingDrafter(table)
    tree = drafter.propose([3])
    assert len(tree) == 81 and set(tree.tokens[1:].tolist()) == {0}  # zero-initialised table
    table.write(np.asarray([3]), TopK(np.arange(10, 18)[None], np.full((1, 8), 0.1, np.float32)))
    tree = drafter.propose([3])
    first = [i for i in range(len(tree)) if tree.depths[i] == 1]
    assert tree.tokens[first].tolist() == list(range(10, 18))


def test_prompt_lookup_matches_naive_search() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        history = rng.integers(0, 4, size=int(rng.integers(1, 30)))
        got = lookup_continuation(history, 3, 1, 5)
        expected: list[int] = []
        h = history.tolist()
        for n in range(min(3, len(h) - 1), 0, -1):
            starts = [s for s in range(len(h) - n) if h[s : s + n] == h[-n:]]
            if starts:
                expected = h[starts[-1] + n : starts[-1] + n + 5]
                break
        assert got == expected


def test_tree_sizes_respect_budget_with_real_drafter() -> None:
    memory = TokenMemory(100)
    rng = np.random.default_rng(4)
    memory.write(np.arange(100), TopK(rng.integers(0, 100, (100, 8)), np.full((100, 8), 0.1, np.float32)))
    for budget in (0, 1, 31, 63, 95):
        drafter = RecapDrafter(RecapConfig(node_budget=budget, suffix_tokens=0), memory)
        drafter.begin([1, 2], [], None)
        assert len(drafter.propose([1, 2])) == budget + 1


def test_prefill_seeds_token_memory_at_first_occurrences_and_context_memories_everywhere() -> None:
    prompt = [5, 6, 500, 500, 7, 5, 6, 8]  # 500 is an image placeholder
    plain = RecapDrafter(RecapConfig(), TokenMemory(1000), placeholder_ids=frozenset({500}))
    assert plain.prefill_positions(prompt) == [0, 1, 4, 7]
    memory = TokenMemory(1000)
    drafter = RecapDrafter(RecapConfig(seed_context_from_prefill=True), memory, placeholder_ids=frozenset({500}))
    positions = drafter.prefill_positions(prompt)
    assert positions == [0, 1, 4, 5, 6, 7]
    drafter.begin(prompt, positions, make_topk(len(positions)))
    assert memory.row(5)[0] == make_topk(1).ids[0].tolist()  # first occurrence (position 0)
    assert drafter.context[2].get((5, 6))[0] == make_topk(2).ids[1].tolist()  # positions 0-1, first wins
    assert drafter.context[2].get((500, 7)) is None and drafter.context[3].get((7, 5, 6)) is not None


def test_frequency_fallback_drafts_the_requests_most_frequent_tokens_where_no_row_exists() -> None:
    prompt = [5, 5, 500, 500, 500, 6, 5, 7, 6]  # 500 is an image placeholder: never counted
    drafter = RecapDrafter(RecapConfig(suffix_tokens=0, k=4, max_width=4), TokenMemory(1000), frozenset({500}))
    drafter.begin(prompt, [], None)
    tree = drafter.propose([9])  # nothing is known about 9 (or about anything)
    root_children = tree.tokens[tree.parents == 0].tolist()
    assert root_children == [5, 6, 7]  # counts 3, 2, 1
    assert set(tree.sources[1:].tolist()) == {int(Source.FREQUENCY)}
    assert drafter.frequent.arrays()[1].tolist() == [3 / 6, 2 / 6, 1 / 6]

    # committed output counts too
    tree = drafter.propose([9])
    drafter.observe(tree, make_topk(len(tree)), Acceptance(path=[0], bonus=7), committed=[7, 7, 7])
    assert drafter.frequent.arrays()[0][0] == 7

    # a known context uses its row, not the fallback; switched off, an unknown root has no children
    off = RecapDrafter(RecapConfig(suffix_tokens=0, frequency_fallback=False), TokenMemory(1000), frozenset({500}))
    off.begin(prompt, [], None)
    assert len(off.propose([9])) == 1


def _all_paths(tree: DraftTree) -> list[list[int]]:
    return [tree.path(i) for i in range(len(tree))]


def test_best_chain_is_the_valid_path_with_the_most_expected_tokens() -> None:
    """A chain (what vLLM verifies) is RECAP's tree cut to its best root-to-node path."""
    rng = np.random.default_rng(3)
    memory = TokenMemory(60)
    drafter = RecapDrafter(RecapConfig(node_budget=24, max_depth=6), memory)
    history = rng.integers(0, 60, size=40).tolist()
    drafter.begin(history, [], None)
    for _ in range(30):  # teach it from random verified trees
        tree = drafter.propose(history)
        topk = TopK(rng.integers(0, 60, size=(len(tree), 8)), np.sort(rng.random((len(tree), 8)))[:, ::-1] / 4)
        acceptance = accept_greedy(tree, topk.ids[:, 0])
        committed = [*tree.tokens[acceptance.path[1:]].tolist(), acceptance.bonus]
        drafter.observe(tree, topk, acceptance, committed)
        history += committed
    checked = 0
    for max_tokens, min_prob in ((4, 0.0), (2, 0.0), (6, 0.3), (3, 0.99)):
        tree = drafter.propose(history)
        cells = drafter._cells.copy()
        chain = drafter.best_chain(tree, max_tokens, min_prob)
        valid = [
            p for p in _all_paths(tree) if len(p) - 1 <= max_tokens and all(tree.probs[i] >= min_prob for i in p[1:])
        ]
        best = max(valid, key=lambda p: tree.probs[p[1:]].sum())
        assert chain.tokens.tolist() == tree.tokens[best].tolist()
        assert chain.parents.tolist() == list(range(-1, len(best) - 1)) and len(chain) <= max_tokens + 1
        assert drafter._cells.tolist() == cells[best].tolist()  # observe calibrates the chain's nodes
        checked += len(chain) > 2
    assert checked, "no chain had two drafts; the test lost its power"


def test_the_first_verified_row_of_a_request_is_keyed_by_the_prompt_tail() -> None:
    """vLLM's first verified row is the prompt's last position, learned before any propose."""
    memory = TokenMemory(1000)
    drafter = RecapDrafter(RecapConfig(), memory)
    drafter.begin([5, 11, 12, 13], [], None)
    chain = DraftTree.from_lists([13], [-1])
    drafter.observe(chain, make_topk(1), Acceptance(path=[0], bonus=100), [100])
    assert drafter.context[3].get((11, 12, 13))[0] == make_topk(1).ids[0].tolist()
    assert drafter.context[2].get((12, 13))[0] == make_topk(1).ids[0].tolist()
