"""Tests for the procedural multimodal suite ``recap.suite``."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

_SRC = Path(__file__).resolve().parents[1] / "src"
try:
    from recap import suite
except ImportError:  # running from a plain checkout without an installed package
    sys.path.insert(0, str(_SRC))
    from recap import suite

from recap.suite.check import extract_letter  # noqa: E402
from recap.suite.render import MIN_TEXT, font  # noqa: E402
from recap.suite.scene import COLOUR_NAMES, SHAPE_SYNONYMS, SHAPES, SIZE_WORDS  # noqa: E402
from recap.suite.text import find_numbers, number_word, word_count  # noqa: E402

LONG = ("mmt", "seed", "science", "chart", "math", "textvqa", "describe")
BINARY = {"attract": "repel", "repel": "attract", "float": "sink", "sink": "float", "day": "night", "night": "day"}


def _digest(samples: list[suite.Sample]) -> str:
    h = hashlib.sha256()
    for s in samples:
        h.update(s.image.tobytes())
        h.update("\x00".join((s.prompt, s.reference, s.family, s.check, str(s.seed))).encode())
    return h.hexdigest()


def _same(a: suite.Sample, b: suite.Sample) -> bool:
    return (a.prompt, a.reference, a.family, a.check, a.seed) == (
        b.prompt,
        b.reference,
        b.family,
        b.check,
        b.seed,
    ) and a.image.tobytes() == b.image.tobytes()


def test_families() -> None:
    assert suite.FAMILIES == ("mmt", "seed", "science", "ocr", "chart", "math", "textvqa", "describe")


@pytest.mark.parametrize("family", suite.FAMILIES)
def test_deterministic_and_prefix_stable(family: str) -> None:
    a = suite.load(family, 6, 11)
    b = suite.load(family, 6, 11)
    assert all(_same(x, y) for x, y in zip(a, b, strict=True))
    assert a[0] == b[0]  # frozen dataclass equality (PIL images compare by content)
    longer = suite.load(family, 9, 11)
    assert all(_same(x, y) for x, y in zip(a, longer[:6], strict=True))
    for s in a[:3]:
        assert _same(suite.generate(family, s.seed), s)


def test_all_is_round_robin_and_prefix_stable() -> None:
    mixed = suite.load("all", 19, 4)
    assert [s.family for s in mixed[:8]] == list(suite.FAMILIES)
    for i, s in enumerate(mixed):
        fam = suite.FAMILIES[i % len(suite.FAMILIES)]
        assert _same(s, suite.load(fam, i // len(suite.FAMILIES) + 1, 4)[-1])
    assert _digest(suite.load("all", 10, 4)) == _digest(mixed[:10])


def test_deterministic_across_processes() -> None:
    code = (
        "import hashlib\nfrom recap import suite\nh = hashlib.sha256()\n"
        "for s in suite.load('all', 16, 3):\n"
        "    h.update(s.image.tobytes())\n"
        "    h.update('\\x00'.join((s.prompt, s.reference, s.family, s.check, str(s.seed))).encode())\n"
        "print(h.hexdigest())\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(_SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == _digest(suite.load("all", 16, 3))


@pytest.mark.parametrize("family", suite.FAMILIES)
def test_seeds_differ(family: str) -> None:
    a, b = suite.load(family, 4, 1), suite.load(family, 4, 2)
    assert _digest(a) != _digest(b)
    assert [s.reference for s in a] != [s.reference for s in b]
    assert len({s.seed for s in a + b}) == 8


@pytest.mark.parametrize("family", suite.FAMILIES)
def test_samples_well_formed(family: str) -> None:
    for s in suite.load(family, 60, 5):
        assert s.family == family
        assert s.image.mode == "RGB" and s.image.size == (224, 224)
        assert s.prompt.strip() and s.reference.strip() and s.check.strip()
        lo, hi = s.image.convert("L").getextrema()
        assert hi - lo > 40  # not a blank canvas
        n = word_count(s.reference)
        if family in LONG:
            assert 20 <= n <= 150, (n, s.reference)
        else:
            assert 1 <= n <= 40, (n, s.reference)


def test_text_glyphs_are_large() -> None:
    left, top, right, bottom = font(MIN_TEXT).getbbox("H")
    assert bottom - top >= 28


def _alter(s: suite.Sample) -> str:
    """The reference with its checkable field replaced by a wrong value, stated the same way."""
    ref, want = s.reference, s.check
    if s.family == "seed":
        other = "D" if want != "D" else "A"
        return re.sub(rf"(?<![A-Za-z]){want}(?![A-Za-z])", other, ref)
    if s.family in ("ocr", "textvqa") or (s.family == "chart" and not want.isdigit()):
        other = str(int(want) + 1) if want.isdigit() else ("ZEBRA" if want != "ZEBRA" else "LION")
        return ref.replace(f'"{want}"', f'"{other}"')
    if want.isdigit():
        n = int(want)
        out = re.sub(rf"(?<![\d-]){n}(?!\d)", str(n + 1), ref)
        return re.sub(rf"\b{number_word(n)}\b", number_word(n + 1), out, flags=re.IGNORECASE)
    if want in COLOUR_NAMES:
        other = COLOUR_NAMES[(COLOUR_NAMES.index(want) + 1) % len(COLOUR_NAMES)]
        return re.sub(rf"\b{want}\b", other, ref, flags=re.IGNORECASE)
    if want in SHAPES:
        other = SHAPES[(SHAPES.index(want) + 1) % len(SHAPES)]
        for sing, plur in sorted(SHAPE_SYNONYMS[want], key=lambda p: -len(p[0])):
            ref = re.sub(rf"\b{re.escape(plur)}\b", other + "s", ref)
            ref = re.sub(rf"\b{re.escape(sing)}\b", other, ref)
        return ref
    if want in ("left", "right"):
        return re.sub(rf"\b{want}\b", "right" if want == "left" else "left", ref)
    if want in SIZE_WORDS:
        other = "small" if want == "large" else "large"
        for w in SIZE_WORDS[want]:
            ref = re.sub(rf"\b{w}\b", other, ref)
        return ref
    if want in BINARY:
        return re.sub(rf"\b{want}", BINARY[want], ref, flags=re.IGNORECASE)
    raise AssertionError(f"unhandled check {want!r}")


@pytest.mark.parametrize("family", suite.FAMILIES)
def test_check_answer(family: str) -> None:
    for s in suite.load(family, 80, 6):
        assert suite.check_answer(s, s.reference), s.reference
        altered = _alter(s)
        assert altered != s.reference
        assert not suite.check_answer(s, altered), (s.check, altered)
        assert not suite.check_answer(s, "I am not sure.")


def test_check_parsers() -> None:
    assert find_numbers("Twenty-one cats, 5 dogs and three birds.") == [21, 5, 3]
    assert extract_letter("The answer is (C) because ...") == "C"
    assert extract_letter("B. The star is red.") == "B"
    assert extract_letter("B") == "B" and extract_letter(" C\n") == "C"  # a bare letter: the short-answer form
    assert extract_letter("A cat.") is None
    assert extract_letter("A red star. Option D is correct.") == "D"
    assert extract_letter("So the answer is a circle, which is option B.") == "B"  # "a" is not A
    s = next(x for x in suite.load("mmt", 200, 8) if x.check.isdigit())
    assert suite.check_answer(s, f"I think there are {number_word(int(s.check))} of them.")
    assert not suite.check_answer(s, f"I think there are {int(s.check) + 1} of them.")


_MASKED = [*COLOUR_NAMES, *(number_word(i) for i in range(21))]
_MASKED += [w for syns in SHAPE_SYNONYMS.values() for pair in syns for w in pair]
_MASK = re.compile(r"\"[^\"]*\"|\d+|\b(?:" + "|".join(_MASKED) + r")\b", re.IGNORECASE)


@pytest.mark.parametrize("family", suite.FAMILIES)
def test_wording_depends_on_content(family: str) -> None:
    samples = suite.load(family, 50, 9)
    skeletons = {_MASK.sub("#", s.reference) for s in samples}
    assert len(skeletons) > 3
    assert len({s.prompt for s in samples}) > 3
    if family in LONG:
        assert len(skeletons) >= 20
        followers: dict[str, set[str]] = {}
        for s in samples:
            toks = s.reference.lower().split()
            for a, b in zip(toks, toks[1:], strict=False):
                followers.setdefault(a, set()).add(b)
        assert max(len(v) for v in followers.values()) >= 6


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="mmt"):
        suite.load("nope", 3, 0)
    with pytest.raises(ValueError, match="describe"):
        suite.load("mmt", 0, 0)
    with pytest.raises(ValueError):
        suite.load("mmt", -2, 0)
    with pytest.raises(ValueError, match="textvqa"):
        suite.generate("all", 1)


def test_corpus() -> None:
    texts = suite.corpus(3, 0)
    assert len(texts) == 2 * 3 * len(suite.FAMILIES)
    assert all(isinstance(t, str) and t for t in texts)
    assert texts == suite.corpus(3, 0)


def test_seed_options_are_decided_by_the_image_and_letters_are_balanced() -> None:
    """``seed`` colour items: the right option's colour is painted, the other three nowhere; no
    question kind gives its letter away (each letter 10-45% of a kind's items)."""
    import collections
    import random

    from recap.suite.scene import COLOURS
    from recap.suite.seed import KINDS, LETTERS, open_form

    letters: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    checked = 0
    for item in suite.load("seed", 240, 9):
        kind = random.Random(item.seed).choice(KINDS)
        letters[kind][item.check] += 1
        assert f"{open_form(item.prompt, item.check)[1]} ({item.check})" in item.reference  # restated, then the letter
        if kind != "colour":
            continue
        pixels = collections.Counter({rgb: n for n, rgb in item.image.getcolors(224 * 224)})
        for letter in LETTERS:
            painted = pixels[COLOURS[open_form(item.prompt, letter)[1]]]
            assert (painted > 100) if letter == item.check else (painted == 0), (item.prompt, letter, painted)
        checked += 1
    assert checked > 30 and set(letters) == set(KINDS)
    for kind, counts in letters.items():
        total = sum(counts.values())
        assert all(0.10 <= counts[letter] / total <= 0.45 for letter in LETTERS), (kind, counts)
