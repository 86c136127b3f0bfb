"""Does a model perceive what a ``seed`` question asks, without the option letters?

    python -m tools.diagnostics.seed_open_questions --model tiny-qwen2.5-vl --samples 40

Asks each held-out ``seed`` question open-ended, as ``tools.zoo_training.train.short_answer(sample,
seed_forms=("open",))`` does (the option list removed, the short-answer instruction appended), and
counts greedy answers equal to the correct option's text (case, a final period and a leading
"the" ignored). It separates "cannot see the attribute" from "cannot map it to a letter".
"""

from __future__ import annotations

import argparse

import torch

from recap import suite
from recap.loading import decode, load_model
from tools.zoo_training.evaluate import EVAL_SEED, greedy
from tools.zoo_training.train import short_answer


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
        item = short_answer(sample, ("open",))  # the question alone; answer: the option's text
        question, truth = item.prompt, item.reference
        answer = decode(processor, greedy(model, processor, question, sample.image, 12)).strip()
        ok = normalized(answer) == normalized(truth)
        right += ok
        print(f"{'right' if ok else 'WRONG'}  {question.splitlines()[0]!r} -> {answer!r} (correct: {truth!r})")
    print(f"{right}/{args.samples} open answers name the correct option")


if __name__ == "__main__":
    main()
