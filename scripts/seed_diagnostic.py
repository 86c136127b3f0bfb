"""Where a model's multiple-choice (``seed``) answers go wrong: seeing, or mapping to the letter?

    python scripts/seed_diagnostic.py --model tiny-qwen2.5-vl [--checkpoint run/checkpoint.pt]

For held-out ``seed`` items it asks the full question and the short-answer form
(``recap.zoo.train.short_answer``) and reports, of the answers: how many give a letter,
how many give the right letter, how many restate the right option's text, and how many
give the letter of the option they restate ("consistent"). Consistent near 25% means the
model has not learned to map an option's text to its letter, whatever it sees.
``--checkpoint`` loads a training checkpoint's weights into ``--model`` (same architecture).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

import torch

from recap import suite
from recap.loading import load_model
from recap.suite.check import extract_letter
from recap.suite.seed import options
from recap.zoo.evaluate import EVAL_SEED, decode, greedy
from recap.zoo.train import short_answer

# the option text a full answer restates before its letter (see recap.suite.seed._answer)
_RESTATED = re.compile(r"(?:answer is|therefore|points to|Hence|This means) (.+?)(?: \(|,| is right|:)")


def tally(answers: list[tuple[suite.Sample, str]], restated: Callable[[str], str | None]) -> dict[str, int]:
    counts = dict(answers=len(answers), letter=0, right_letter=0, restated=0, restated_right=0, consistent=0)
    for sample, text in answers:
        opts, letter = options(sample.prompt), extract_letter(text)
        said = restated(text)
        counts["letter"] += letter is not None
        counts["right_letter"] += letter == sample.check
        counts["restated"] += said is not None
        counts["restated_right"] += said == opts[sample.check]
        counts["consistent"] += said is not None and letter is not None and opts.get(letter) == said
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="embedded model name or folder")
    parser.add_argument("--checkpoint", type=Path, help="a recap.zoo.train checkpoint.pt to load into --model")
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--seed", type=int, default=EVAL_SEED)
    args = parser.parse_args()

    model, processor = load_model(args.model, device="cpu", dtype="float32")
    if args.checkpoint:
        state = torch.load(args.checkpoint, weights_only=False)
        model.load_state_dict({k: v.float() for k, v in state["model"].items()})
        print(f"weights of {args.checkpoint} (step {state['step']})")
    items = suite.load("seed", args.samples, args.seed)
    full = [(s, decode(processor, greedy(model, processor, s.prompt, s.image, 256))) for s in items]
    short = [(s, decode(processor, greedy(model, processor, short_answer(s).prompt, s.image, 24))) for s in items]

    def from_full(text: str) -> str | None:
        m = _RESTATED.search(text)
        return m.group(1).strip() if m else None

    def from_short(text: str) -> str | None:
        return text.strip().rsplit(" (", 1)[0] or None

    print("full answers:", tally(full, from_full))
    print("short answers:", tally(short, from_short))


if __name__ == "__main__":
    main()
