"""Checking generated answers against a sample's checkable field.

Each family states its checkable field in a fixed way, and the checker parses
generated text the same way:

* numbers: the first number mentioned (``math``: the last one, after the steps);
* colours, shapes, sides, sizes: the first word of that category
  (``science``: the last, because the lecture comes before the answer);
* ``seed``: the option letter (``"B."``, ``"(B)"``, ``"option B"``, ...; a capital,
  so "the answer is a circle" is not read as A);
* ``ocr``/``textvqa`` and chart labels: the first ``"quoted"`` text;
* ``science`` binary facts (attract/repel, float/sink, day/night): the last one.
"""

from __future__ import annotations

import re

from .sample import Sample
from .scene import COLOUR_NAMES, SHAPE_SYNONYMS, SHAPES, SIZE_WORDS
from .text import find_numbers, first_quoted, lexicon_regex, norm

_COLOUR_RE = lexicon_regex(COLOUR_NAMES)
_SHAPE_CANON = {w: s for s, syns in SHAPE_SYNONYMS.items() for pair in syns for w in pair}
_SHAPE_RE = lexicon_regex(list(_SHAPE_CANON))
_SIDE_RE = re.compile(r"\b(left|right)\b", re.IGNORECASE)
_SIZE_CANON = {w: s for s, ws in SIZE_WORDS.items() for w in ws}
_SIZE_RE = lexicon_regex(list(_SIZE_CANON))
BINARY_FACTS = {
    "attract": "repel",
    "repel": "attract",
    "float": "sink",
    "sink": "float",
    "day": "night",
    "night": "day",
}
_BINARY_RE = re.compile(r"\b(attract|repel|float|sink|day|night)", re.IGNORECASE)
_LETTER_RES = (
    re.compile(r"^\s*\(?([A-D])\s*[\).:,]"),
    re.compile(r"^\s*([A-D])\s*$"),  # the whole answer is the letter (the short-answer form)
    re.compile(r"^\s*([A-D])\s+is\b"),
    re.compile(r"\(([A-D])\)"),
    re.compile(r"\b(?i:answer|option|choice|letter)\s+(?i:is\s+)?\(?([A-D])\b"),
)


def extract_letter(text: str) -> str | None:
    """The option letter a multiple-choice answer commits to (earliest match)."""
    best: tuple[int, str] | None = None
    for rx in _LETTER_RES:
        m = rx.search(text)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), m.group(1).upper())
    return best[1] if best else None


def _pick(matches: list[str], last: bool) -> str | None:
    if not matches:
        return None
    return matches[-1] if last else matches[0]


def check_answer(sample: Sample, text: str) -> bool:
    """Whether ``text`` states the sample's checkable field correctly."""
    fam, want = sample.family, sample.check
    last = fam in ("science", "math")
    if fam == "seed":
        return extract_letter(text) == want
    if fam in ("ocr", "textvqa") or (fam == "chart" and not want.isdigit()):
        quoted = first_quoted(text)
        if quoted is not None:
            return norm(quoted) == norm(want)
        return re.search(rf"(?<!\w){re.escape(want)}(?!\w)", text, re.IGNORECASE) is not None
    if want.isdigit():
        got = _pick(find_numbers(text), last)
        return got is not None and got == int(want)
    if want in COLOUR_NAMES:
        got = _pick([m.lower() for m in _COLOUR_RE.findall(text)], last)
    elif want in SHAPES:
        got = _pick([_SHAPE_CANON[m.lower()] for m in _SHAPE_RE.findall(text)], last)
    elif want in ("left", "right"):
        got = _pick([m.lower() for m in _SIDE_RE.findall(text)], last)
    elif want in SIZE_WORDS:
        got = _pick([_SIZE_CANON[m.lower()] for m in _SIZE_RE.findall(text)], last)
    elif want in BINARY_FACTS:
        pair = (want, BINARY_FACTS[want])
        got = _pick([m.lower() for m in _BINARY_RE.findall(text) if m.lower() in pair], last)
    else:
        return norm(want) in norm(text)
    return got == want
