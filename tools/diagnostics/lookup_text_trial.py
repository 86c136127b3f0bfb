"""Can a model's text part learn the seed option lookup? Text-only trial, no images.

    python -m tools.diagnostics.lookup_text_trial --model tiny-qwen2.5-vl --steps 1500 --batch-size 32

Trains the model (in memory, nothing saved) on ``seed`` lookups without their image: the options
under a question naming one of them (``tools.zoo_training.train.short_answer`` in the form "lookup-any": the
named letter drawn apart from the scene by ``tools.zoo_training.train.any_letter``), loss on the letter; every
250 steps it scores held-out lookups (seed 424242) by the most likely of the four letters.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from recap import suite
from recap.loading import build_inputs, load_model
from recap.suite.seed import LETTERS
from tools.zoo_training.evaluate import EVAL_SEED
from tools.zoo_training.train import TRAIN_SEED, short_answer


def lookups(processor, seed: int, count: int) -> list[tuple[torch.Tensor, int]]:
    """(prompt token ids, index of the named letter) for ``count`` seed items of ``seed``."""
    items = []
    for i in range(count):
        lookup = short_answer(suite.generate("seed", suite.sample_seed("seed", seed, i)), ("lookup-any",))
        items.append((build_inputs(processor, lookup.prompt)["input_ids"][0], LETTERS.index(lookup.reference)))
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen2.5-vl")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=4e-4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, processor = load_model(args.model, device="cpu", dtype="float32")
    tokenizer = processor.tokenizer
    letter_ids = torch.tensor([tokenizer.convert_tokens_to_ids(letter) for letter in LETTERS])
    held_out = lookups(processor, EVAL_SEED, 80)
    pool = lookups(processor, TRAIN_SEED, max(1, args.steps * args.batch_size // 4))  # each item seen ~4 times
    rng = random.Random(0)

    def score() -> int:
        model.eval()
        with torch.no_grad():
            right = sum(int(model(input_ids=ids[None]).logits[0, -1, letter_ids].argmax()) == k for ids, k in held_out)
        model.train()
        return right

    print(f"step 0: {score()}/{len(held_out)} held-out lookups right", flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    began = time.time()
    for step in range(1, args.steps + 1):
        batch = rng.sample(pool, args.batch_size)
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, _) in enumerate(batch):  # left padding: the last position is the prompt's end
            input_ids[row, width - len(ids) :] = ids
            attention[row, width - len(ids) :] = 1
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, -1]
        loss = torch.nn.functional.cross_entropy(logits, letter_ids[[k for _, k in batch]])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 250 == 0 or step == args.steps:
            print(f"step {step}: loss {loss.item():.3f}, {score()}/{len(held_out)} right, {time.time() - began:.0f} s")


if __name__ == "__main__":
    main()
