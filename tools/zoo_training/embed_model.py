"""Embed a trained tiny VLM: copy its final folder into the package, evaluate it on held-out
suite samples and write its model card.

    python -m tools.zoo_training.embed_model --run checkpoints/tiny-qwen2.5-vl --name tiny-qwen2.5-vl \
        --command "python -m tools.zoo_training.train --arch qwen2.5-vl ..."   # once per training phase
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from recap.zoo import ROOT
from tools.zoo_training.evaluate import evaluate, markdown

CARD = """# {name}

A {params:.1f}M-parameter `{cls}` trained from scratch on recap's offline seven-family suite
(`recap.suite`), shipped inside the package so that recap's main job and tests run offline.
It exercises the real transformers code path of {target}; its answers are learned from a
small procedural world (flat shapes, large glyphs, bar charts), not from real images.{origin}

Load it with `recap.zoo.load("{name}")`, or `from_pretrained` on this folder (call
`recap.zoo.image_processor.register()` first for the Qwen processor, which drops the video
processor so that no torchvision is needed).

## Training
Tokenizer: byte-level BPE, {vocab} tokens, trained on suite text of seed {tokenizer_seed}.
Loss on answer tokens only; AdamW, cosine learning rate to 10% of the peak; weights stored in
float16 (load in float32 for exact, lossless comparisons). Total training time {minutes:.0f} minutes
on a 2-core x86 CPU{time_note} (phases with one torch thread ran side by side with the other model's).

{phases}

## Held-out evaluation
{eval_table}

Accuracy is the share of greedy answers whose checkable field (colour, count, text read,
bar value, option letter, final number, ...) is right (`recap.suite.check_answer`). The
"with another image" column scores the answers to the same prompts asked with the next
sample's image: what the prompt alone gets right, the model's chance level.
"""

PHASE = """### Phase {number}: {start}{rescale}
- command: `{command}`
- data: {source} of training seed {train_seed}{weights}; per step {batch}
- {steps} steps, peak lr {lr}, bf16 autocast: {bf16}; {minutes} minutes, {threads} torch thread(s)
- {loss_summary}"""


def phases(training: dict) -> list[dict]:
    """The training phases, oldest first (each phase's summary names the one it started from)."""
    chain = []
    while training is not None:
        chain.append(training)
        training = training.get("init_training")
    return chain[::-1]


def loss_marks(phase: dict) -> list[dict]:
    """The first logged entry and every fifth of the run."""
    history = phase["loss_history"]
    return [history[0]] + [h for h in history if h["step"] % max(1, phase["steps"] // 5) == 0]


LOSS_PARTS = {"loss": "full answers", "short_loss": "short answers", "lookup_loss": "text-only lookups"}


def loss_summary(phase: dict) -> str:
    """ "loss (full answers / short answers): 0.512 / 0.701 at step 20, ..." for the parts the phase trained."""
    keys = [k for k in LOSS_PARTS if k in phase["loss_history"][-1]]
    values = ", ".join(" / ".join(f"{h[k]:.3f}" for k in keys) + f" at step {h['step']}" for h in loss_marks(phase))
    return f"loss ({' / '.join(LOSS_PARTS[k] for k in keys)}): {values}"


DISTILL_PHASE = """### Phase {number}: from {teacher} (`tools.zoo_training.distill`)
- command: `{command}`
- the text model and output layer copied from {teacher} (Llama attention with q/k/v biases, token rows matched
  by string); {vision_start} trained to reproduce, for every 28-px patch,
  {teacher}'s image token of the same square (mean squared error relative to the teacher's mean square)
- data: suite images of training seed {train_seed}, {batch} per step; {steps} steps, peak lr {lr}; {minutes} minutes,
  {threads} torch thread(s)
- relative error (training / held-out images): {loss_summary}
- {teacher} itself: {teacher_phases} phases, {teacher_minutes:.0f} minutes (its model card gives them)"""


def render_distill_phase(number: int, phase: dict, command: str) -> str:
    teacher = phase.get("teacher_training") or {}
    return DISTILL_PHASE.format(
        number=number,
        teacher=phase["teacher"],
        command=command,
        vision_start=(
            f"the CLIP tower (width {phase['vision_hidden']}), projector and image newline of phase {number - 1}'s"
            " model (`--init-vision`)"
            if phase.get("init_vision")
            else f"a new CLIP tower (width {phase['vision_hidden']}) and projector"
        ),
        train_seed=phase["train_seed"],
        batch=phase["batch_size"],
        steps=phase["steps"],
        lr=phase["lr"],
        minutes=phase["minutes"],
        threads=phase["threads"],
        loss_summary=", ".join(f"{h['loss']:.3f} / {h['held_out']:.3f} at step {h['step']}" for h in loss_marks(phase)),
        teacher_phases=len(phases(teacher)),
        teacher_minutes=teacher_minutes([phase]),
    )


def render_phase(number: int, phase: dict, command: str) -> str:
    if phase.get("kind") == "distill":
        return render_distill_phase(number, phase, command)
    short, lookups = phase.get("short_batch_size", 0), phase.get("lookup_batch_size", 0)
    parts = [f"{phase['batch_size']} full answers (length-bucketed)"] if phase["batch_size"] else []
    if short:
        forms = phase.get("seed_forms") or (["open"] if phase.get("open_seed_short") else ["letter"])
        named = f", seed's in the forms {', '.join(forms)}: `--seed-forms`" if forms != ["letter"] else ""
        parts.append(f"{short} short-answer items (`tools.zoo_training.train.short_answer`{named})")
    if lookups:
        parts.append(
            f"{lookups} text-only seed option lookups (`tools.zoo_training.train.lookup_batch_stream`: the options"
            " under a question naming one, answered by its letter, no image)"
        )
    batch = " + ".join(parts)
    weighted = [
        f"{part} weighted {', '.join(f'{k}={v}' for k, v in phase[key].items())}"
        for part, key in (("full answers", "full_weights"), ("short items", "short_weights"))
        if phase.get(key)
    ]
    return PHASE.format(
        number=number,
        weights=f" ({'; '.join(weighted)}; other families 1)" if weighted else "",
        start=(
            "from random weights"
            if number == 1
            else f"from phase {number - 1}'s model"
            if (phase.get("init_training") or {}).get("kind") == "distill"
            else f"from phase {number - 1}'s text model, with a new random vision tower"
            f" (width {phase['vision_hidden']}) and projector (`--fresh-vision`)"
            if phase.get("fresh_vision")
            else f"from phase {number - 1}'s weights"
        ),
        rescale=(
            f", image features first scaled to mean norm {phase['image_feature_norm']:g}"
            " (`tools.zoo_training.train.rescale_image_features`)"
            if phase.get("image_feature_norm")
            else ""
        ),
        command=command,
        train_seed=phase["train_seed"],
        source="suite samples, round-robin over families" if phase["batch_size"] or short else "seed items",
        batch=batch,
        steps=phase["steps"],
        lr=phase["lr"],
        bf16=phase["bf16_autocast"],
        minutes=phase["minutes"],
        threads=phase["threads"],
        loss_summary=loss_summary(phase),
    )


def teacher_minutes(chain: list[dict]) -> float:
    """Training time of the models the distilled phases learned from (part of this model's cost); a teacher
    phase shared by two distillations (the same lineage, later) counts once."""
    teacher_phases = {
        (p.get("command"), p.get("train_seed"), p["steps"], p["minutes"]): p
        for phase in chain
        for p in phases(phase.get("teacher_training"))
    }
    return sum(p["minutes"] for p in teacher_phases.values())


def origin(chain: list[dict]) -> str:
    """The card's sentence on where a distilled model's text model and vision path came from."""
    copies = [(i + 1, p) for i, p in enumerate(chain) if p.get("kind") == "distill"]
    if not copies:
        return ""
    teacher = copies[0][1]["teacher"]
    when = " and ".join(
        f"at phase {number} (after that model's {len(phases(p.get('teacher_training')))} phases)"
        for number, p in copies
    )
    return (
        f"\nIts text model was copied from {teacher} {when}; {'each time ' if len(copies) > 1 else ''}its vision"
        " path was then distilled from that model's (`tools.zoo_training.distill`). No weights come from outside"
        " this project."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="training output folder (with final/)")
    parser.add_argument("--name", required=True)
    parser.add_argument(
        "--command", action="append", required=True, help="the exact training command of each phase, oldest first"
    )
    parser.add_argument("--eval-samples", type=int, default=25)
    args = parser.parse_args()

    training = json.loads((args.run / "final" / "training.json").read_text())
    chain = phases(training)
    if len(args.command) != len(chain):
        parser.error(f"{len(chain)} training phases found; give one --command per phase")
    target = ROOT / args.name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(args.run / "final", target, ignore=shutil.ignore_patterns("training.json"))
    (target / "training.json").write_text(json.dumps(training, indent=1))

    from recap import zoo

    zoo.NAMES = tuple(sorted({*zoo.NAMES, args.name}))
    model, processor = zoo.load(args.name)
    torch.set_num_threads(2)
    result = evaluate(model, processor, args.eval_samples)
    (target / "evaluation.json").write_text(json.dumps(result, indent=1))
    teacher = teacher_minutes(chain)
    card = CARD.format(
        name=args.name,
        params=training["parameters"] / 1e6,
        cls=type(model).__name__,
        target="Qwen2.5-VL-7B (M-RoPE, windowed vision tower, patch merger)"
        if "qwen" in args.name
        else "LLaVA-1.6 (CLIP tower, anyres tiling with pinpoints)",
        vocab=training["vocab_size"],
        tokenizer_seed=training["tokenizer_seed"],
        minutes=sum(p["minutes"] for p in chain) + teacher,
        origin=origin(chain),
        time_note=f", including {teacher:.0f} minutes of the teacher's phases" if teacher else "",
        phases="\n\n".join(render_phase(i + 1, p, c) for i, (p, c) in enumerate(zip(chain, args.command))),
        eval_table=markdown(result),
    )
    (target / "README.md").write_text(card)
    print(card)


if __name__ == "__main__":
    main()
