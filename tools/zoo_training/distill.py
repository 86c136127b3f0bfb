"""Start a tiny LLaVA-NeXT from a trained tiny Qwen2.5-VL: copy the text model, distil the vision path.

    python -m tools.zoo_training.distill --teacher tiny-qwen2.5-vl --out checkpoints/llava-from-qwen --steps 1500

Then fine-tune end to end: ``python -m tools.zoo_training.train --arch llava-next --init-from OUT/final ...``.

The two embedded models share their BPE vocabulary (trained on the same suite text; only the
special tokens differ), the text model's shape and a 28-pixel image grid. Qwen2.5-VL merges 2x2
patches of 14 px into one image token, so a 224-px suite image becomes 8x8 tokens; LLaVA-NeXT
cuts the same image (at its 224x224 pinpoint) into four 112-px tiles of 4x4 patches of 28 px,
after the whole image at 112 px (4x4 patches of 56 px). So:

1. the text model (Qwen2's decoder is Llama's with q/k/v biases) is copied into a Llama text model
   with attention biases; embedding and output rows are matched by token string;
2. a new CLIP tower and projector learn to output, for each 28-px patch of a tile, the teacher's
   image token of the same square (for a 56-px patch of the whole image, the mean of the teacher's
   2x2 tokens there): mean squared error divided by the teacher's mean square. This dense target
   trains the vision path far faster than the answer tokens' loss can.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from recap import suite
from tools.zoo_training.build import make_model
from tools.zoo_training.train import image_features, learning_rate, save_checkpoint, training_record, write_summary

GRID = 8  # 28-px squares per side of a 224-px image
TILE = 4  # 28-px patches per side of a 112-px LLaVA tile
# LLaVA special token -> the Qwen token whose trained rows it starts from
SPECIAL_TOKENS = {
    "<s>": "<|im_start|>",
    "</s>": "<|im_end|>",
    "<unk>": "<|endoftext|>",
    "<pad>": "<|endoftext|>",
    "<image>": "<|image_pad|>",
}
HELD_OUT_SEED = 424242
VISION_PATH = ("model.vision_tower.", "model.multi_modal_projector.")  # what distillation trains


def token_mixing(source_tokenizer: Any, target_tokenizer: Any) -> torch.Tensor:
    """[target vocab, source vocab] weights: each target token's rows start as the source rows of
    the same string, or (for the few merges only the target has) the mean of the rows of the
    pieces the source tokenizer cuts that string into."""
    source_vocab = source_tokenizer.get_vocab()
    target_vocab = target_tokenizer.get_vocab()
    mixing = torch.zeros(len(target_vocab), len(source_vocab))
    for token, index in target_vocab.items():
        name = SPECIAL_TOKENS.get(token, token)
        if name in source_vocab:
            mixing[index, source_vocab[name]] = 1.0
            continue
        text = target_tokenizer.convert_tokens_to_string([token])
        pieces = source_tokenizer.convert_tokens_to_ids(source_tokenizer.tokenize(text))
        if not pieces or source_tokenizer.unk_token_id in pieces:
            raise ValueError(f"token {token!r} has no counterpart in the source vocabulary: tokenizers differ")
        for piece in pieces:
            mixing[index, piece] += 1.0 / len(pieces)
    return mixing


def copy_text_model(source: torch.nn.Module, target: torch.nn.Module, mixing: torch.Tensor) -> int:
    """Copy a Qwen2.5-VL text model and output layer into a LLaVA-NeXT (Llama with attention
    biases) one; ``mixing`` [target vocab, source vocab] maps token rows. Returns the tensors copied."""
    source_state, target_state = source.state_dict(), target.state_dict()
    text = ("model.language_model.", "lm_head.")
    keys = [k for k in target_state if k.startswith(text)]
    dropped = [k for k in source_state if k.startswith(text) and k not in target_state]
    if dropped:
        raise ValueError(f"the student has no {dropped[0]}: build it with attention_bias=True")
    with torch.no_grad():
        for key in keys:
            if key.endswith("o_proj.bias"):  # Qwen2 has none: zero is the same function
                target_state[key].zero_()
            elif key not in source_state or source_state[key].shape[-1] != target_state[key].shape[-1]:
                raise ValueError(f"text models differ at {key}: build the student with attention_bias=True")
            elif key.endswith(("embed_tokens.weight", "lm_head.weight")):
                target_state[key].copy_(mixing @ source_state[key].float())
            else:
                target_state[key].copy_(source_state[key])
    return len(keys)


def copy_vision_path(source: torch.nn.Module, target: torch.nn.Module) -> int:
    """Copy a LLaVA-NeXT's CLIP tower, projector and image newline into ``target``; returns the tensor count."""
    prefixes = (*VISION_PATH, "model.image_newline")
    source_state = {n: t for n, t in source.state_dict().items() if n.startswith(prefixes)}
    target_state = {n: t for n, t in target.state_dict().items() if n.startswith(prefixes)}
    if source_state.keys() != target_state.keys() or any(
        source_state[n].shape != target_state[n].shape for n in target_state
    ):
        raise ValueError(
            "--init-vision: that model's vision path does not match the student's shape; "
            "pass the same --vision-hidden/--vision-intermediate it was built with"
        )
    with torch.no_grad():
        for name, tensor in target_state.items():
            tensor.copy_(source_state[name])
    return len(target_state)


def tile_features(model: torch.nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """LLaVA-NeXT's projected patch features per tile, [images, tiles, 16, hidden], as its
    ``get_image_features`` computes them before packing (CLS dropped: strategy "default")."""
    inner = model.model
    images, tiles = pixel_values.shape[:2]
    out = inner.vision_tower(pixel_values.flatten(0, 1), output_hidden_states=True)
    patches = out.hidden_states[model.config.vision_feature_layer][:, 1:]  # [images*tiles, 16, vision hidden]
    return inner.multi_modal_projector(patches).unflatten(0, (images, tiles))


def tile_targets(teacher_tokens: torch.Tensor) -> torch.Tensor:
    """The teacher's 8x8 image tokens [images, 64, hidden] laid out as LLaVA's five tiles
    [images, 5, 16, hidden]: the whole image (2x2 means), then the four quarters in raster order."""
    grid = teacher_tokens.unflatten(1, (GRID, GRID))  # [images, 8, 8, hidden]
    whole = F.avg_pool2d(grid.permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)  # [images, 4, 4, hidden]
    quarters = [grid[:, r : r + TILE, c : c + TILE] for r in (0, TILE) for c in (0, TILE)]
    return torch.stack([whole, *quarters], dim=1).flatten(2, 3)


def pixel_batch(processor: Any, images: list) -> torch.Tensor:
    """LLaVA-NeXT pixel values [images, 5, 3, 112, 112] of 224x224 images."""
    if any(image.size != (GRID * 28, GRID * 28) for image in images):
        raise ValueError("the distillation grid needs 224x224 images (the suite's size)")
    pixels = torch.as_tensor(processor.image_processor(images=images, return_tensors="pt")["pixel_values"])
    if pixels.shape[1] != 1 + TILE:
        raise ValueError(f"expected 5 tiles per image (224x224 pinpoint), got {pixels.shape[1]}")
    return pixels.float()


def relative_error(student: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (student - target).pow(2).mean() / target.pow(2).mean()


def images_of(seed: int, start: int, count: int) -> list:
    """``count`` suite images, round-robin over the families, from sample ``start`` on."""
    families = suite.FAMILIES
    return [
        suite.generate(families[i % len(families)], suite.sample_seed(families[i % len(families)], seed, i)).image
        for i in range(start, start + count)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", default="tiny-qwen2.5-vl", help="embedded model name or folder (Qwen2.5-VL)")
    parser.add_argument("--processor", default="tiny-llava-next", help="LLaVA-NeXT processor: embedded name or folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32, help="images per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--data-seed", type=int, default=20001)
    parser.add_argument("--vision-hidden", type=int, default=256)
    parser.add_argument("--vision-intermediate", type=int, help="default: 4x the width")
    parser.add_argument(
        "--init-vision",
        help="LLaVA-NeXT model (embedded name or folder) whose CLIP tower and projector the student starts from, "
        "instead of new ones (built with the same --vision-hidden and --vision-intermediate)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=200)
    parser.add_argument("--log-every", type=int, default=20)
    args = parser.parse_args(argv)

    from transformers import AutoModelForImageTextToText

    from recap.zoo import ROOT
    from recap.zoo.image_processor import load_processor

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    def folder(name: str) -> Path:
        return Path(name) if Path(name).is_dir() else ROOT / name

    teacher_dir, processor_dir = folder(args.teacher), folder(args.processor)
    teacher = AutoModelForImageTextToText.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    teacher_processor = load_processor(teacher_dir)
    processor = load_processor(processor_dir)
    if teacher.config.model_type != "qwen2_5_vl":
        raise ValueError(f"--teacher must be a Qwen2.5-VL model, not {teacher.config.model_type}")

    student = make_model(
        "llava-next",
        processor.tokenizer,
        vision_hidden=args.vision_hidden,
        vision_intermediate=args.vision_intermediate or 4 * args.vision_hidden,
        attention_bias=True,
        rms_norm_eps=teacher.config.text_config.rms_norm_eps,
    )
    copy_text_model(teacher, student, token_mixing(teacher_processor.tokenizer, processor.tokenizer))
    if args.init_vision:
        source = AutoModelForImageTextToText.from_pretrained(folder(args.init_vision), dtype=torch.float32)
        copy_vision_path(source, student)
    vision = [p for n, p in student.named_parameters() if n.startswith(VISION_PATH)]
    optimizer = torch.optim.AdamW(vision, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)

    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint = args.out / "checkpoint.pt"
    start, history, elapsed_before = 0, [], 0.0
    if checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False)
        student.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, history, elapsed_before = state["step"], state["history"], state["elapsed"]
        print(f"resumed from step {start}", flush=True)

    def targets(images: list) -> torch.Tensor:
        return tile_targets(torch.stack(image_features(teacher, teacher_processor, images)))

    held_out = images_of(HELD_OUT_SEED, 0, 64)
    held_out_pixels, held_out_targets = pixel_batch(processor, held_out), targets(held_out)
    student.train()
    began, window = time.time(), []
    for step in range(start, args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr, args.warmup)
        images = images_of(args.data_seed, step * args.batch_size, args.batch_size)
        loss = relative_error(tile_features(student, pixel_batch(processor, images)), targets(images))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vision, 1.0)
        optimizer.step()
        window.append(loss.item())
        done = step + 1
        if done % args.log_every == 0 or done == args.steps:
            elapsed = elapsed_before + time.time() - began
            with torch.no_grad():
                held = relative_error(tile_features(student, held_out_pixels), held_out_targets).item()
            entry = {"step": done, "loss": round(sum(window) / len(window), 4), "held_out": round(held, 4)}
            history.append(entry | {"minutes": round(elapsed / 60, 2)})
            window = []
            shown = f"loss {entry['loss']} held-out {held:.4f} {elapsed / 60:.1f} min"
            print(f"step {done}/{args.steps} {shown}", flush=True)
        if done % args.checkpoint_every == 0 or done == args.steps:
            state = {
                "model": student.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": done,
                "history": history,
                "elapsed": elapsed_before + time.time() - began,
            }
            save_checkpoint(checkpoint, state)

    final = args.out / "final"
    student.eval()
    student.save_pretrained(final)  # float32: the next phase starts from it
    processor.save_pretrained(final)
    teacher_training = teacher_dir / "training.json"
    summary = {
        "kind": "distill",
        "command": " ".join(["python -m tools.zoo_training.distill", *(sys.argv[1:] if argv is None else argv)]),
        "arch": "llava-next",
        "teacher": args.teacher,
        "teacher_training": json.loads(teacher_training.read_text()) if teacher_training.is_file() else None,
        "parameters": sum(p.numel() for p in student.parameters()),
        "vocab_size": len(processor.tokenizer),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "warmup": args.warmup,
        "train_seed": args.data_seed,
        "vision_hidden": args.vision_hidden,
        "init_vision": args.init_vision,
        # the vision path's own phases: a card chains them before this one
        "init_training": training_record(folder(args.init_vision)) if args.init_vision else None,
        "seed": args.seed,
    }
    write_summary(final, summary, history, elapsed_before + time.time() - began)


if __name__ == "__main__":
    main()
