"""The embedded models in a form vLLM loads: ``model_path(name)`` (one call, cached).

What differs from the folders recap ships (``recap.zoo``):

- LLaVA-NeXT: transformers 5.x writes the CLIP tower as ``vision_tower.embeddings.*`` /
  ``vision_tower.encoder.*``; vLLM 0.32 expects ``vision_tower.vision_model.*``. The
  export renames those tensors (values untouched).
- Both: ``config.json`` says ``"dtype": "float16"`` (what they were saved from); the weights
  are float32 and recap's lossless checks run in float32, so the export says float32 and
  ``vllm serve PATH`` needs no ``--dtype``.

Everything else is copied as is. Qwen2.5-VL also needs, on a machine without a working
torchvision, the start-up hook of ``recap.vllm.compat``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

CLIP_PARTS = ("embeddings.", "encoder.", "pre_layrnorm.", "post_layernorm.")
MARKER = "recap_vllm_export.json"


def cache_root() -> Path:
    """Where exports go by default: ``$RECAP_CACHE/vllm`` or ``~/.cache/recap/vllm``."""
    from ..core.persist import cache_dir

    return cache_dir() / "vllm"


def _source(name_or_path: str | os.PathLike) -> Path:
    from .. import zoo

    if str(name_or_path) in zoo.NAMES:
        return zoo.path(str(name_or_path))
    folder = Path(name_or_path)
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"{name_or_path!r} is neither an embedded model ({', '.join(zoo.NAMES)}) nor a folder with config.json"
        )
    return folder


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file():
            stat = path.stat()
            h.update(f"{path.name}:{stat.st_size}:{int(stat.st_mtime)}".encode())
    return h.hexdigest()[:12]


def vllm_name(key: str) -> str:
    """The name vLLM 0.32 expects for checkpoint tensor ``key`` (CLIP towers of LLaVA models)."""
    prefix = "vision_tower."
    if key.startswith(prefix) and key[len(prefix) :].startswith(CLIP_PARTS):
        return prefix + "vision_model." + key[len(prefix) :]
    return key


def export_model(name_or_path: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Write a vLLM-loadable copy of an embedded model (or a folder like one) to ``dest``."""
    from safetensors.torch import load_file, save_file

    source, dest = _source(name_or_path), Path(dest)
    config = json.loads((source / "config.json").read_text())
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    renamed = 0
    for path in sorted(source.iterdir()):
        if not path.is_file():
            continue
        if path.suffix == ".safetensors" and config.get("model_type") in ("llava", "llava_next"):
            tensors = load_file(path)
            out = {vllm_name(key): value for key, value in tensors.items()}
            renamed += sum(key != vllm_name(key) for key in tensors)
            save_file(out, tmp / path.name, metadata={"format": "pt"})
        elif path.name == "config.json":
            config["dtype"] = "float32"
            (tmp / path.name).write_text(json.dumps(config, indent=2) + "\n")
        else:
            shutil.copy2(path, tmp / path.name)
    (tmp / MARKER).write_text(json.dumps({"source": str(source), "digest": _digest(source), "renamed": renamed}))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def model_path(name_or_path: str | os.PathLike) -> Path:
    """A folder vLLM loads for ``name_or_path``, exported once into ``cache_root()`` and reused
    while the source is unchanged."""
    source = _source(name_or_path)
    dest = cache_root() / f"{source.name}-{_digest(source)}"
    if not (dest / MARKER).is_file():
        export_model(source, dest)
    return dest
