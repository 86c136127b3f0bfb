"""The embedded models at real shapes (recap.zoo.real_size): the same logits (to float32 rounding) and the
same greedy tokens as the tiny models, with and without an image, for both embedded models; recap on them
is still lossless; the named shapes are what they say; the CLI and the bench label them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import recap
from recap.bench.workloads import suite_requests
from recap.cli import app
from recap.loading import build_inputs, load_model
from recap.zoo import real_size
from recap.zoo.real_size import LABEL, Shape

MODELS = ("tiny-qwen2.5-vl", "tiny-llava-next")
# twice as wide, deeper, a wider MLP; 8 / 2 heads regroup the tiny 4 / 2 (q heads move), 8 / 4 add kv heads
SMALL = (Shape(512, 6, 1024, 8, 2), Shape(512, 5, 800, 8, 4))


@pytest.fixture(scope="module")
def tiny() -> dict[str, tuple]:
    return {name: recap.zoo.load(name) for name in MODELS}


def requests(processor) -> list[dict]:
    """Suite requests with their image, and the same prompts without it."""
    out = []
    for request in suite_requests("ocr,chart", 1, seed=3):
        out.append(build_inputs(processor, request.prompt, request.image))
        out.append(build_inputs(processor, request.prompt))
    return out


def greedy(model, inputs, n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=n)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.mark.parametrize("shape", SMALL, ids=["regrouped", "more-kv"])
@pytest.mark.parametrize("name", MODELS)
def test_widened_model_predicts_what_the_tiny_one_does(tiny, name: str, shape: Shape) -> None:
    model, processor = tiny[name]
    wide = real_size.widen(model, shape, name=f"{name}@test")
    text = wide.config.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.intermediate_size) == (
        shape.hidden,
        shape.layers,
        shape.intermediate,
    )
    assert (text.num_attention_heads, text.num_key_value_heads) == (shape.heads, shape.kv_heads)
    for inputs in requests(processor):
        with torch.inference_mode():
            expected, got = model(**inputs).logits, wide(**inputs).logits
        scale = expected.abs().max().item()
        assert (got - expected).abs().max().item() <= 1e-5 * scale, "logits differ beyond float32 rounding"
        assert greedy(wide, inputs, 16) == greedy(model, inputs, 16)


@pytest.mark.parametrize("name", MODELS)
def test_recap_on_a_widened_model_is_lossless(tiny, name: str) -> None:
    model, processor = tiny[name]
    wide = real_size.widen(model, SMALL[0], name=f"{name}@test")
    for inputs in requests(processor)[:2]:
        result = recap.generate(wide, inputs, method="recap", max_new_tokens=40)
        assert result.token_ids == greedy(wide, inputs, 40)


def test_named_shapes_have_the_real_models_projection_shapes(tiny) -> None:
    """Every named shape widens its model (checked on the meta device, nothing allocated)."""
    body = {}
    for base, shapes in real_size.SHAPES.items():
        for size, shape in shapes.items():
            config = real_size.widened_config(tiny[base][0].config, shape)
            with torch.device("meta"):
                model = type(tiny[base][0])(config)
            layers = model.model.language_model.layers
            assert len(layers) == shape.layers
            attention, mlp = layers[0].self_attn, layers[0].mlp
            assert tuple(attention.q_proj.weight.shape) == (shape.hidden, shape.hidden)
            assert tuple(attention.k_proj.weight.shape) == (shape.kv_heads * 64, shape.hidden)
            assert tuple(mlp.down_proj.weight.shape) == (shape.hidden, shape.intermediate)
            body[f"{base}@{size}"] = sum(p.numel() for p in layers.parameters()) / 1e9
    # the transformer body of the real models (no embeddings): Qwen2.5-0.5B 0.36B, Qwen2.5-7B 6.5B, Mistral-7B 7.0B
    assert body["tiny-qwen2.5-vl@0.5b"] == pytest.approx(0.36, abs=0.01)
    assert body["tiny-qwen2.5-vl@7b"] == pytest.approx(6.53, abs=0.02)
    assert body["tiny-llava-next@7b"] == pytest.approx(6.98, abs=0.02)
    assert sorted(real_size.names()) == sorted(body)


def test_inconsistent_shapes_are_refused(tiny) -> None:
    config = tiny["tiny-qwen2.5-vl"][0].config
    with pytest.raises(ValueError, match="heads of 64"):
        real_size.widened_config(config, Shape(512, 4, 704, 4, 2))
    with pytest.raises(ValueError, match="grouping"):
        real_size.widened_config(config, Shape(512, 4, 704, 8, 8))  # 1 q head per kv head cannot hold 2
    with pytest.raises(ValueError, match="only widen"):
        real_size.widened_config(config, Shape(128, 4, 704, 2, 2))
    with pytest.raises(ValueError, match="available"):
        load_model("tiny-qwen2.5-vl@13b")


def test_cli_and_bench_label_a_real_shape_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(real_size.SHAPES["tiny-qwen2.5-vl"], "test", SMALL[0])
    runner = CliRunner()
    name = "tiny-qwen2.5-vl@test"
    args = ["generate", "-m", name, "-p", "What is written on the sign?", "--max-new-tokens", "12", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"{name}: {LABEL}" in result.stderr
    out = json.loads(result.stdout)
    assert Path(out["memory_file"]).name.startswith(f"{name}.recap-")
    model, processor = recap.zoo.load("tiny-qwen2.5-vl")
    assert out["token_ids"] == greedy(model, build_inputs(processor, "What is written on the sign?"), 12)

    bench = ["bench", "-m", name, "--suite", "ocr", "--samples", "1", "--methods", "recap", "--max-new-tokens", "8"]
    result = runner.invoke(app, [*bench, "--no-costs", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert LABEL in result.output
    assert json.loads((tmp_path / "results.json").read_text())["settings"]["model_note"] == LABEL
    assert f"`{name}` (cpu, float32): **{LABEL}**" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_the_half_billion_shape_builds_and_predicts_the_tiny_tokens(tiny) -> None:
    model, processor = load_model("tiny-qwen2.5-vl@0.5b", device="cpu", dtype="float32")
    assert model.config.recap_note == LABEL and model.config.name_or_path == "tiny-qwen2.5-vl@0.5b"
    assert sum(p.numel() for p in model.parameters()) > 0.35e9
    tiny_model, _ = tiny["tiny-qwen2.5-vl"]
    request = suite_requests("ocr", 1, seed=5)[0]
    inputs = build_inputs(processor, request.prompt, request.image)
    assert greedy(model, inputs, 6) == greedy(tiny_model, inputs, 6)
