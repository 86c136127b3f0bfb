"""``seed``: SEED-Bench-like four-option multiple choice about a shape scene.

The prompt lists options A-D; the reference justifies in a sentence or two, then
restates the chosen option and gives its letter ("... So the answer is 2 (C).").
Question kinds (SEED-Bench's instance identity, attributes and counting): which listed
colour appears, which listed shape appears, how many of one shape, how many in all.
Kinds that bind two attributes of one object in a multi-object scene (the colour of a
named shape, the shape at a named place, the largest object, the place of a coloured
shape) and the four pale backgrounds were asked until 2026-12-01 (commit 62d2b8b) and
dropped: the 5M-parameter embedded models stayed at chance on them through nine phases.
"""

from __future__ import annotations

import random
import re

from PIL import Image

from .phrases import finish, tail
from .render import render_scene
from .scene import (
    COLOUR_NAMES,
    SHAPES,
    Obj,
    Scene,
    describe_obj,
    generic,
    random_scene,
    shape_word,
    size_word,
    where,
)
from .text import be, cap, join_and, num, pick, with_article

LETTERS = ("A", "B", "C", "D")
KINDS = ("colour", "shape", "count", "total")
_OPTION_LINE = re.compile(r"^\(?([A-D])[.)]\)? (.+)$")  # the three formats of _prompt: "A. x", "(A) x", "A) x"


def _options(rng: random.Random, correct: str, pool: list[str]) -> tuple[list[str], int]:
    opts = [correct, *rng.sample([p for p in pool if p != correct], 3)]
    rng.shuffle(opts)
    return opts, opts.index(correct)


def _count_options(rng: random.Random, n: int, lowest: int) -> tuple[list[str], int]:
    """``n`` and three other counts within 3 of it (none below ``lowest``), in random order, so
    that the right letter does not follow from the count's size."""
    near = [i for i in range(max(lowest, n - 3), n + 4) if i != n]
    opts = [str(n), *map(str, rng.sample(near, 3))]
    rng.shuffle(opts)
    return opts, opts.index(str(n))


def _prompt(rng: random.Random, question: str, opts: list[str]) -> str:
    fmt = rng.choice(("{}. {}", "({}) {}", "{}) {}"))
    lines = [fmt.format(letter, o) for letter, o in zip(LETTERS, opts, strict=True)]
    tail_line = rng.choice(
        (
            "Answer with the letter of the correct option and explain briefly.",
            "Choose the correct option.",
            "Pick one letter and give a short reason.",
            "Which option is right?",
            "",
        )
    )
    return "\n".join([question, *lines, *([tail_line] if tail_line else [])])


def open_form(prompt: str, letter: str) -> tuple[str, str]:
    """A ``seed`` item without its options: (the question alone, the text of option ``letter``)."""
    question, *rest = prompt.split("\n")
    options = dict(m.groups() for m in map(_OPTION_LINE.match, rest) if m)
    if sorted(options) != list(LETTERS) or letter not in options:
        raise ValueError(f"not a four-option seed prompt with option {letter!r}: {prompt!r}")
    return question, options[letter]


LOOKUP_QUESTIONS = (
    "Which option says {}?",
    "Which letter is {}?",
    "Which option is {}?",
    "Which letter goes with {}?",
)


def lookup_form(prompt: str, letter: str, wording: int = 0) -> tuple[str, str]:
    """A ``seed`` item as a pure lookup: its options under a question that names option ``letter``'s
    text (wording ``wording`` of ``LOOKUP_QUESTIONS``); the answer is ``letter``. This trains the
    step from an option's text to its letter, without the scene."""
    _, text = open_form(prompt, letter)
    options = prompt.split("\n")[1:5]
    question = LOOKUP_QUESTIONS[wording % len(LOOKUP_QUESTIONS)].format(text)
    return "\n".join([question, *options]), letter


def answer_sentence(option: str, letter: str, *keys: int) -> str:
    """The sentence that ends a ``seed`` answer: the chosen option's text, then its letter
    (one of four wordings, picked by ``keys``)."""
    return pick(
        (
            f"So the answer is {option} ({letter}).",
            f"The right option is therefore {option} ({letter}).",
            f"That matches the option {option} ({letter}).",
            f"Hence {option} ({letter}) is correct.",
        ),
        *keys,
    )


def _answer(letter: str, option: str, why: str, *keys: int) -> str:
    """The justification first, then ``answer_sentence``: the letter is looked up from an option
    already named, not perceived in one step."""
    return f"{cap(why)} {answer_sentence(option, letter, *keys)}"


def _colour(rng: random.Random) -> tuple[Scene, str, str, Obj, int]:
    """Which listed colour appears in the picture (three options appear nowhere)."""
    scene = random_scene(rng, 1, 4)
    o = rng.choice(scene.objects)
    present = {x.colour for x in scene.objects}
    opts = [o.colour, *rng.sample([c for c in COLOUR_NAMES if c not in present], 3)]
    rng.shuffle(opts)
    k = opts.index(o.colour)
    q = rng.choice(
        (
            "Which colour appears in the image?",
            "Which of these colours can you see in the picture?",
            "One of the shapes has which colour?",
        )
    )
    prompt = _prompt(rng, q, opts)
    sh = shape_word(o.shape, False, o.ci, o.zi)
    others = [x for x in opts if x != o.colour]
    why = pick(
        (
            f"The {sh} {where(o, o.ci)} is painted {o.colour}, and no shape is {others[0]} or {others[1]}.",
            f"I can see {with_article(size_word(o.size, o.ci))} {o.colour} {sh} {where(o, o.si)}.",
            f"{cap(where(o, o.si))} there is {with_article(o.colour)} {sh}, while {others[1]} does not appear at all.",
            f"Only {o.colour} of these colours is used, on the {sh} {where(o, o.cell)}.",
        ),
        o.ci,
        o.si,
    )
    return scene, prompt, why, o, k


def _shape(rng: random.Random) -> tuple[Scene, str, str, Obj, int]:
    """Which listed shape is drawn in the picture (three options are drawn nowhere)."""
    while True:
        scene = random_scene(rng, 1, 4)
        present = {x.shape for x in scene.objects}
        if len(present) <= len(SHAPES) - 3:
            break
    o = rng.choice(scene.objects)
    opts = [o.shape, *rng.sample([s for s in SHAPES if s not in present], 3)]
    rng.shuffle(opts)
    k = opts.index(o.shape)
    q = rng.choice(
        (
            "Which shape appears in the image?",
            "Which of these shapes is drawn in the picture?",
            "What kind of shape can you see?",
        )
    )
    prompt = _prompt(rng, q, opts)
    others = [x for x in opts if x != o.shape]
    why = pick(
        (
            f"The picture shows {describe_obj(o, o.si, o.ci)} {where(o, o.ci)}, and there is no {others[0]} anywhere.",
            f"{cap(where(o, o.si))} I can see {describe_obj(o, o.ci, size=False)}, so the other shapes are wrong.",
            f"One figure has the outline of {with_article(o.shape)}, filled with {o.colour}; no {others[1]} is drawn.",
            f"The {o.colour} figure {where(o, o.cell)} is {with_article(o.shape)}, unlike {with_article(others[2])}.",
        ),
        o.si,
        o.cell,
    )
    return scene, prompt, why, o, k


def _count(rng: random.Random) -> tuple[Scene, str, str, Obj, int]:
    """How many shapes of one kind there are."""
    scene = random_scene(rng, 2, 6)
    o = rng.choice(scene.objects)
    group = scene.with_shape(o.shape)
    n = len(group)
    opts, k = _count_options(rng, n, 0)
    q = rng.choice(("How many {} are in the image?", "How many {} can be seen?", "What is the number of {} shown?"))
    prompt = _prompt(rng, q.format(shape_word(o.shape, True, rng.randrange(3))), opts)
    pl = shape_word(o.shape, n != 1, n, o.ci)
    items = join_and([f"{describe_obj(g, g.ci, n, size=False)} {where(g, g.cell)}" for g in group])
    why = pick(
        (
            f"I count {num(n, True)} {pl}: {items}.",
            f"There {be(n)} exactly {num(n, False)} {pl} in the scene, namely {items}.",
            f"Counting every {shape_word(o.shape, False, n)} gives {num(n, True)}, since the picture shows {items}.",
            f"The image contains {num(n, True)} {pl} in total, which are {items}.",
        ),
        n,
        o.si,
    )
    return scene, prompt, why, o, k


def _total(rng: random.Random) -> tuple[Scene, str, str, Obj, int]:
    """How many shapes the picture holds in all."""
    scene = random_scene(rng, 1, 6)
    n = len(scene.objects)
    o = scene.objects[0]
    opts, k = _count_options(rng, n, 1)
    q = rng.choice(
        (
            "How many shapes are in the image?",
            "How many objects can be seen in total?",
            "What is the number of figures shown?",
        )
    )
    prompt = _prompt(rng, q, opts)
    kinds = join_and(sorted({shape_word(x.shape, False, 0) for x in scene.objects}))
    why = pick(
        (
            f"I count {num(n, True)} {generic(n != 1, n)} on the {scene.bg} background.",
            f"There {be(n)} exactly {num(n, False)} {generic(n != 1, o.ci)} in the picture, of these kinds: {kinds}.",
            f"The scene holds {num(n, True)} {generic(n != 1, n)}, first {describe_obj(o, o.ci)} {where(o, o.si)}.",
            f"Counting every figure gives {num(n, True)}, and the shapes used are {kinds}.",
        ),
        n,
        o.si,
    )
    return scene, prompt, why, o, k


_MAKERS = {"colour": _colour, "shape": _shape, "count": _count, "total": _total}


def generate(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    """One ``seed`` item: (image, prompt, reference, letter)."""
    kind = rng.choice(KINDS)
    scene, prompt, why, o, k = _MAKERS[kind](rng)
    letter = LETTERS[k]
    option = open_form(prompt, letter)[1]
    ref = finish([_answer(letter, option, why, o.ci, k, o.si)], tail(scene, o, o.cell, k), min_words=24)
    return render_scene(scene), prompt, ref, letter
