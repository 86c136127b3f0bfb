"""Embed a trained tiny VLM: copy its final folder into the package, evaluate it on held-out
suite samples and write its model card.

    python scripts/embed_model.py --run checkpoints/tiny-qwen2.5-vl --name tiny-qwen2.5-vl \
        --command "python -m recap.zoo.train --arch qwen2.5-vl ..."
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from recap.zoo import ROOT
from recap.zoo.evaluate import evaluate, markdown

CARD = """# {name}

A {params:.1f}M-parameter `{cls}` trained from scratch on recap's offline seven-family suite
(`recap.suite`), shipped inside the package so that recap's main job and tests run offline.
It exercises the real transformers code path of {target}; its answers are learned from a
small procedural world (flat shapes, large glyphs, bar charts), not from real images.

Load it with `recap.zoo.load("{name}")`, or `from_pretrained` on this folder (call
`recap.zoo.processors.register()` first for the Qwen processor, which drops the video
processor so that no torchvision is needed).

## Training
- command: `{command}`
- data: `recap.suite` samples, training seed {train_seed} (round-robin over families, length-bucketed
  batches of {batch_size}), tokenizer (byte-level BPE, {vocab} tokens) trained on seed {tokenizer_seed}
- {steps} steps, AdamW, peak lr {lr}, cosine to 10%, bf16 autocast: {bf16}
- time: {minutes} minutes on {machine} (2-core CPU shared with a second training run)
- loss (answer tokens): {loss_summary}
- weights stored in float16; load in float32 for exact (lossless) comparisons

## Held-out evaluation
{eval_table}

Accuracy is the share of greedy answers whose checkable field (colour, count, text read,
bar value, option letter, final number, ...) is right (`recap.suite.check_answer`).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="training output folder (with final/)")
    parser.add_argument("--name", required=True)
    parser.add_argument("--command", required=True, help="the exact training command, for the card")
    parser.add_argument("--eval-samples", type=int, default=25)
    args = parser.parse_args()

    target = ROOT / args.name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(args.run / "final", target, ignore=shutil.ignore_patterns("training.json"))
    training = json.loads((args.run / "final" / "training.json").read_text())
    (target / "training.json").write_text(json.dumps(training, indent=1))

    from recap import zoo

    zoo.NAMES = tuple(sorted({*zoo.NAMES, args.name}))
    model, processor = zoo.load(args.name)
    torch.set_num_threads(2)
    result = evaluate(model, processor, args.eval_samples)
    (target / "evaluation.json").write_text(json.dumps(result, indent=1))
    history = training["loss_history"]
    marks = [history[0]] + [h for h in history if h["step"] % max(1, training["steps"] // 5) == 0]
    loss_summary = ", ".join(f"{h['loss']:.3f} at step {h['step']}" for h in marks)
    card = CARD.format(
        name=args.name,
        params=training["parameters"] / 1e6,
        cls=type(model).__name__,
        target="Qwen2.5-VL-7B (M-RoPE, windowed vision tower, patch merger)"
        if "qwen" in args.name
        else "LLaVA-1.6 (CLIP tower, anyres tiling with pinpoints)",
        command=args.command,
        train_seed=training["train_seed"],
        batch_size=training["batch_size"],
        vocab=training["vocab_size"],
        tokenizer_seed=training["tokenizer_seed"],
        steps=training["steps"],
        lr=training["lr"],
        bf16=training["bf16_autocast"],
        minutes=training["minutes"],
        machine=training["machine"],
        loss_summary=loss_summary,
        eval_table=markdown(result),
    )
    (target / "README.md").write_text(card)
    print(card)


if __name__ == "__main__":
    main()
