"""How often recap's tokens equal generate's on the embedded models in low precision, and
whether every divergence starts at a near-tie of generate's own logits (tests/near_ties.py).

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python tools/precision_agreement.py [--samples 4] [--dtype bfloat16]

``--samples`` requests per suite family (8 families), 200 new tokens, warm memory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from near_ties import first_divergence, generate_with_logits  # noqa: E402

import recap  # noqa: E402
import recap.zoo  # noqa: E402
from recap.bench.workloads import suite_requests  # noqa: E402
from recap.loading import DTYPES, build_inputs  # noqa: E402

METHODS = ("ar", "pld", "token_recycling", "recap")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--max-new-tokens", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dtype = DTYPES[args.dtype]
    not_ties = 0
    for name in recap.zoo.NAMES:
        model, processor = recap.zoo.load(name)
        model = model.to(dtype)
        requests = suite_requests("all", args.samples, seed=0)
        same = dict.fromkeys(METHODS, 0)
        worst = 0.0  # largest margin / tolerance at a divergence
        for request in requests:
            inputs = build_inputs(processor, request.prompt, request.image)
            expected, logits = generate_with_logits(model, inputs, args.max_new_tokens)
            for method in METHODS:
                got = recap.generate(model, inputs, method, args.max_new_tokens).token_ids
                divergence = first_divergence(expected, logits, got, dtype)
                if divergence is None:
                    same[method] += 1
                    continue
                worst = max(worst, divergence.margin / divergence.tolerance)
                not_ties += not divergence.near_tie
                print(
                    f"  {name} {request.id} {method}: diverges at token {divergence.step}, generate's margin "
                    f"{divergence.margin:.4f} (tolerance {divergence.tolerance:.4f})"
                )
        rates = ", ".join(f"{m} {same[m]}/{len(requests)}" for m in METHODS)
        print(
            f"{name} {args.dtype}: identical to generate: {rates}; largest margin/tolerance at a divergence {worst:.2f}"
        )
    print(f"divergences that are not near-ties: {not_ties}")
    return 1 if not_ties else 0


if __name__ == "__main__":
    sys.exit(main())
