"""Host-side overhead of one RECAP step, without a model.

Times what the decode loop does on the host around the target forward for a 63-node tree
at k = 8: propose (fusion + best-first tree + suffix graft), the tree mask and positions,
greedy acceptance, and observe (memory writes). The verified top-k are synthetic but
realistic (Zipf-like tokens, peaked probabilities), and the memories are warmed first.

    python benchmarks/host_overhead.py [--vocab 32000] [--steps 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from recap import RecapConfig, TokenMemory, TopK
from recap.core.accept import accept_greedy
from recap.drafters import RecapDrafter


def synthetic_topk(rng: np.random.Generator, n: int, k: int, vocab: int, hot: int) -> TopK:
    """[n, k] candidates drawn from a small 'hot' vocabulary, with peaked probabilities."""
    ids = np.stack([rng.choice(hot, size=k, replace=False) for _ in range(n)]).astype(np.int64)
    raw = np.sort(rng.dirichlet(np.full(k, 0.3), size=n), axis=1)[:, ::-1] * rng.uniform(0.6, 1.0, (n, 1))
    return TopK(ids % vocab, raw.astype(np.float32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hot", type=int, default=400, help="distinct tokens the synthetic text uses")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--budget", type=int, default=63)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    config = RecapConfig(node_budget=args.budget)
    memory = TokenMemory(args.vocab, k=config.k)
    drafter = RecapDrafter(config, memory)
    prompt = rng.integers(0, args.hot, size=300).tolist()
    warm = synthetic_topk(rng, args.hot, config.k, args.vocab, args.hot)
    memory.write(np.arange(args.hot), warm)
    drafter.begin(prompt, [], None)
    history = list(prompt)
    times = {"propose": [], "mask": [], "accept": [], "observe": [], "total": []}
    nodes = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        tree = drafter.propose(history)
        t1 = time.perf_counter()
        mask = ~tree.ancestor_mask()
        positions = tree.depths + len(history)
        t2 = time.perf_counter()
        topk = synthetic_topk(rng, len(tree), config.k, args.vocab, args.hot)
        # the target agrees with the best chain for a few tokens, as in real decoding
        greedy = topk.ids[:, 0].copy()
        chain = [0] + [i for i in range(1, min(len(tree), 4)) if tree.parents[i] == i - 1]
        for a, b in zip(chain, chain[1:]):
            greedy[a] = tree.tokens[b]
        t3 = time.perf_counter()
        acceptance = accept_greedy(tree, greedy)
        committed = [*tree.tokens[acceptance.path[1:]].tolist(), acceptance.bonus]
        t4 = time.perf_counter()
        drafter.observe(tree, topk, acceptance, committed)
        history.extend(committed)
        t5 = time.perf_counter()
        del mask, positions
        if step >= 100:  # warm-up
            times["propose"].append(t1 - t0)
            times["mask"].append(t2 - t1)
            times["accept"].append(t4 - t3)
            times["observe"].append(t5 - t4)
            times["total"].append((t2 - t0) + (t5 - t3))
            nodes.append(len(tree))
    print(
        f"RECAP host overhead per step: vocab {args.vocab}, k {config.k}, budget {args.budget}, "
        f"mean tree size {statistics.mean(nodes):.1f} nodes, {len(nodes)} steps"
    )
    for name, values in times.items():
        ms = np.asarray(values) * 1000
        print(f"  {name:8s} median {np.median(ms):.3f} ms   p90 {np.percentile(ms, 90):.3f} ms")


if __name__ == "__main__":
    main()
