"""``seed`` accuracy per question kind (count, colour, shape, background, largest, position).

    python scripts/seed_by_kind.py --model tiny-qwen2.5-vl --model tiny-llava-next --samples 60

Greedy answers to held-out ``seed`` items; each item's kind is read back from its seed, as
``recap.suite.seed.generate`` draws it first. Chance is 25% for every kind. The last row,
"lookup", asks each item's options under a question that names one option's text, drawn apart from the
scene (``recap.suite.seed.lookup_form``, ``recap.zoo.train.any_letter``): the step from an option's text
to its letter, without the scene.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import random

import torch

from recap import suite
from recap.loading import decode, load_model
from recap.suite.seed import KINDS, lookup_form
from recap.zoo.evaluate import EVAL_SEED, greedy
from recap.zoo.train import any_letter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="embedded model name or folder (repeatable)")
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--seed", type=int, default=EVAL_SEED)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    items = suite.load("seed", args.samples, args.seed)
    kinds = [random.Random(item.seed).choice(KINDS) for item in items]
    rows = {}
    for name in args.model:
        model, processor = load_model(name, device="cpu", dtype="float32")
        right, total = collections.Counter(), collections.Counter(kinds)
        for item, kind in zip(items, kinds):
            answer = decode(processor, greedy(model, processor, item.prompt, item.image, 16))
            right[kind] += suite.check_answer(item, answer)
            question, letter = lookup_form(item.prompt, any_letter(item.seed), item.seed)
            named = dataclasses.replace(item, check=letter)
            right["lookup"] += suite.check_answer(
                named, decode(processor, greedy(model, processor, question, item.image, 16))
            )
        rows[name] = {kind: f"{right[kind]}/{total[kind]}" for kind in KINDS} | {
            "all": f"{sum(right[kind] for kind in KINDS)}/{len(items)}",
            "lookup": f"{right['lookup']}/{len(items)}",
        }
    print("| kind | " + " | ".join(args.model) + " |")
    print("|---|" + "---|" * len(args.model))
    for kind in [*KINDS, "all", "lookup"]:
        print(f"| {kind} | " + " | ".join(rows[name][kind] for name in args.model) + " |")


if __name__ == "__main__":
    main()
