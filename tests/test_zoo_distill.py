"""Starting LLaVA-NeXT from the Qwen2.5-VL model: exact text-model copy, aligned distillation grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

import recap
from recap import suite, zoo
from recap.loading import build_inputs
from tools.zoo_training import distill
from tools.zoo_training.build import make_model


@pytest.fixture(scope="module")
def qwen():
    return zoo.load("tiny-qwen2.5-vl")


@pytest.fixture(scope="module")
def llava_processor():
    return zoo.load("tiny-llava-next")[1]


def student(llava_processor, teacher=None):
    eps = teacher.config.text_config.rms_norm_eps if teacher is not None else None
    model = make_model("llava-next", llava_processor.tokenizer, 64, 128, attention_bias=True, rms_norm_eps=eps)
    return model.eval()


def test_copied_text_model_gives_the_teachers_logits(qwen, llava_processor) -> None:
    teacher, teacher_processor = qwen
    mixing = distill.token_mixing(teacher_processor.tokenizer, llava_processor.tokenizer)
    assert torch.allclose(mixing.sum(1), torch.ones(len(mixing)))
    model = student(llava_processor, teacher)
    distill.copy_text_model(teacher, model, mixing)
    text = "How many circles are in the picture? I count three red circles."
    target_ids = llava_processor.tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    rows = mixing.argmax(1)
    assert torch.equal(rows[target_ids], teacher_processor.tokenizer(text, return_tensors="pt").input_ids)
    with torch.no_grad():
        expected = teacher(input_ids=rows[target_ids]).logits[0][:, rows]
        got = model(input_ids=target_ids).logits[0]
    exact = mixing.max(1).values == 1  # tokens with the same string in both vocabularies
    assert exact.float().mean() > 0.99
    torch.testing.assert_close(got[:, exact], expected[:, exact])


def test_copy_refuses_a_student_without_attention_biases(qwen, llava_processor) -> None:
    teacher, teacher_processor = qwen
    plain = make_model("llava-next", llava_processor.tokenizer, 64, 128)
    mixing = distill.token_mixing(teacher_processor.tokenizer, llava_processor.tokenizer)
    with pytest.raises(ValueError, match="attention_bias=True"):
        distill.copy_text_model(teacher, plain, mixing)


def test_tiles_and_targets_share_the_28px_grid(llava_processor) -> None:
    model = student(llava_processor)
    image = suite.load("chart", 1, 3)[0].image
    pixels = distill.pixel_batch(llava_processor, [image])
    with torch.no_grad():
        tiles = distill.tile_features(model, pixels)[0]  # [5, 16, hidden]
        packed = model.model.get_image_features(pixel_values=pixels, image_sizes=torch.tensor([[224, 224]]))
    packed = getattr(packed, "pooler_output", packed)[0]  # whole image, then 8 rows of 8 patches + newline
    torch.testing.assert_close(packed[:16], tiles[0])
    rows = packed[16:].reshape(8, 9, -1)[:, :8]
    torch.testing.assert_close(rows, tiles[1:].reshape(2, 2, 4, 4, -1).permute(0, 2, 1, 3, 4).reshape(8, 8, -1))

    # the targets put the teacher's 8x8 tokens at the same places
    targets = distill.tile_targets(torch.arange(64.0).reshape(1, 64, 1))[0, :, :, 0]
    grid = targets[1:].reshape(2, 2, 4, 4).permute(0, 2, 1, 3).reshape(8, 8)
    assert torch.equal(grid, torch.arange(64.0).reshape(8, 8))
    assert targets[0, 0] == (0 + 1 + 8 + 9) / 4

    # and the second tile is the image's top-right quarter
    marked = Image.new("RGB", (224, 224), "white")
    marked.paste((255, 0, 0), (112, 0, 224, 112))
    green = distill.pixel_batch(llava_processor, [marked])[0, :, 1].mean(dim=(1, 2))
    assert green[2] < 0 < green[1] and green[3] > 0 and green[4] > 0


def test_pixel_batch_rejects_other_image_sizes(llava_processor) -> None:
    with pytest.raises(ValueError, match="224x224"):
        distill.pixel_batch(llava_processor, [Image.new("RGB", (300, 200))])


def test_vision_path_copy_gives_the_source_models_image_features(llava_processor) -> None:
    source = make_model("llava-next", llava_processor.tokenizer, 64, 128).eval()
    model = student(llava_processor)
    pixels = distill.pixel_batch(llava_processor, [suite.load("seed", 1, 0)[0].image])
    with torch.no_grad():
        assert not torch.allclose(distill.tile_features(model, pixels), distill.tile_features(source, pixels))
        assert distill.copy_vision_path(source, model) > 10
        torch.testing.assert_close(distill.tile_features(model, pixels), distill.tile_features(source, pixels))
    torch.testing.assert_close(model.model.image_newline, source.model.image_newline)
    with pytest.raises(ValueError, match="--vision-hidden"):
        distill.copy_vision_path(make_model("llava-next", llava_processor.tokenizer, 32, 128), model)


def test_distill_smoke_run_resumes_and_saves_a_trainable_model(tmp_path: Path) -> None:
    out = tmp_path / "distill"
    args = [*"--batch-size 2 --vision-hidden 32 --warmup 1 --checkpoint-every 1 --log-every 1 --out".split(), str(out)]
    distill.main([*args, "--steps", "1"])
    distill.main([*args, "--steps", "2"])  # resumes from the step-1 checkpoint
    summary = json.loads((out / "final" / "training.json").read_text())
    assert summary["kind"] == "distill" and [h["step"] for h in summary["loss_history"]] == [1, 2]
    assert summary["teacher_training"]["arch"] == "qwen2.5-vl"
    assert all(0 < h["held_out"] for h in summary["loss_history"])
    assert summary["init_training"] is None  # a new vision path

    again = tmp_path / "again"  # a second distillation whose vision path starts from the first one's
    distill.main([*args[:-1], str(again), "--steps", "1", "--init-vision", str(out / "final")])
    second = json.loads((again / "final" / "training.json").read_text())
    assert (
        second["init_vision"] == str(out / "final")
        and second["init_training"]["loss_history"] == summary["loss_history"]
    )

    model = AutoModelForImageTextToText.from_pretrained(out / "final", dtype=torch.float32).eval()
    processor = zoo.load("tiny-llava-next")[1]
    sample = suite.load("seed", 1, 0)[0]
    inputs = build_inputs(processor, sample.prompt, sample.image)
    expected = model.generate(**inputs, do_sample=False, max_new_tokens=8)[0, inputs["input_ids"].shape[1] :]
    assert recap.generate(model, inputs, "recap", 8).token_ids == expected.tolist()
