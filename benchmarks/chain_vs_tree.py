"""What verifying one chain (vLLM 0.32) instead of a tree costs RECAP, in recap's own loop.

Runs the embedded model through ``recap.generate`` twice over the same requests with warm
memory: RECAP's best-first tree as usual, then only the tree's best path
(``RecapDrafter.best_chain``, as ``recap.vllm`` proposes it), and prints tokens per forward.
Outputs are checked equal.

    python benchmarks/chain_vs_tree.py [--model tiny-qwen2.5-vl] [--samples 2] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse

import recap
from recap import RecapConfig, TokenMemory, zoo
from recap.backends.hf import output_vocab_size
from recap.bench.workloads import suite_requests
from recap.drafters.recap import RecapDrafter
from recap.loading import build_inputs


def run(model, processor, requests, max_new_tokens: int, chain: int | None, min_prob: float) -> tuple[float, list]:
    """Tokens per forward (the prefill's token included) and the outputs."""
    config = RecapConfig(adaptive_budget=False, node_budget=32, max_depth=chain or 10)
    memory = TokenMemory(output_vocab_size(model), k=config.k)
    propose = RecapDrafter.propose
    if chain:
        RecapDrafter.propose = lambda self, history: self.best_chain(propose(self, history), chain, min_prob)
    try:
        tokens = forwards = 0
        outputs = []
        for request in requests:
            inputs = build_inputs(processor, request.prompt, request.image)
            result = recap.generate(model, inputs, "recap", max_new_tokens, config=config, memory=memory)
            tokens += len(result.token_ids)
            forwards += result.stats.steps + 1
            outputs.append(result.token_ids)
    finally:
        RecapDrafter.propose = propose
    return tokens / forwards, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-qwen2.5-vl")
    parser.add_argument("--samples", type=int, default=2, help="requests per suite family")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--chain", type=int, default=4, help="the chain's most tokens (vLLM's k)")
    parser.add_argument("--min-prob", type=float, default=0.1, help="the chain's cut-off (recap.vllm's default)")
    args = parser.parse_args()
    model, processor = zoo.load(args.model)
    requests = suite_requests("all", args.samples, 0)
    tree, tree_out = run(model, processor, requests, args.max_new_tokens, None, 0.0)
    chain, chain_out = run(model, processor, requests, args.max_new_tokens, args.chain, args.min_prob)
    assert tree_out == chain_out, "outputs differ"
    print(
        f"{args.model}, {len(requests)} requests, warm: tokens per forward {tree:.2f} with a 32-node tree, "
        f"{chain:.2f} with its best chain of at most {args.chain} tokens (min_prob {args.min_prob})"
    )


if __name__ == "__main__":
    main()
