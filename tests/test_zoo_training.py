"""The training script runs end to end (a few steps), so it cannot silently rot."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

import recap
from recap import suite
from recap.loading import build_inputs
from recap.zoo import train
from recap.zoo.processors import register


def test_training_smoke_run_resumes_and_saves_a_loadable_model(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["--arch", "qwen2.5-vl", "--out", str(out), "--batch-size", "2", "--tokenizer-samples", "5",
            "--vocab-size", "400", "--checkpoint-every", "1", "--log-every", "1", "--warmup", "1"]
    train.main([*args, "--steps", "1"])
    train.main([*args, "--steps", "2"])  # resumes from the step-1 checkpoint
    summary = json.loads((out / "final" / "training.json").read_text())
    assert summary["steps"] == 2 and [h["step"] for h in summary["loss_history"]] == [1, 2]
    register()
    model = AutoModelForImageTextToText.from_pretrained(out / "final", dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(out / "final")
    sample = suite.load("ocr", 1, 0)[0]
    inputs = build_inputs(processor, sample.prompt, sample.image)
    expected = model.generate(**inputs, do_sample=False, max_new_tokens=8)[0, inputs["input_ids"].shape[1] :]
    assert recap.generate(model, inputs, "recap", 8).token_ids == expected.tolist()


def test_batches_are_deterministic_and_resumable() -> None:
    first = [[s.seed for s in batch] for _, batch in zip(range(6), train.batch_stream(5, 0, 3))]
    again = [[s.seed for s in batch] for _, batch in zip(range(3), train.batch_stream(5, 3, 3))]
    assert again == first[3:]
    assert len({seed for batch in first for seed in batch}) == 18
