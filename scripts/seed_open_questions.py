"""Does a model perceive what a ``seed`` question asks, without the option letters?

    python scripts/seed_open_questions.py --model tiny-qwen2.5-vl --samples 40

Asks each held-out ``seed`` question open-ended (the option list removed, the short-answer
instruction of ``recap.zoo.train`` appended) and counts greedy answers equal to the correct
option's text (case, a final period and a leading "the" ignored). It separates "cannot see
the attribute" from "cannot map it to a letter".
"""

from __future__ import annotations

import argparse
import re

import torch

from recap import suite
from recap.loading import decode, load_model
from recap.zoo.evaluate import EVAL_SEED, greedy
from recap.zoo.train import SHORT_INSTRUCTION

OPTION = re.compile(r"^\(?([A-D])[.)]\)?\s+(.*)$")  # "A. red", "(A) red", "A) red"


def open_question(sample: suite.Sample) -> tuple[str, str]:
    """(the question without its options plus the short-answer instruction, the correct option's text)."""
    lines = sample.prompt.split("\n")
    options = dict(m.groups() for m in map(OPTION.match, lines[1:]) if m)
    if set(options) != {"A", "B", "C", "D"}:
        raise ValueError(f"not a four-option seed prompt: {sample.prompt!r}")
    return f"{lines[0]}\n{SHORT_INSTRUCTION}", options[sample.check]


def normalized(text: str) -> str:
    text = text.strip().rstrip(".").lower()
    return text[4:] if text.startswith("the ") else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="embedded model name or folder")
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--seed", type=int, default=EVAL_SEED)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, processor = load_model(args.model, device="cpu", dtype="float32")
    right = 0
    for sample in suite.load("seed", args.samples, args.seed):
        question, truth = open_question(sample)
        answer = decode(processor, greedy(model, processor, question, sample.image, 12)).strip()
        ok = normalized(answer) == normalized(truth)
        right += ok
        print(f"{'right' if ok else 'WRONG'}  {question.splitlines()[0]!r} -> {answer!r} (correct: {truth!r})")
    print(f"{right}/{args.samples} open answers name the correct option")


if __name__ == "__main__":
    main()
