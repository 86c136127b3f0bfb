"""Held-out evaluation of an embedded model: accuracy per family, image dependence, length.

    python -m tools.zoo_training.evaluate --model tiny-qwen2.5-vl --samples 25 --out eval.json

Greedy decoding with the model's own ``generate``. Accuracy is the share of answers whose
checkable field (colour, count, text read, bar value, letter, final number) is right.
Image dependence: each prompt is asked again with the image of the next sample of the same
family; the share of pairs whose greedy answers differ is reported, and so is the accuracy of
those wrong-image answers against the original sample: the model's own chance level, what
the prompt alone gets right (e.g. half of the two-way questions).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from recap import suite
from recap.loading import build_inputs, decode, load_model

EVAL_SEED = 424242  # held out: training used tools.zoo_training.train.TRAIN_SEED


def greedy(model: torch.nn.Module, processor: Any, prompt: str, image: Any, max_new_tokens: int) -> list[int]:
    inputs = build_inputs(processor, prompt, image)
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def check_families(families: Sequence[str]) -> None:
    if not families or not set(families) <= set(suite.FAMILIES):
        raise ValueError(f"families must be a non-empty subset of {', '.join(suite.FAMILIES)}; got {list(families)}")


def evaluate(
    model: torch.nn.Module,
    processor: Any,
    samples: int,
    seed: int = EVAL_SEED,
    max_new_tokens: int = 256,
    families: Sequence[str] = suite.FAMILIES,
    show: Callable[[suite.Sample, str, bool], None] | None = None,
) -> dict[str, Any]:
    """Evaluate on ``samples`` held-out items of each of ``families``; ``show(sample, answer,
    correct)`` is called once per greedy answer with the right image."""
    check_families(families)
    results: dict[str, Any] = {}
    lengths: list[int] = []
    pairs = differ = 0
    for family in families:
        items = suite.load(family, samples + 1, seed)
        correct = blind = 0
        examples = []
        for i in range(samples):
            sample, other = items[i], items[i + 1]
            tokens = greedy(model, processor, sample.prompt, sample.image, max_new_tokens)
            text = decode(processor, tokens)
            lengths.append(len(tokens))
            right = suite.check_answer(sample, text)
            correct += right
            if show is not None:
                show(sample, text, right)
            swapped = greedy(model, processor, sample.prompt, other.image, max_new_tokens)
            pairs += 1
            differ += swapped != tokens
            blind += suite.check_answer(sample, decode(processor, swapped))
            if i < 2:
                examples.append({"prompt": sample.prompt, "answer": text, "expected": sample.check})
        results[family] = {
            "accuracy": correct / samples,
            "wrong_image_accuracy": blind / samples,
            "samples": samples,
            "examples": examples,
        }
    accuracies = [f["accuracy"] for f in results.values()]
    return {
        "seed": seed,
        "samples_per_family": samples,
        "families": results,
        "mean_accuracy": statistics.fmean(accuracies),
        "image_dependence": differ / pairs,
        "mean_answer_tokens": statistics.fmean(lengths),
    }


def markdown(result: dict[str, Any]) -> str:
    lines = ["| family | accuracy | with another image (chance) |", "|---|---|---|"]
    lines += [
        f"| {name} | {f['accuracy']:.0%} | {f['wrong_image_accuracy']:.0%} |" for name, f in result["families"].items()
    ]
    chance = statistics.fmean(f["wrong_image_accuracy"] for f in result["families"].values())
    lines += [
        f"| **mean** | **{result['mean_accuracy']:.0%}** | {chance:.0%} |",
        "",
        f"- held-out seed {result['seed']}, {result['samples_per_family']} samples per family, greedy decoding",
        f"- image dependence: changing only the image changed the greedy answer in "
        f"{result['image_dependence']:.0%} of pairs",
        f"- mean greedy answer length: {result['mean_answer_tokens']:.1f} tokens",
    ]
    return "\n".join(lines)


def print_answer(sample: suite.Sample, answer: str, right: bool) -> None:
    """``--show``: one held-out item, its greedy answer and whether its checkable field is right."""
    prompt = sample.prompt.replace("\n", " | ")
    verdict = "right" if right else "WRONG"
    print(f"[{sample.family}] {prompt}\n  answer: {answer}\n  expected {sample.check!r}: {verdict}\n", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Held-out evaluation of an embedded (or any suite-trained) VLM.")
    parser.add_argument("--model", required=True, help="embedded model name or folder")
    parser.add_argument("--samples", type=int, default=25, help="per family")
    parser.add_argument("--seed", type=int, default=EVAL_SEED)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument(
        "--families", default=",".join(suite.FAMILIES), help="comma-separated subset, e.g. 'seed,mmt' (default: all)"
    )
    parser.add_argument("--show", action="store_true", help="print each prompt, answer and expected field")
    args = parser.parse_args(argv)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    try:
        check_families(families)
    except ValueError as error:
        parser.error(f"--families: {error}")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, processor = load_model(args.model, device="cpu", dtype="float32")
    result = evaluate(
        model, processor, args.samples, args.seed, families=families, show=print_answer if args.show else None
    )
    text = markdown(result)
    print(text)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
