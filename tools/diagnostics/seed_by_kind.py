"""``seed`` accuracy per question kind (colour, shape, count, total; see ``recap.suite.seed``).

    python -m tools.diagnostics.seed_by_kind --model tiny-qwen2.5-vl --model tiny-llava-next --samples 60

Greedy answers to held-out ``seed`` items; each item's kind is read back from its seed, as
``recap.suite.seed.generate`` draws it first. Chance is 25% for every kind. The last row,
"lookup", asks each item's options under a question that names one option's text, drawn apart from the
scene (``recap.suite.seed.lookup_form``, ``tools.zoo_training.train.any_letter``): the step from an option's text
to its letter, without the scene. The ", short" rows ask with the short-answer instruction, as
``tools.zoo_training.train``'s short items do.
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
from tools.zoo_training.evaluate import EVAL_SEED, greedy
from tools.zoo_training.train import SHORT_INSTRUCTION, any_letter

EXTRA_ROWS = ("all, short", "lookup", "lookup, short")
FULL_TOKENS = 96  # an explain-first answer names its letter at the end, after the justification
SHORT_TOKENS = 16


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
            answer = decode(processor, greedy(model, processor, item.prompt, item.image, FULL_TOKENS))
            right[kind] += suite.check_answer(item, answer)
            question, letter = lookup_form(item.prompt, any_letter(item.seed), item.seed)
            named = dataclasses.replace(item, check=letter)
            for row, prompt, tokens in (
                ("lookup", question, FULL_TOKENS),
                ("lookup, short", f"{question}\n{SHORT_INSTRUCTION}", SHORT_TOKENS),
            ):
                answer = decode(processor, greedy(model, processor, prompt, item.image, tokens))
                right[row] += suite.check_answer(named, answer)
            short = decode(
                processor, greedy(model, processor, f"{item.prompt}\n{SHORT_INSTRUCTION}", item.image, SHORT_TOKENS)
            )
            right["all, short"] += suite.check_answer(item, short)
        rows[name] = {kind: f"{right[kind]}/{total[kind]}" for kind in KINDS} | {
            "all": f"{sum(right[kind] for kind in KINDS)}/{len(items)}",
            **{row: f"{right[row]}/{len(items)}" for row in EXTRA_ROWS},
        }
    print("| kind | " + " | ".join(args.model) + " |")
    print("|---|" + "---|" * len(args.model))
    for kind in [*KINDS, "all", *EXTRA_ROWS]:
        print(f"| {kind} | " + " | ".join(rows[name][kind] for name in args.model) + " |")


if __name__ == "__main__":
    main()
