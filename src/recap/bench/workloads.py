"""What a benchmark runs on: the built-in offline suite or a user's JSONL file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from ..errors import InputError


@dataclass(frozen=True)
class Request:
    """One benchmark item: ``image`` may be None for text-only models."""

    id: str
    family: str
    prompt: str
    image: Image.Image | None


def suite_requests(families: str, samples: int, seed: int) -> list[Request]:
    """``samples`` requests per family (comma-separated names, or "all") of the suite."""
    from .. import suite

    names = suite.FAMILIES if families == "all" else tuple(f.strip() for f in families.split(",") if f.strip())
    unknown = [f for f in names if f not in suite.FAMILIES]
    if unknown or not names:
        raise InputError(
            f"unknown suite families {unknown or families!r}; choose from {', '.join(suite.FAMILIES)}, all"
        )
    out = []
    for family in names:
        for i, sample in enumerate(suite.load(family, samples, seed)):
            out.append(Request(id=f"{family}-{seed}-{i}", family=family, prompt=sample.prompt, image=sample.image))
    return out


def jsonl_requests(path: Path, limit: int | None = None) -> list[Request]:
    """Requests from a JSONL file of ``{"image": path, "prompt": text}`` rows (optional
    ``family`` and ``id``); image paths are relative to the file. Every problem names its line."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"data file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a leading byte-order mark is tolerated
    except UnicodeDecodeError as exc:
        number = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}:{number}: not valid UTF-8 ({exc.reason})") from None
    out: list[Request] = []
    # JSON Lines are separated by "\n" only: str.splitlines() would also split inside JSON
    # strings holding raw U+2028, U+0085, ... (valid JSON) and shift the line numbers
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise InputError(f"{where}: each line must be a JSON object with 'prompt' (and 'image')")
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise InputError(f"{where}: 'prompt' must be a non-empty string")
        image = None
        if row.get("image") is not None:
            if not isinstance(row["image"], str):
                raise InputError(f"{where}: 'image' must be a path (a string)")
            image_path = (path.parent / row["image"]).resolve()
            if not image_path.is_file():
                raise InputError(f"{where}: image {row['image']} not found (looked at {image_path})")
            try:
                with Image.open(image_path) as opened:
                    image = opened.convert("RGB")
            except OSError as exc:
                raise InputError(f"{where}: cannot read image {row['image']}: {exc}") from None
        family = row.get("family", "data")
        out.append(Request(id=str(row.get("id", number)), family=str(family), prompt=prompt, image=image))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise InputError(f"data file {path} has no rows")
    return out
