"""The compiled hot path (recap.kernels) against its pure-Python references, on many random cases."""

from __future__ import annotations

import numpy as np
import pytest

from recap import TokenMemory, TopK, jit
from recap.core.calibration import N_CELLS, Calibration, cell_index
from recap.core.memory import ContextTable
from recap.core.step_cost import best_size
from recap.kernels import drafting, tables
from recap.reference.context_memory import ContextMemory, evict_least_used
from recap.reference.fusion import fuse_rows, lookup_rows
from recap.reference.tree_builder import Scoring, build_tree, layout

K = 4


def random_topk(rng: np.random.Generator, n: int, vocab: int, k: int = K) -> TopK:
    ids = np.asarray([rng.choice(vocab, size=k, replace=False) for _ in range(n)]).reshape(n, k)
    raw = np.sort(rng.dirichlet(np.full(k, 0.5), size=n), axis=1)[:, ::-1] * rng.uniform(0.3, 1.0, (n, 1))
    return TopK(ids, raw.astype(np.float32))


def rows_of(topk: TopK) -> list[tuple[list[int], list[float], float]]:
    return list(zip(topk.ids.tolist(), topk.probs.tolist(), topk.concentration.tolist()))


def test_context_table_reads_and_writes_like_the_dict_memory() -> None:
    rng = np.random.default_rng(0)
    for order in (2, 3):
        table, reference = ContextTable(order, K, capacity=16), ContextMemory(order)
        for _ in range(60):  # batches with repeated keys; grows past its first capacity
            m = int(rng.integers(1, 30))
            keys = [tuple(int(t) for t in rng.integers(0, 12, size=order)) for _ in range(m)]
            topk = random_topk(rng, m, 50)
            table.write_many(keys, rows_of(topk))
            reference.write_many(keys, rows_of(topk))
            assert len(table) == len(reference)
            for _ in range(20):
                key = tuple(int(t) for t in rng.integers(0, 13, size=order))
                got, want = table.get(key), reference.get(key)
                assert (got is None) == (want is None)
                if got is not None:
                    assert got[0] == want[0] and got[1] == pytest.approx(want[1]) and got[2] == pytest.approx(want[2])
        table.clear()
        assert len(table) == 0 and table.get(keys[0]) is None


def test_eviction_equals_the_reference_and_keeps_the_table_readable() -> None:
    rng = np.random.default_rng(11)
    for trial in range(80):
        order = int(rng.integers(2, 4))
        table = ContextTable(order, K, capacity=16)
        n = int(rng.integers(1, 120))
        keys = list({tuple(int(t) for t in rng.integers(0, 40, size=order)) for _ in range(n)})
        topk = random_topk(rng, len(keys), 50)
        stamps = rng.integers(0, 6, size=len(keys))  # stamps 0..5, some of them "under way"
        used = rng.integers(0, 12, size=len(keys))  # few distinct use times: many ties
        for j, key in enumerate(keys):
            table.write_many([key], [rows_of(topk)[j]], stamp=int(stamps[j]), used=int(used[j]))
        protected = {int(s) for s in rng.choice(6, size=int(rng.integers(0, 4)), replace=False)}
        keep = int(rng.integers(0, len(keys) + 2))
        packed = {table.pack(key): key for key in keys}
        reference = {table.pack(key): (int(stamps[j]), int(used[j])) for j, key in enumerate(keys)}
        gone = evict_least_used(reference, protected, keep)
        table.protected = protected
        table.evict(keep)
        assert len(table) == len(keys) - len(gone) == min(len(keys), keep), trial
        for j, key in enumerate(keys):
            got = table.get(key)
            if table.pack(key) in gone:
                assert got is None, trial
            else:
                assert got is not None and got[0] == topk.ids[j].tolist(), trial
                slot = tables.find(table.keys, table.pack(key))
                assert (table.stamps[slot], table.used[slot]) == (stamps[j], used[j])
        assert set(packed) - gone == set(table.keys[table.keys != tables.EMPTY].tolist())


def test_a_bounded_table_ages_instead_of_starting_afresh() -> None:
    """Writes past the budget evict the least recently used rows only; the rows of the request under
    way stay, and rows drafting reads stay fresh."""
    rng = np.random.default_rng(12)
    protected = {99}
    table = ContextTable(2, K, max_keys=256, protected=protected)
    hot = [(1, t) for t in range(20)]  # read every step: must survive
    table.write_many(hot, rows_of(random_topk(rng, len(hot), 50)), stamp=1, used=0)
    own = [(2, t) for t in range(30)]  # the request under way: must survive
    table.write_many(own, rows_of(random_topk(rng, len(own), 50)), stamp=99, used=0)
    for now in range(1, 200):
        for key in hot:  # what fuse_context does on a read
            table.used[tables.find(table.keys, table.pack(key))] = now
        batch = [(1000 + now, t) for t in range(25)]
        table.write_many(batch, rows_of(random_topk(rng, len(batch), 50)), stamp=now, used=now)
        assert len(table) <= 256
        assert all(table.get(key) is not None for key in hot + own)
        assert all(table.get(key) is not None for key in batch)
    assert table.evictions > 10 and table.evicted > 150 * 25
    assert len(table) >= 0.75 * 256 - 25  # never emptied


def test_packed_keys_are_distinct_up_to_the_largest_token() -> None:
    big = tables.MAX_TOKEN
    keys = {tables.pack_key(a, b, c) for a in (0, 1, big) for b in (0, 1, big) for c in (0, 1, big)}
    assert len(keys) == 27 and min(keys) >= 0
    assert tables.pack_key(-1, big, big) >= 0 and tables.pack_key(-1, -1, 3) == tables.EMPTY


def test_token_memory_write_keeps_first_occurrence_in_a_batch() -> None:
    rng = np.random.default_rng(1)
    memory = TokenMemory(40, k=K)
    reference: dict[int, list[int]] = {}
    for _ in range(100):
        n = int(rng.integers(1, 20))
        keys = rng.integers(-2, 42, size=n)
        topk = random_topk(rng, n, 40)
        memory.write(keys, topk)
        seen = set()
        for j, key in enumerate(keys.tolist()):
            if 0 <= key < 40 and key not in seen:
                seen.add(key)
                reference[key] = topk.ids[j].tolist()
    assert {t: memory.row(t)[0] for t in range(40) if memory.row(t)} == reference


def test_node_context_keys_follow_each_nodes_own_path() -> None:
    rng = np.random.default_rng(2)
    blocked = np.zeros(30, bool)
    blocked[[7, 8]] = True
    for _ in range(100):
        n = int(rng.integers(1, 25))
        tokens = rng.integers(0, 30, size=n)
        parents = np.asarray([-1] + [int(rng.integers(0, i)) for i in range(1, n)])
        before = rng.integers(-1, 30, size=2)
        nodes = np.arange(n)
        keys2, keys3 = tables.node_context_keys(tokens, parents, nodes, before, blocked)
        for i in range(n):
            path = [int(before[0]), int(before[1])]
            node, up = i, []
            while node >= 0:
                up.append(int(tokens[node]))
                node = parents[node]
            path += up[::-1]
            last3 = path[-3:]
            ok2 = last3[1] >= 0 and not blocked[last3[1]] and not blocked[last3[2]]
            ok3 = ok2 and last3[0] >= 0 and not blocked[last3[0]]
            assert keys2[i] == (tables.pack_key(-1, last3[1], last3[2]) if ok2 else tables.EMPTY)
            assert keys3[i] == (tables.pack_key(*last3) if ok3 else tables.EMPTY)


class Memories:
    """The same random memories as dicts (reference) and as compiled tables."""

    def __init__(self, rng: np.random.Generator, vocab: int, fill: float) -> None:
        self.token = TokenMemory(vocab, k=K)
        # rows of this request (stamp 2) and kept from earlier ones (stamp 1): two dicts each for the
        # reference, one stamped table each for the compiled code
        self.dicts = [{2: ContextMemory(2), 3: ContextMemory(3)} for _ in range(2)]
        self.tables = {2: ContextTable(2, K), 3: ContextTable(3, K)}
        known = np.nonzero(rng.random(vocab) < fill)[0]
        self.token.write(known, random_topk(rng, len(known), vocab))
        for kind, stamp in ((1, 1), (0, 2)):  # earlier requests first
            for order in (2, 3):
                m = max(1, int(fill * vocab * 3))
                keys = [tuple(int(t) for t in rng.integers(0, vocab, size=order)) for _ in range(m)]
                rows = rows_of(random_topk(rng, m, vocab))
                self.dicts[kind][order].write_many(keys, rows)
                self.tables[order].write_many(keys, rows, stamp=stamp)

    stamp = 2

    @property
    def compiled_tables(self) -> tuple:
        return self.tables[2].arrays, self.tables[3].arrays

    def reference_candidates(self, orders, persistent, mode, specificity, fallback):
        def candidates(context):
            rows = lookup_rows(context, self.token, self.dicts[0], self.dicts[1] if persistent else None, orders)
            if not rows:
                return [t for t, _ in fallback], [q for _, q in fallback], [7] * len(fallback)
            return fuse_rows(rows, mode, specificity)

        return candidates


def random_setting(rng: np.random.Generator, vocab: int) -> dict:
    orders = [o for o in (1, 2, 3) if rng.random() < 0.8] or [1]
    fallback = [(int(t), float(q)) for t, q in zip(rng.choice(vocab, 3, replace=False), (0.5, 0.3, 0.2))]
    return dict(
        orders=orders,
        persistent=bool(rng.random() < 0.5),
        mode=str(rng.choice(["entropy", "fixed", "strict"])),
        specificity=tuple(float(x) for x in rng.uniform(0.5, 4, 3)),
        fallback=fallback if rng.random() < 0.7 else [],
    )


def compiled_args(setting: dict) -> dict:
    use = np.asarray([setting["persistent"], *(o in setting["orders"] for o in (1, 2, 3))])
    fallback = setting["fallback"]
    return dict(
        use=use,
        stamp=Memories.stamp,
        fusion=setting["mode"],
        specificity=np.asarray(setting["specificity"]),
        fallback_tokens=np.asarray([t for t, _ in fallback], dtype=np.int64),
        fallback_q=np.asarray([q for _, q in fallback], dtype=np.float64),
    )


def test_fusion_equals_the_reference() -> None:
    rng = np.random.default_rng(3)
    size = 3 * K + 1
    out = np.empty(size, np.int64), np.empty(size, np.float64), np.empty(size, np.int64)
    for trial in range(40):
        vocab = int(rng.integers(5, 40))
        memories = Memories(rng, vocab, float(rng.uniform(0.1, 0.9)))
        setting = random_setting(rng, vocab)
        reference = memories.reference_candidates(
            setting["orders"], setting["persistent"], setting["mode"], setting["specificity"], setting["fallback"]
        )
        args = compiled_args(setting)
        for _ in range(30):
            context = tuple(int(t) for t in rng.integers(0, vocab, size=3))
            a, b = (context[0], context[1]) if rng.random() < 0.8 else (-1, context[1] if rng.random() < 0.5 else -1)
            short = context[3 - (1 + (b >= 0) + (a >= 0)) :]
            n = drafting.fuse_context(
                a, b, context[2], memories.token.arrays, memories.compiled_tables, args["use"], args["stamp"], 7,
                drafting.FUSION_CODES[args["fusion"]], args["specificity"], args["fallback_tokens"], args["fallback_q"],
                *out,
            )  # fmt: skip
            tokens, q, sources = reference(short)
            assert out[0][:n].tolist() == tokens, trial
            assert out[1][:n].tolist() == q, trial  # the same float64 arithmetic
            assert out[2][:n].tolist() == sources, trial


@pytest.mark.parametrize("calibrated", [True, False])
def test_best_first_tree_and_layout_equal_the_reference(calibrated: bool) -> None:
    rng = np.random.default_rng(4 + calibrated)
    for trial in range(60):
        vocab = int(rng.integers(6, 40))
        memories = Memories(rng, vocab, float(rng.uniform(0.2, 1.0)))
        setting = random_setting(rng, vocab)
        budget, max_depth, width = int(rng.integers(0, 70)), int(rng.integers(1, 11)), int(rng.integers(1, K + 1))
        masses = np.sort(rng.uniform(0.2, 1.0, max_depth))[::-1].copy()
        cell_probs = rng.uniform(0.01, 0.99, N_CELLS) * (0.02 if rng.random() < 0.3 else 1.0)  # some weak drafters
        blocked = np.zeros(vocab, bool)
        blocked[rng.choice(vocab, size=2, replace=False)] = True
        suffix = rng.integers(0, vocab, size=int(rng.integers(0, 5)))
        suffix_length = int(rng.integers(1, 20))
        root_context = [int(t) for t in rng.integers(0, vocab, size=int(rng.integers(1, 4)))]
        # step costs: none (keep every node), or a rising curve (choose the size, stop early)
        step_costs = None
        if rng.random() < 0.6:
            step_costs = np.concatenate([[0.0], np.cumsum(rng.uniform(0.0, 0.3, budget + 1)) + rng.uniform(0.5, 3)])
        # rows valued per node (the size choice): none, or some value for the first few nodes
        node_value, valued_nodes = (0.0, 0) if rng.random() < 0.3 else (rng.uniform(0, 0.2), int(rng.integers(0, 20)))
        rows_need_drafts = bool(rng.random() < 0.5)  # ... only where some tree pays on its drafts alone
        candidates = memories.reference_candidates(
            setting["orders"], setting["persistent"], setting["mode"], setting["specificity"], setting["fallback"]
        )
        reference = build_tree(
            tuple(root_context),
            candidates,
            budget=budget, max_depth=max_depth, max_width=width, scoring=Scoring(calibrated, masses, cell_probs),
            placeholder_ids=set(np.nonzero(blocked)[0].tolist()), suffix=suffix.tolist(), suffix_length=suffix_length,
            step_costs=step_costs, node_value=node_value, valued_nodes=valued_nodes, rows_need_drafts=rows_need_drafts,
        )  # fmt: skip
        padded = np.asarray([-1] * (3 - len(root_context)) + root_context, dtype=np.int64)
        built = drafting.build_tree(
            root_context=padded, token_memory=memories.token.arrays, tables=memories.compiled_tables,
            **compiled_args(setting), budget=budget, max_depth=max_depth, max_width=width, calibrated=calibrated,
            hit_masses=masses, cell_probs=cell_probs, placeholder_mask=blocked, suffix=suffix.astype(np.int64),
            suffix_length=suffix_length, step_costs=np.zeros(0) if step_costs is None else step_costs,
            node_value=node_value, valued_nodes=valued_nodes, rows_need_drafts=rows_need_drafts,
        )  # fmt: skip
        tokens, parents, depths, sources, scores, probs, cells, keep = built
        assert keep == reference.keep, trial
        assert tokens.tolist() == reference.tokens, trial
        assert parents.tolist() == reference.parents and depths.tolist() == reference.depths
        assert sources.tolist() == reference.sources and cells.tolist() == reference.cells
        assert scores.tolist() == reference.scores and probs.tolist() == reference.probs
        if step_costs is not None and calibrated:  # stopping early never changes the size chosen
            full = build_tree(
                tuple(root_context), candidates, budget=budget, max_depth=max_depth, max_width=width,
                scoring=Scoring(calibrated, masses, cell_probs), placeholder_ids=set(np.nonzero(blocked)[0].tolist()),
                suffix=suffix.tolist(), suffix_length=suffix_length,
            )  # fmt: skip
            assert keep == best_size(np.cumsum(full.probs), step_costs, node_value, valued_nodes, rows_need_drafts), (
                trial
            )
            assert full.tokens[: len(tokens)] == tokens.tolist()
        for keep in {1, min(2, len(tokens)), len(tokens), int(rng.integers(1, len(tokens) + 1))}:
            graft = rng.integers(0, vocab, size=int(rng.integers(0, 4)))
            graft_probs, graft_cells = rng.uniform(0, 1, len(graft)), rng.integers(0, N_CELLS, len(graft))
            want, want_cells = layout(reference, keep, graft.tolist(), graft_probs.tolist(), graft_cells.tolist())
            got = drafting.layout(built._replace(keep=keep), graft, graft_probs, graft_cells)
            assert got.tokens.tolist() == want.tokens.tolist() and got.parents.tolist() == want.parents.tolist(), trial
            assert got.depths.tolist() == want.depths.tolist() and got.sources.tolist() == want.sources.tolist()
            assert got.probs.tolist() == want.probs.tolist() and got.cells.tolist() == want_cells.tolist()
            assert got.sources.dtype == np.int8 and got.tokens.dtype == got.parents.dtype == np.int64


def test_calibration_learns_acceptance_rates_per_cell() -> None:
    calibration = Calibration()
    cell = cell_index(3, 1, 0.97)
    other = cell_index(1, 2, 0.97)
    assert cell != other and 0 <= min(cell, other) and max(cell, other) < N_CELLS
    rng = np.random.default_rng(5)
    for _ in range(50):
        calibration.update(np.asarray([cell] * 20 + [other] * 20 + [-1]), np.asarray(
            (rng.random(20) < 0.9).tolist() + (rng.random(20) < 0.3).tolist() + [True]))  # fmt: skip
    probs = calibration.probabilities()
    assert probs[cell] == pytest.approx(0.9, abs=0.05) and probs[other] == pytest.approx(0.3, abs=0.05)
    assert calibration.observations == 2000
    assert cell_index(5, 1, 0.5) == -1  # the template is not calibrated
    assert cell_index(4, 1, 3) != cell_index(4, 1, 4) and cell_index(4, 9, 40) == cell_index(4, 3, 16)


READY_CHECK = """
import numba, recap
from recap import kernels
from recap.core import calibration, topk
from recap.kernels import drafting, tables, verify
from recap.bench.workloads import suite_requests
from recap.loading import build_inputs

def signatures():
    return {
        f"{module.__name__}.{name}": list(value.signatures)
        for module in (tables, drafting, verify, topk, calibration)
        for name, value in vars(module).items()
        if isinstance(value, numba.core.dispatcher.Dispatcher)
    }

kernels.ensure_ready()
ready = signatures()
model, processor = recap.zoo.load("tiny-qwen2.5-vl")
for request in suite_requests("all", 1, 0):
    inputs = build_inputs(processor, request.prompt, request.image)
    for method in ("recap", "token_recycling", "pld"):
        recap.generate(model, inputs, method, max_new_tokens=64)
new = {name: [s for s in sigs if s not in ready.get(name, [])] for name, sigs in signatures().items()}
print({name: sigs for name, sigs in new.items() if sigs})
"""


def test_top_candidates_equal_torch_argmax_and_topk() -> None:
    """The greedy token is torch.argmax's (the first maximum, the first NaN), also on ties and
    -inf rows; the top-k values are torch.topk's; the probabilities are softmax's, from the
    compiled pass (its vectorized exp), with NaN where softmax gives NaN; on a large vocabulary within
    2e-7 of float64's."""
    import torch

    from recap.backends.hf import _candidates
    from recap.kernels.verify import top_candidates, top_probabilities

    rng = np.random.default_rng(0)
    for case in range(300):
        n, vocab, k = int(rng.integers(1, 20)), int(rng.integers(8, 3000)), int(rng.integers(1, 9))
        logits = rng.standard_normal((n, vocab)).astype(np.float32)
        if case % 3 == 0:
            logits = np.round(logits, 1)  # many ties
        if case % 7 == 0:
            logits[0, rng.integers(0, vocab, 5)] = -np.inf
        if case % 11 == 0:
            logits[-1, :] = -np.inf
        if case % 13 == 0:
            logits[0, rng.integers(0, vocab)] = np.nan
        expected = torch.from_numpy(logits)
        greedy, ids, values = top_candidates(logits, k)
        assert np.array_equal(greedy, expected.argmax(-1).numpy()), case
        clean = ~np.isnan(logits).any(axis=1)
        assert np.array_equal(values[clean], expected.topk(k, -1).values.numpy()[clean]), case
        assert np.array_equal(np.take_along_axis(logits, ids, axis=1)[clean], values[clean]), case
        assert ((0 <= ids) & (ids < vocab)).all(), case
        greedy2, topk = _candidates(expected, k)
        assert np.array_equal(greedy2, greedy), case
        softmax = torch.softmax(expected, -1).topk(k, -1).values.numpy()
        finite = clean & np.isfinite(softmax).all(axis=1)
        compiled = top_probabilities(logits, values)
        for probs in (topk.probs, compiled):
            np.testing.assert_allclose(probs[finite], softmax[finite], rtol=1e-5, atol=1e-7)
            assert np.isnan(probs[~finite]).all(), case  # a NaN or all--inf row: NaN, as softmax gives
    wide = np.random.default_rng(1).standard_normal((3, 151_936)).astype(np.float32) * 4
    wide[1, :5000] = -np.inf  # masked tokens count as nothing
    greedy, ids, values = top_candidates(wide, 8)
    exact = torch.softmax(torch.from_numpy(wide).double(), -1).topk(8, -1).values.numpy()  # float32 is off by 2e-5
    np.testing.assert_allclose(top_probabilities(wide, values), exact, rtol=2e-7)
    np.testing.assert_allclose(_candidates(torch.from_numpy(wide), 8)[1].probs, exact, rtol=2e-7)


@pytest.mark.skipif(not jit.HAVE_NUMBA, reason="numba is not installed")
def test_ensure_ready_compiles_every_signature_the_decode_loop_uses() -> None:
    """A fresh process: after ``ensure_ready`` no kernel compiles (or loads) another signature
    while requests decode, so no request pays a compilation in its middle."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", READY_CHECK], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "{}", done.stdout
