"""Offline, seeded, procedural seven-family multimodal suite (plus ``describe``).

Each family mirrors one benchmark of the paper and yields :class:`Sample`
records (224x224 RGB image, prompt, reference answer, checkable field):

========== ============================================= ==========================
family     mirrors / content                             checkable field
========== ============================================= ==========================
mmt        MMT-Bench: count, colour, side, size, shape   number/colour/side/size/shape
seed       SEED-Bench: 4-option multiple choice          option letter
science    ScienceQA: lecture + answer (magnets, ...)    attract/repel, float/sink, ...
ocr        OCRBench: read 1-2 large words or a number    the text read
chart      ChartQA: 2-4 bar charts                       bar value or bar label
math       MathVista: step-by-step counting/arithmetic   final number
textvqa    TextVQA: sign/label text in a drawn scene     the text read
describe   free-form description paragraph               total object count
========== ============================================= ==========================

Generation is a pure function of ``(family, seed, index)``; the wording of
answers is a deterministic function of the image content (see ``text.pick``).

The generators of a family share their shape on purpose (draw the props, then a list of prompts,
a list of lead sentences, a gloss, fillers): what differs is the wording, which is the data, and
folding it into shared helpers would make each family's text harder to read and to change.
"""

from __future__ import annotations

import hashlib
import importlib
import random

from .check import check_answer
from .sample import Sample
from .text import fix_articles

__all__ = ["FAMILIES", "LONG_FAMILIES", "Sample", "check_answer", "corpus", "generate", "load", "sample_seed"]

FAMILIES: tuple[str, ...] = ("mmt", "seed", "science", "ocr", "chart", "math", "textvqa", "describe")
LONG_FAMILIES: tuple[str, ...] = tuple(f for f in FAMILIES if f != "ocr")
# family -> module (``math`` lives in ``arith`` so it never shadows the stdlib module)
_MODULES = {f: f for f in FAMILIES} | {"math": "arith"}


def _validate_family(family: str, allow_all: bool) -> None:
    valid = FAMILIES + (("all",) if allow_all else ())
    if family not in valid:
        raise ValueError(f"unknown family {family!r}; valid choices: {', '.join(valid)}")


def sample_seed(family: str, seed: int, index: int) -> int:
    """The per-sample seed of item ``index`` of ``family`` under ``seed`` (process-independent)."""
    key = f"recap.suite/{family}/{int(seed)}/{int(index)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


def generate(family: str, seed: int) -> Sample:
    """Regenerate one sample of ``family`` from its per-sample ``seed`` (``Sample.seed``)."""
    _validate_family(family, allow_all=False)
    module = importlib.import_module(f"{__name__}.{_MODULES[family]}")
    image, prompt, reference, check = module.generate(random.Random(seed))
    prompt, reference = fix_articles(prompt), fix_articles(reference)
    return Sample(image=image, prompt=prompt, reference=reference, family=family, check=check, seed=seed)


def load(family: str, n: int, seed: int) -> list[Sample]:
    """``n`` deterministic samples of ``family`` (or ``"all"``: round-robin over FAMILIES).

    Prefix-stable: item ``i`` does not depend on ``n``.  For ``"all"``, item ``i``
    equals item ``i // len(FAMILIES)`` of family ``FAMILIES[i % len(FAMILIES)]``.
    """
    _validate_family(family, allow_all=True)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}; valid families: {', '.join(FAMILIES)}, all")
    out = []
    for i in range(n):
        if family == "all":
            fam, idx = FAMILIES[i % len(FAMILIES)], i // len(FAMILIES)
        else:
            fam, idx = family, i
        out.append(generate(fam, sample_seed(fam, seed, idx)))
    return out


def corpus(n_per_family: int, seed: int) -> list[str]:
    """Prompt and reference strings of ``n_per_family`` samples per family (tokenizer training)."""
    texts: list[str] = []
    for fam in FAMILIES:
        for s in load(fam, n_per_family, seed):
            texts.extend((s.prompt, s.reference))
    return texts
