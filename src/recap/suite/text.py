"""Wording helpers: content-keyed choice, numbers, plurals, lists and parsing.

The central helper is :func:`pick`: it selects one of several phrasings from
small integer *content keys* (colour index, count, shape index, ...) with a
fixed arithmetic mix, so the wording of an answer is a deterministic function
of what the image shows rather than of a separate random draw.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

_PRIMES = (1, 3, 7, 11, 13, 17, 19, 23)


def pick(options: Sequence[T], *keys: int, salt: int = 0) -> T:
    """Choose ``options[(salt + sum(p_i * key_i)) % len(options)]``.

    Each call site names the content features that drive its choice, so a
    model can learn the wording from the image (few features per slot).
    """
    if not options:
        raise ValueError("pick() needs at least one option")
    acc = salt
    for p, k in zip(_PRIMES, keys, strict=False):
        acc += p * int(k)
    return options[acc % len(options)]


# --------------------------------------------------------------------------- numbers

_ONES = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
)
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


def number_word(n: int) -> str:
    """English words for 0 <= n <= 99 (``21`` -> ``"twenty-one"``)."""
    if not 0 <= n <= 99:
        return str(n)
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] if ones == 0 else f"{_TENS[tens]}-{_ONES[ones]}"


def num(n: int, words: bool) -> str:
    """``n`` written as a word (``words=True``) or as digits."""
    return number_word(n) if words else str(n)


_WORD_VALUES = {w: i for i, w in enumerate(_ONES)}
_WORD_VALUES.update({w: 10 * i for i, w in enumerate(_TENS) if w})
_NUM_ALTS = "|".join(sorted(_WORD_VALUES, key=len, reverse=True))
_NUM_RE = re.compile(rf"\b(\d+|(?:{_NUM_ALTS})(?:-(?:{'|'.join(_ONES[1:10])}))?)\b", re.IGNORECASE)


def find_numbers(text: str) -> list[int]:
    """All numbers (digits or English words up to 99) in order of appearance."""
    out = []
    for m in _NUM_RE.finditer(text):
        tok = m.group(1).lower()
        if tok.isdigit():
            out.append(int(tok))
            continue
        head, _, tail = tok.partition("-")
        out.append(_WORD_VALUES[head] + (_WORD_VALUES[tail] if tail else 0))
    return out


# --------------------------------------------------------------------------- grammar


def cap(s: str) -> str:
    """Upper-case the first character only."""
    return s[:1].upper() + s[1:]


def article(word: str) -> str:
    """``"a"`` or ``"an"`` for the following word."""
    w = word.lower()
    return "an" if w[:1] in "aeiou" and not w.startswith(("one", "uni", "use")) else "a"


def with_article(phrase: str) -> str:
    """Prefix a noun phrase with its indefinite article."""
    return f"{article(phrase)} {phrase}"


def join_and(items: Sequence[str], conj: str = "and") -> str:
    """``["a", "b", "c"]`` -> ``"a, b and c"``."""
    items = list(items)
    if not items:
        return ""
    if len(items) == 1:
        return items[0]
    return f"{', '.join(items[:-1])} {conj} {items[-1]}"


def be(n: int) -> str:
    """``"is"`` for one, ``"are"`` otherwise."""
    return "is" if n == 1 else "are"


def words(text: str) -> list[str]:
    """Whitespace-separated words with surrounding punctuation stripped."""
    out = []
    for tok in text.split():
        tok = tok.strip(".,;:!?\"'()")
        if tok:
            out.append(tok)
    return out


def word_count(text: str) -> int:
    """Number of words in ``text``."""
    return len(words(text))


def sentences(*parts: str) -> str:
    """Join non-empty sentence fragments with single spaces."""
    return " ".join(p.strip() for p in parts if p and p.strip())


# --------------------------------------------------------------------------- parsing


def lexicon_regex(phrases: Sequence[str]) -> re.Pattern[str]:
    """A case-insensitive whole-word regex over phrases, longest first."""
    alts = sorted(set(phrases), key=lambda a: (-len(a), a))
    return re.compile(r"\b(" + "|".join(re.escape(a) for a in alts) + r")\b", re.IGNORECASE)


def first_quoted(text: str) -> str | None:
    """Contents of the first ``"..."`` segment, or ``None``."""
    m = re.search(r"[\"\u201c]([^\"\u201d]{1,40})[\"\u201d]", text)
    return m.group(1).strip() if m else None


def norm(s: str) -> str:
    """Lower-case, collapse spaces, strip punctuation at the ends."""
    return " ".join(s.lower().split()).strip(".,;:!?'\" ")


# --------------------------------------------------------------------------- synonyms

LECTURE_SYNONYMS: dict[str, tuple[str, ...]] = {
    "object": ("object", "item", "thing"),
    "objects": ("objects", "items", "things"),
    "usually": ("usually", "often", "normally"),
    "matter": ("matter", "material", "stuff"),
    "strongest": ("strongest", "most powerful"),
    "invisible": ("invisible", "unseen", "hidden"),
    "small": ("small", "little"),
    "bright": ("bright", "sunny", "light"),
    "lower": ("lower", "further down"),
    "often": ("often", "usually", "sometimes"),
    "tells": ("tells", "describes", "measures"),
    "moves": ("moves", "goes"),
    "spins": ("spins", "turns", "rotates"),
    "everything": ("everything", "anything", "each object"),
    "even": ("even", "still"),
}
_SYN_RE = re.compile(r"\b(" + "|".join(LECTURE_SYNONYMS) + r")\b")


def vary_words(text: str, *keys: int) -> str:
    """Swap listed words for synonyms, each occurrence chosen from ``keys`` and its position."""
    count = [0]

    def sub(m: re.Match[str]) -> str:
        count[0] += 1
        return pick(LECTURE_SYNONYMS[m.group(1)], *keys, salt=5 * count[0] + len(m.group(1)))

    return fix_articles(_SYN_RE.sub(sub, text))


_ART_RE = re.compile(r"\b(an?|An?) (?!is\b)([A-Za-z][\w-]*)")


def fix_articles(text: str) -> str:
    """Make ``a``/``an`` agree with the following word (``"A is ..."`` option letters are left alone)."""

    def sub(m: re.Match[str]) -> str:
        art = article(m.group(2))
        return f"{cap(art) if m.group(1)[0] == 'A' else art} {m.group(2)}"

    return _ART_RE.sub(sub, text)
