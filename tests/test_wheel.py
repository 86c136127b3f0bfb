"""The wheel built from the repository holds the library, its embedded models and their loader, and no
training code: training, distillation, evaluation and embedding of the models live in tools/, outside it."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "src" / "recap" / "zoo" / "models"
# what moved to tools/zoo_training (recap.zoo.train, .distill, .evaluate, .build and scripts/embed_model.py)
TRAINING_MODULES = ("train.py", "distill.py", "evaluate.py", "build.py", "embed_model.py")


@functools.cache
def wheel_files(out: Path) -> dict[str, bytes]:
    """Build the wheel from a copy of the repository's packaging inputs (so no build/ or egg-info lands in
    the checkout), offline, with the installed setuptools; the files it holds, by name."""
    pytest.importorskip("setuptools")
    source = out / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(REPO / "src", source / "src", ignore=junk)
    shutil.copytree(REPO / "tools", source / "tools", ignore=junk)  # beside src/, as in the repository
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    built = subprocess.run([*command, "-w", str(out / "wheel"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (out / "wheel").glob("recap_decoding-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist() if not name.endswith(".safetensors")} | {
            name: b"" for name in archive.namelist() if name.endswith(".safetensors")
        }


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return wheel_files(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def names(files: dict[str, bytes]) -> frozenset[str]:
    return frozenset(files)


def test_packaging_finds_only_the_library_under_src() -> None:
    setuptools = pytest.importorskip("setuptools")
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["packages"]["find"]["where"] == ["src"]
    packages = setuptools.find_packages(str(REPO / "src"))
    assert "recap" in packages and "recap.zoo" in packages
    assert not [p for p in packages if p.split(".")[0] != "recap"], packages


def test_wheel_holds_no_training_code(names: frozenset[str]) -> None:
    tops = {name.split("/")[0] for name in names}
    assert tops == {"recap", *(t for t in tops if t.endswith(".dist-info"))}, tops  # no tools/, no scripts/
    zoo_code = {name for name in names if name.startswith("recap/zoo/") and name.endswith(".py")}
    # the loader, the image processor and the real-shape builder (a bench instrument, no training)
    assert zoo_code == {"recap/zoo/__init__.py", "recap/zoo/image_processor.py", "recap/zoo/real_size.py"}
    assert not [n for n in names if n.endswith(".py") and n.rsplit("/", 1)[-1] in TRAINING_MODULES]


def test_library_code_does_not_import_the_tools(files: dict[str, bytes]) -> None:
    """Nothing in the wheel may need tools/ at run time: an installed recap has no such package."""
    sources = {name: text.decode() for name, text in files.items() if name.endswith(".py")}
    assert "recap/__init__.py" in sources
    importing = [
        name
        for name, text in sources.items()
        if any(line.lstrip().startswith(("import tools", "from tools")) for line in text.splitlines())
    ]
    assert not importing


def test_wheel_holds_the_embedded_models_and_their_loader(names: frozenset[str]) -> None:
    shipped = sorted(p for p in MODELS.iterdir() if (p / "config.json").is_file())
    assert {p.name for p in shipped} >= {"tiny-qwen2.5-vl", "tiny-llava-next"}
    for model in shipped:
        files = {f"recap/zoo/models/{model.name}/{f.name}" for f in model.iterdir() if f.is_file()}
        assert f"recap/zoo/models/{model.name}/model.safetensors" in files
        assert files <= names, sorted(files - names)
    assert {"recap/zoo/__init__.py", "recap/zoo/image_processor.py"} <= names
