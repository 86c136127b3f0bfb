"""Train an embedded tiny VLM from scratch on the offline suite.

    python -m tools.zoo_training.train --arch qwen2.5-vl --steps 3000 --out checkpoints/tiny-qwen2.5-vl

Each step sees a batch of full suite answers and, unless ``--short-batch-size 0``, a batch of
short-answer items on other scenes: the same kinds of prompt with LLaVA-1.5's instruction
"Answer the question using a single word or phrase." and the checkable field as the whole
answer. Their loss (mean over their own tokens) is added to the long one, so the vision path
gets a direct signal that the long answers dilute in tens of template words.

Seeded and resumable: a checkpoint is written every ``--checkpoint-every`` steps and picked
up again by the same command. ``--init-from`` starts from a saved model (a second training
phase) instead of random weights. The finished model (fp16 weights), its processor and a
``training.json`` summary land in ``--out/final``; copy that folder into
``src/recap/zoo/models/<name>`` to embed it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recap import suite
from recap.suite import seed as seed_suite
from recap.suite.text import join_and
from tools.zoo_training.build import ARCHS, make_model, make_processor, train_tokenizer

TOKENIZER_SEED = 7001  # corpus the tokenizer is trained on
TRAIN_SEED = 1001  # training samples; evaluation uses other seeds
SHORT_INSTRUCTION = "Answer the question using a single word or phrase."
SHORT_SEED_OFFSET = 500_000  # short-answer items come from data seed + this offset
LOOKUP_SEED_OFFSET = 700_000  # text-only lookups come from data seed + this offset


SEED_FORMS = ("letter", "open", "lookup", "lookup-any", "sentence")


def seed_form(sample: suite.Sample, forms: Sequence[str]) -> str:
    """Which of ``forms`` (see ``short_answer``) the ``seed`` item ``sample`` takes: by its seed,
    so the forms are mixed evenly and reproducibly."""
    return forms[sample.seed % len(forms)]


def any_letter(seed: int) -> str:
    """An option letter drawn from ``seed`` independently of the scene (``random.Random(seed)``'s
    first draw is the seed question's kind, so its first letter would reveal the kind)."""
    return random.Random(f"lookup-any/{seed}").choice(seed_suite.LETTERS)


def sentence_lead(prompt: str, named: str, seed: int) -> str:
    """Zero to two sentences before a "sentence" lookup's closing sentence, drawn from ``seed``,
    that name the options (the others last in some): the named option then sits at varying
    distances from the answer's start and after other options, as in a real ``seed`` answer, so the
    letter cannot be found by position."""
    rng = random.Random(f"sentence-lead/{seed}")
    options = {letter: seed_suite.open_form(prompt, letter)[1] for letter in seed_suite.LETTERS}
    listed = rng.sample(list(options.values()), 4)
    others = rng.sample([text for letter, text in options.items() if letter != named], 2)
    sentences = (
        f"The options are {join_and(listed)}.",
        f"Of {join_and(listed, 'or')}, only one fits.",
        f"The question lists {join_and(listed)}, and I compare them with the picture.",
        f"It is not {others[0]}, and it is not {others[1]}.",
        f"Neither {others[0]} nor {others[1]} is right here.",
    )
    return "".join(f"{text} " for text in rng.sample(sentences, rng.randint(0, 2)))


def short_answer(sample: suite.Sample, seed_forms: Sequence[str] = ("letter",)) -> suite.Sample:
    """The sample as a short-answer item: the instruction appended, the checkable field as answer.
    ``describe`` asks for its checkable field (the number of objects) directly. A ``seed`` item
    takes one of ``seed_forms``: "letter" (as asked, answered by the letter), "open" (the question
    without the options, answered by the option's text: the scene attribute), "lookup" (the options
    under a question naming the right option's text, answered by its letter: the text-to-letter step),
    "lookup-any" (as "lookup", naming an option drawn from the item's seed: the right one in a quarter
    of the items; "lookup" alone did not teach the lookup, see docs/experiments/2026-11-30/README.md),
    "sentence" (as asked, without the instruction, answered by ``seed.answer_sentence`` naming an option
    drawn from the item's seed: the lookup where a long answer needs it, after the answer names an
    option; meant for text-only items, ``lookup_batch_stream``, since the named option ignores the image)."""
    prompt, answer = sample.prompt, sample.check
    if sample.family == "seed" and seed_form(sample, seed_forms) == "sentence":
        named = any_letter(sample.seed)
        closing = seed_suite.answer_sentence(seed_suite.open_form(sample.prompt, named)[1], named, sample.seed)
        reference = sentence_lead(sample.prompt, named, sample.seed) + closing
        return dataclasses.replace(sample, reference=reference, check=named)
    if sample.family == "describe":
        prompt = "How many objects are in the picture?"
    elif sample.family == "seed":
        form = seed_form(sample, seed_forms)
        if form == "open":
            prompt, answer = seed_suite.open_form(sample.prompt, sample.check)
        elif form in ("lookup", "lookup-any"):
            named = sample.check if form == "lookup" else any_letter(sample.seed)
            prompt, answer = seed_suite.lookup_form(sample.prompt, named, sample.seed // len(seed_forms))
    return dataclasses.replace(sample, prompt=f"{prompt}\n{SHORT_INSTRUCTION}", reference=answer)


def family_cycle(weights: dict[str, int] | None = None) -> list[str]:
    """One round of the family round-robin: each family ``weights.get(family, 1)`` times,
    spread out (round r holds the families whose weight exceeds r)."""
    weights = weights or {}
    unknown = sorted(set(weights) - set(suite.FAMILIES))
    if unknown:
        raise ValueError(f"unknown families {unknown}: choose from {', '.join(suite.FAMILIES)}")
    if any(w < 0 for w in weights.values()):
        raise ValueError(f"family weights must be >= 0, got {weights}")
    rounds = max([1, *weights.values()])
    cycle = [f for r in range(rounds) for f in suite.FAMILIES if weights.get(f, 1) > r]
    if not cycle:
        raise ValueError("family weights leave no family to sample")
    return cycle


def sample_stream(seed: int, start: int, weights: dict[str, int] | None = None):
    """Training samples, round-robin over ``family_cycle(weights)``, from sample number
    ``start`` on; a family's n-th occurrence gets its n-th sample, so no scene repeats."""
    cycle = family_cycle(weights)
    per_cycle = {f: cycle.count(f) for f in cycle}
    rank = [cycle[:i].count(f) for i, f in enumerate(cycle)]  # occurrence of cycle[i] within a round
    index = start
    while True:
        position = index % len(cycle)
        family = cycle[position]
        number = (index // len(cycle)) * per_cycle[family] + rank[position]
        yield suite.generate(family, suite.sample_seed(family, seed, number))
        index += 1


def short_batch_stream(
    seed: int,
    start_batch: int,
    batch_size: int,
    weights: dict[str, int] | None = None,
    seed_forms: Sequence[str] = ("letter",),
):
    """Batches of short-answer items (scenes of their own, ``seed + SHORT_SEED_OFFSET``),
    families drawn in proportion to ``weights`` (default: 1 each); ``seed_forms``: see ``short_answer``."""
    stream = sample_stream(seed + SHORT_SEED_OFFSET, start_batch * batch_size, weights)
    while True:
        yield [short_answer(next(stream), seed_forms) for _ in range(batch_size)]


def lookup_batch_stream(seed: int, start_batch: int, batch_size: int, forms: Sequence[str] = ("lookup-any",)):
    """Batches of text-only ``seed`` lookups (``seed + LOOKUP_SEED_OFFSET``) in ``forms`` (see
    ``short_answer``; default: each item's options under a question naming one of them, drawn apart
    from the scene, answered by its letter); ``collate(..., with_images=False)`` drops the image. A
    model learns the lookup from thousands of these in a row, not from a few mixed into image batches
    (docs/experiments/2026-11-30)."""
    others = {family: 0 for family in suite.FAMILIES if family != "seed"}
    stream = sample_stream(seed + LOOKUP_SEED_OFFSET, start_batch * batch_size, others)
    while True:
        yield [short_answer(next(stream), forms) for _ in range(batch_size)]


def parse_seed_forms(text: str) -> tuple[str, ...]:
    """``"letter,open,lookup"`` -> ("letter", "open", "lookup"), validated."""
    forms = tuple(filter(None, (p.strip() for p in text.split(","))))
    if not forms or not set(forms) <= set(SEED_FORMS):
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {', '.join(SEED_FORMS)}, got {text!r}")
    return forms


def parse_weights(text: str) -> dict[str, int]:
    """``"seed=3,chart=2"`` -> {"seed": 3, "chart": 2}; families not named keep weight 1."""
    weights: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        family, sep, value = part.partition("=")
        if not sep or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected family=integer pairs like 'seed=3,chart=2', got {part!r}")
        weights[family.strip()] = int(value)
    try:
        family_cycle(weights)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return weights


def batch_stream(seed: int, start_batch: int, batch_size: int, pool: int = 4, weights: dict[str, int] | None = None):
    """Batches of samples, families in proportion to ``weights`` (default: 1 each); each run
    of ``pool`` batches is drawn together and grouped by answer length, so little compute
    is spent on padding. Deterministic and resumable."""
    first = (start_batch // pool) * pool
    stream = sample_stream(seed, first * batch_size, weights)
    number = first
    while True:
        samples = sorted((next(stream) for _ in range(pool * batch_size)), key=lambda s: len(s.reference))
        batches = [samples[i * batch_size : (i + 1) * batch_size] for i in range(pool)]
        random.Random(seed * 7919 + number).shuffle(batches)
        for batch in batches:
            if number >= start_batch:
                yield batch
            number += 1


def collate(
    samples: list[suite.Sample], processor: Any, arch: str, with_images: bool = True
) -> dict[str, torch.Tensor]:
    """One padded batch: chat-templated prompt with the image (none if not ``with_images``), then
    the answer and EOS; the loss sees only answer tokens. Prompt and answer are tokenized apart,
    so the boundary is exactly the one generation starts from."""
    tokenizer = processor.tokenizer
    image_part = [{"type": "image"}] if with_images else []
    texts = [
        processor.apply_chat_template(
            [{"role": "user", "content": [*image_part, {"type": "text", "text": s.prompt}]}],
            add_generation_prompt=True,
        )
        for s in samples
    ]
    images = {"images": [s.image for s in samples]} if with_images else {}
    prompts = processor(text=texts, **images)
    eos = tokenizer.eos_token_id
    answers = [tokenizer(s.reference, add_special_tokens=False)["input_ids"] + [eos] for s in samples]
    rows = [list(p) + a for p, a in zip(prompts["input_ids"], answers)]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (prompt, answer) in enumerate(zip(prompts["input_ids"], answers)):
        n, m = len(prompt), len(answer)
        input_ids[i, : n + m] = torch.tensor(list(prompt) + answer)
        labels[i, n : n + m] = torch.tensor(answer)
        attention[i, : n + m] = 1
    batch = {"input_ids": input_ids, "attention_mask": attention, "labels": labels}
    if not with_images:
        return batch
    if arch == "qwen2.5-vl":
        types = torch.zeros((len(rows), width), dtype=torch.long)
        for i, t in enumerate(prompts["mm_token_type_ids"]):
            types[i, : len(t)] = torch.tensor(t)
        batch["mm_token_type_ids"] = types
        batch["pixel_values"] = torch.as_tensor(np.asarray(prompts["pixel_values"]), dtype=torch.float32)
        batch["image_grid_thw"] = torch.as_tensor(np.asarray(prompts["image_grid_thw"]))
    else:
        batch["pixel_values"] = torch.as_tensor(np.asarray(prompts["pixel_values"]), dtype=torch.float32)
        batch["image_sizes"] = torch.as_tensor(np.asarray(prompts["image_sizes"]))
    return batch


def fast_patch_embedding(model: torch.nn.Module) -> None:
    """Qwen2.5-VL's patch embedding is a Conv3d whose stride equals its kernel, i.e. one matrix
    product per patch; compute it as one (its backward as a conv is ~40% of a CPU step).
    Same weights, same result; only this training process's module is changed."""
    embed = getattr(getattr(model, "model", model), "visual", None)
    embed = getattr(embed, "patch_embed", None)
    if embed is None or not isinstance(getattr(embed, "proj", None), torch.nn.Conv3d):
        return
    proj = embed.proj
    if tuple(proj.kernel_size) != tuple(proj.stride) or proj.bias is not None:
        return

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        flat = hidden_states.reshape(-1, proj.weight[0].numel()).to(proj.weight.dtype)  # [patches, C*T*P*P]
        return flat @ proj.weight.reshape(proj.out_channels, -1).T  # [patches, embed_dim]

    embed.forward = forward


def projector_output(model: torch.nn.Module) -> torch.nn.Linear:
    """The last linear layer of the module that maps vision features into the text model."""
    inner = getattr(model, "model", model)
    projector = getattr(inner, "multi_modal_projector", None)
    if projector is None:
        projector = inner.visual.merger
    return [m for m in projector.modules() if isinstance(m, torch.nn.Linear)][-1]


@torch.no_grad()
def image_features(model: torch.nn.Module, processor: Any, images: list) -> list[torch.Tensor]:
    """Per image, its image tokens' input embeddings (the projector's output), [tokens, hidden]."""
    inputs = processor.image_processor(images=images, return_tensors="pt")
    extra = {k: inputs[k] for k in ("image_grid_thw", "image_sizes") if k in inputs}
    features = getattr(model, "model", model).get_image_features(pixel_values=inputs["pixel_values"], **extra)
    features = getattr(features, "pooler_output", features)
    return [f.reshape(-1, f.shape[-1]) for f in features]


def image_feature_norm(model: torch.nn.Module, processor: Any, images: list) -> float:
    """Mean L2 norm of the image tokens' input embeddings (the projector's output) on ``images``."""
    return float(torch.cat(image_features(model, processor, images)).norm(dim=-1).mean())


def rescale_image_features(model: torch.nn.Module, processor: Any, target: float, seed: int) -> tuple[float, float]:
    """Scale the projector's output layer so image tokens enter the text model with mean norm
    ``target``. Image embeddings far larger than the text residual stream (LLaVA's grew to
    ~4000 vs ~100) pass through every decoder layer almost unchanged, so the text model cannot
    process them, and the gradient into the vision path shrinks by the same factor. LLaVA-NeXT's
    row-end newline embeddings (norm ~1) are left as they are. Returns the norm before and after."""
    images = [suite.generate(f, suite.sample_seed(f, seed, i)).image for i in range(2) for f in suite.FAMILIES]
    before = image_feature_norm(model, processor, images)
    layer = projector_output(model)
    with torch.no_grad():
        layer.weight.mul_(target / before)
        if layer.bias is not None:
            layer.bias.mul_(target / before)
    return before, image_feature_norm(model, processor, images)


VISION_PREFIXES = ("model.vision_tower.", "model.multi_modal_projector.", "model.visual.")


def transplant_text_model(source: torch.nn.Module, target: torch.nn.Module) -> int:
    """Copy every weight of ``source`` outside the vision path (vision tower and projector) into
    ``target``, which keeps its own fresh vision path. Returns the number of tensors copied."""
    source_state = source.state_dict()
    target_state = target.state_dict()
    text_keys = [k for k in target_state if not k.startswith(VISION_PREFIXES)]
    mismatched = [k for k in text_keys if k not in source_state or source_state[k].shape != target_state[k].shape]
    if mismatched:
        raise ValueError(f"the text models differ ({len(mismatched)} tensors, e.g. {mismatched[0]}): same arch needed")
    with torch.no_grad():
        for key in text_keys:
            target_state[key].copy_(source_state[key])
    return len(text_keys)


def save_checkpoint(checkpoint: Path, state: dict[str, Any]) -> None:
    """Write a resumable training state atomically (a session may end mid-write)."""
    torch.save(state, checkpoint.with_suffix(".tmp"))
    checkpoint.with_suffix(".tmp").replace(checkpoint)


def write_summary(final: Path, summary: dict[str, Any], history: list[dict], seconds: float) -> None:
    """``final/training.json``: the run's ``summary`` plus what every run records (threads,
    minutes, machine, loss history)."""
    summary = summary | {
        "threads": torch.get_num_threads(),
        "minutes": round(seconds / 60, 1),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
        "loss_history": history,
    }
    (final / "training.json").write_text(json.dumps(summary, indent=1))
    print(f"saved {final}", flush=True)


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def training_record(init_from: Path | None) -> dict[str, Any] | None:
    """The ``training.json`` of the model a phase started from (so a card can sum the phases)."""
    if init_from is None or not (init_from / "training.json").is_file():
        return None
    return json.loads((init_from / "training.json").read_text())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked (one of the three batch sizes > 0; the vision flags need their partners)."""
    parser = argparse.ArgumentParser(description="Train an embedded tiny VLM from scratch on the offline suite.")
    parser.add_argument("--arch", choices=ARCHS, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=16, help="full-answer samples per step (0: none)")
    parser.add_argument("--short-batch-size", type=int, default=16, help="short-answer items per step (0: none)")
    parser.add_argument(
        "--lookup-batch-size",
        type=int,
        default=0,
        help="text-only seed option lookups per step (the options under a question naming one; default 0: none)",
    )
    parser.add_argument(
        "--lookup-forms",
        type=parse_seed_forms,
        default=("lookup-any",),
        help="forms of the text-only lookups, mixed evenly (as --seed-forms): lookup-any (default), sentence "
        "(the question as asked, answered by the closing sentence of a seed answer naming a random option)",
    )
    parser.add_argument("--data-seed", type=int, default=TRAIN_SEED, help="seed of the training samples")
    parser.add_argument(
        "--short-weights",
        type=parse_weights,
        default={},
        help="oversample families in the short-answer items, e.g. 'seed=3,chart=2' (others keep 1)",
    )
    parser.add_argument(
        "--seed-forms",
        type=parse_seed_forms,
        default=("letter",),
        help="forms of seed's short-answer items, mixed evenly: letter (as asked), open (without the options, "
        "answered by the option's text), lookup (the options under a question naming one, answered by its "
        "letter), lookup-any (as lookup, naming a random option), sentence (see --lookup-forms); "
        "e.g. 'letter,open,lookup-any' (default: letter)",
    )
    parser.add_argument(
        "--open-seed-short",
        dest="seed_forms",
        action="store_const",
        const=("open",),
        help="the same as --seed-forms open",
    )
    parser.add_argument(
        "--full-weights",
        type=parse_weights,
        default={},
        help="oversample families in the full answers, e.g. 'seed=4' (others keep 1)",
    )
    parser.add_argument("--init-from", type=Path, help="start from this saved model folder instead of random weights")
    parser.add_argument(
        "--fresh-vision",
        action="store_true",
        help="with --init-from: keep its text model, but start a new (random) vision tower and projector",
    )
    parser.add_argument("--vision-hidden", type=int, help="width of a new vision tower (default 128)")
    parser.add_argument("--vision-intermediate", type=int, help="MLP width of a new vision tower (default 2x width)")
    parser.add_argument(
        "--image-feature-norm",
        type=float,
        help="before training, scale the projector's output so image tokens have this mean norm",
    )
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    parser.add_argument("--tokenizer-samples", type=int, default=2000, help="samples per family for the tokenizer")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--checkpoint-every", type=int, default=200)
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument(
        "--bf16", action="store_true", help="bf16 autocast (slower than float32 on the 2-core x86 CPU measured here)"
    )
    args = parser.parse_args(argv)
    sizes = (args.batch_size, args.short_batch_size, args.lookup_batch_size)
    if min(sizes) < 0 or not any(sizes):
        parser.error("--batch-size, --short-batch-size and --lookup-batch-size must be >= 0, one of them > 0")
    if args.fresh_vision and not args.init_from:
        parser.error("--fresh-vision keeps the text model of --init-from: give --init-from")
    if args.init_from and not args.fresh_vision and (args.vision_hidden or args.vision_intermediate):
        parser.error("--vision-hidden/--vision-intermediate shape a new vision tower: add --fresh-vision")
    return args


def start_processor(args: argparse.Namespace) -> Any:
    """The processor of ``--init-from``, or the one this run saved before (a resumed run), or a new one
    around a tokenizer trained on the suite's text (saved to ``--out/processor``)."""
    processor_dir = args.out / "processor"
    saved_processor = args.init_from if args.init_from else processor_dir
    if (saved_processor / "tokenizer.json").is_file():
        from recap.zoo.image_processor import load_processor

        return load_processor(saved_processor)
    tokenizer = train_tokenizer(suite.corpus(args.tokenizer_samples, TOKENIZER_SEED), args.arch, args.vocab_size)
    processor = make_processor(args.arch, tokenizer)
    processor.save_pretrained(processor_dir)
    return processor


def start_model(args: argparse.Namespace, processor: Any) -> torch.nn.Module:
    """The model of ``--init-from`` (with a new vision path under ``--fresh-vision``), or a random one."""
    vision_size = {
        k: v for k, v in [("vision_hidden", args.vision_hidden), ("vision_intermediate", args.vision_intermediate)] if v
    }
    if not args.init_from:
        return make_model(args.arch, processor.tokenizer, **vision_size)
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(args.init_from, dtype=torch.float32, attn_implementation="sdpa")
    if args.fresh_vision:
        fresh = make_model(args.arch, processor.tokenizer, **vision_size)
        transplant_text_model(model, fresh)
        model = fresh
    return model


def resume(checkpoint: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, list[dict], float]:
    """(first step, loss history, minutes so far in seconds) of the run: from its checkpoint if there is one
    (weights, optimizer and torch's RNG restored), else (0, [], 0.0)."""
    if not checkpoint.is_file():
        return 0, [], 0.0
    state = torch.load(checkpoint, weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    print(f"resumed from step {state['step']}", flush=True)
    return state["step"], state["history"], state["elapsed"]


def data_streams(args: argparse.Namespace, start: int) -> dict[str, tuple[Any, bool]]:
    """Log name -> (its batches from step ``start`` on, whether they have images), one per batch size > 0."""
    streams = {}
    if args.batch_size:
        streams["loss"] = (batch_stream(args.data_seed, start, args.batch_size, weights=args.full_weights), True)
    if args.short_batch_size:
        short = short_batch_stream(args.data_seed, start, args.short_batch_size, args.short_weights, args.seed_forms)
        streams["short_loss"] = (short, True)
    if args.lookup_batch_size:
        lookups = lookup_batch_stream(args.data_seed, start, args.lookup_batch_size, args.lookup_forms)
        streams["lookup_loss"] = (lookups, False)
    return streams


def train_steps(
    args: argparse.Namespace,
    model: torch.nn.Module,
    processor: Any,
    optimizer: torch.optim.Optimizer,
    checkpoint: Path,
    start: int,
    history: list[dict],
    elapsed: Callable[[], float],
) -> None:
    """Steps ``start`` to ``--steps``: each sums the mean losses of one batch per stream; logs the mean
    losses to ``history`` every ``--log-every`` steps and writes a checkpoint every ``--checkpoint-every``."""
    streams = data_streams(args, start)
    windows = {name: [] for name in streams}
    for step in range(start, args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr, args.warmup)
        optimizer.zero_grad(set_to_none=True)
        for name, (batches, with_images) in streams.items():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                loss = model(**collate(next(batches), processor, args.arch, with_images)).loss
            loss.backward()  # the parts' mean losses are summed
            windows[name].append(loss.item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        done = step + 1
        if done % args.log_every == 0 or done == args.steps:
            seconds = elapsed()
            entry = {"step": done, **{k: round(sum(v) / len(v), 4) for k, v in windows.items()}}
            entry["minutes"] = round(seconds / 60, 2)
            history.append(entry)
            windows = {name: [] for name in streams}
            shown = " ".join(f"{k} {v}" for k, v in entry.items() if k not in ("step", "minutes"))
            print(
                f"step {done}/{args.steps} {shown} lr {optimizer.param_groups[0]['lr']:.2e} {seconds / 60:.1f} min",
                flush=True,
            )
        if done % args.checkpoint_every == 0 or done == args.steps:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "step": done,
                "history": history,
                "elapsed": elapsed(),
            }
            save_checkpoint(checkpoint, state)


def run_summary(args: argparse.Namespace, argv: list[str] | None, model: Any, processor: Any) -> dict[str, Any]:
    """What ``training.json`` records of this run besides what every run records (``write_summary``)."""
    return {
        "command": " ".join(["python -m tools.zoo_training.train", *(sys.argv[1:] if argv is None else argv)]),
        "arch": args.arch,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(processor.tokenizer),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "short_batch_size": args.short_batch_size,
        "lookup_batch_size": args.lookup_batch_size,
        "short_weights": args.short_weights,
        "full_weights": args.full_weights,
        "seed_forms": list(args.seed_forms),
        "lookup_forms": list(args.lookup_forms),
        "lr": args.lr,
        "image_feature_norm": args.image_feature_norm,
        "fresh_vision": args.fresh_vision,
        "vision_hidden": model.config.vision_config.hidden_size,
        "warmup": args.warmup,
        "seed": args.seed,
        "train_seed": args.data_seed,
        "tokenizer_seed": TOKENIZER_SEED,
        "bf16_autocast": args.bf16,
        "init_from": str(args.init_from) if args.init_from else None,
        "init_training": training_record(args.init_from),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    processor = start_processor(args)
    model = start_model(args, processor)
    checkpoint = args.out / "checkpoint.pt"
    if args.image_feature_norm and not checkpoint.is_file():
        model.eval()
        before, after = rescale_image_features(model, processor, args.image_feature_norm, args.data_seed)
        print(f"image feature norm {before:.1f} -> {after:.1f}", flush=True)
    fast_patch_embedding(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    start, history, elapsed_before = resume(checkpoint, model, optimizer)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{args.arch}: {parameters / 1e6:.2f}M parameters, vocab {len(processor.tokenizer)}", flush=True)

    model.train()
    began = time.time()

    def elapsed() -> float:
        return elapsed_before + time.time() - began

    train_steps(args, model, processor, optimizer, checkpoint, start, history, elapsed)
    final = args.out / "final"
    model.eval()
    model.to(torch.float16).save_pretrained(final)
    processor.save_pretrained(final)
    write_summary(final, run_summary(args, argv, model, processor), history, elapsed())


if __name__ == "__main__":
    main()
