"""Linear probe: how much of a family's checkable field do a model's image tokens carry?

    python -m tools.diagnostics.probe_image_features --model tiny-llava-next --family ocr --samples 400

Fits a softmax regression from the image-token embeddings (the projector's output, flattened)
to the checkable field (its first character for ocr/textvqa, else its first word) on 75% of the
samples and reports accuracy on the rest, next to the majority-class rate. It separates "the
vision path does not see it" from "the text model does not use it".
"""

from __future__ import annotations

import argparse

import torch

from recap import suite
from recap.loading import load_model
from tools.zoo_training.train import image_features


def image_tokens(model, processor, images: list) -> torch.Tensor:
    """[images, tokens * hidden]: each image's token embeddings, flattened (cut to the shortest)."""
    flat = [
        f.reshape(-1)
        for start in range(0, len(images), 16)
        for f in image_features(model, processor, images[start : start + 16])
    ]
    width = min(f.numel() for f in flat)
    return torch.stack([f[:width] for f in flat])


def probe_accuracy(features: torch.Tensor, labels: list[str], train_share: float = 0.75) -> tuple[float, float]:
    """Held-out accuracy of the best of three L2 strengths, and the held-out majority-class rate."""
    x = (features - features.mean(0)) / (features.std(0) + 1e-6)
    classes = sorted(set(labels))
    y = torch.tensor([classes.index(label) for label in labels])
    cut = int(len(labels) * train_share)
    best = 0.0
    for l2 in (1e-1, 1e-2, 1e-3):
        weights = torch.zeros(x.shape[1], len(classes), requires_grad=True)
        optimizer = torch.optim.Adam([weights], lr=1e-3)
        for _ in range(300):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(x[:cut] @ weights, y[:cut]) + l2 * (weights**2).sum()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            best = max(best, float(((x[cut:] @ weights).argmax(1) == y[cut:]).float().mean()))
    held_out = labels[cut:]
    return best, max(held_out.count(c) for c in classes) / len(held_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="embedded model name or model folder")
    parser.add_argument("--family", choices=suite.FAMILIES, default="ocr")
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--seed", type=int, default=31337, help="suite seed of the probed samples")
    args = parser.parse_args()

    torch.manual_seed(0)
    model, processor = load_model(args.model, dtype="float32")
    samples = suite.load(args.family, args.samples, args.seed)
    first = 1 if args.family in ("ocr", "textvqa") else None
    labels = [s.check.split()[0].lower()[:first] for s in samples]
    accuracy, majority = probe_accuracy(image_tokens(model, processor, [s.image for s in samples]), labels)
    print(f"{args.model} {args.family}: probe accuracy {accuracy:.2f} (majority class {majority:.2f})")


if __name__ == "__main__":
    main()
