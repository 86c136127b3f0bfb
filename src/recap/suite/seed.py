"""``seed``: SEED-Bench-like four-option multiple choice about a shape scene.

The prompt lists options A-D; the reference states the letter first (in one of
several content-chosen formats) and then justifies it in a sentence or two.
"""

from __future__ import annotations

import random
import re

from PIL import Image

from .phrases import finish, tail
from .render import render_scene
from .scene import (
    BACKGROUND_NAMES,
    CELL_NAMES,
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
KINDS = ("colour", "count", "shape", "background", "largest", "position")
_OPTION_LINE = re.compile(r"^\(?([A-D])[.)]\)? (.+)$")  # the three formats of _prompt: "A. x", "(A) x", "A) x"


def _options(rng: random.Random, correct: str, pool: list[str]) -> tuple[list[str], int]:
    opts = [correct, *rng.sample([p for p in pool if p != correct], 3)]
    rng.shuffle(opts)
    return opts, opts.index(correct)


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


def _answer(letter: str, why: str, *keys: int) -> str:
    """The letter first, in one of five formats, then the justification."""
    lw = why if why.startswith("I ") else why[:1].lower() + why[1:]
    return pick(
        (
            f"{letter}. {cap(why)}",
            f"({letter}) {cap(why)}",
            f"The answer is {letter}. {cap(why)}",
            f"Option {letter} is correct: {lw}",
            f"{letter} is the right choice, because {lw}",
        ),
        *keys,
    )


def _colour(rng: random.Random) -> tuple[Scene, str, str, Obj, int]:
    while True:
        scene = random_scene(rng, 1, 5)
        uniq = scene.unique("shape")
        if uniq:
            break
    o = rng.choice(uniq)
    opts, k = _options(rng, o.colour, list(COLOUR_NAMES))
    q = rng.choice(("What colour is the {}?", "Which colour does the {} have?", "The {} in the image is which colour?"))
    prompt = _prompt(rng, q.format(shape_word(o.shape, False, rng.randrange(3))), opts)
    sh = shape_word(o.shape, False, o.ci, o.zi)
    others = [x for x in opts if x != o.colour]
    why = pick(
        (
            f"The {sh} {where(o, o.ci)} is painted {o.colour}, and none of the other listed colours matches it.",
            f"Looking at the {sh}, its surface is plain {o.colour}, so {others[0]} and {others[1]} do not fit.",
            f"{cap(where(o, o.si))} there is {with_article(size_word(o.size, o.ci))} {sh}, clearly {o.colour}.",
            f"Only one {sh} appears in the picture, and its colour is {o.colour} rather than {others[2]}.",
        ),
        o.ci,
        o.si,
    )
    return scene, prompt, why, o, k


def _count(rng: random.Random) -> tuple[Scene, str, str, Obj, int]:
    scene = random_scene(rng, 2, 6)
    o = rng.choice(scene.objects)
    group = scene.with_shape(o.shape)
    n = len(group)
    start = rng.randint(max(0, n - 3), n)
    opts = [str(i) for i in range(start, start + 4)]
    k = opts.index(str(n))
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


def _shape(rng: random.Random) -> tuple[Scene, str, str, Obj, int]:
    scene = random_scene(rng, 1, 6)
    o = rng.choice(scene.objects)
    opts, k = _options(rng, o.shape, list(SHAPES))
    q = rng.choice(("Which shape is {}?", "What kind of shape is drawn {}?", "What shape can you see {}?"))
    prompt = _prompt(rng, q.format(where(o, rng.randrange(3))), opts)
    others = [x for x in opts if x != o.shape]
    why = pick(
        (
            f"The shape {where(o, o.ci)} is {describe_obj(o, o.si, o.ci)}, not {with_article(others[0])}.",
            f"{cap(where(o, o.si))} the picture shows {describe_obj(o, o.ci, size=False)}, so the others are wrong.",
            f"Its outline has the form of {with_article(o.shape)}, and it is filled with {o.colour}.",
            f"The {o.colour} figure at that spot is {with_article(o.shape)} rather than {with_article(others[1])}.",
        ),
        o.si,
        o.cell,
    )
    return scene, prompt, why, o, k


def _background(rng: random.Random) -> tuple[Scene, str, str, Obj, int]:
    scene = random_scene(rng, 1, 6)
    opts, k = _options(rng, scene.bg, list(BACKGROUND_NAMES))
    q = rng.choice(
        (
            "What is the colour of the background?",
            "Which colour fills the background?",
            "The background is which colour?",
        )
    )
    prompt = _prompt(rng, q, opts)
    o = scene.objects[0]
    n = len(scene.objects)
    why = pick(
        (
            f"The {generic(n != 1, n)} are drawn on a flat {scene.bg} background that fills the rest of the picture.",
            f"Behind the {o.colour} {shape_word(o.shape, False, o.ci)} the whole canvas is plain {scene.bg}.",
            f"Every empty area of the image shows the same {scene.bg} colour.",
            f"The picture has a {scene.bg} background, and no other part of it is {opts[(k + 1) % 4]}.",
        ),
        scene.bi,
        n,
    )
    return scene, prompt, why, o, k


def _largest(rng: random.Random) -> tuple[Scene, str, str, Obj, int]:
    scene = random_scene(rng, 2, 5)
    big = rng.randrange(len(scene.objects))
    objs = tuple(
        Obj(o.shape, o.colour, "large" if i == big else "small", o.row, o.col, o.x, o.y)
        for i, o in enumerate(scene.objects)
    )
    scene = Scene(scene.bg, objs)
    o = objs[big]
    names = {f"the {x.colour} {x.shape}" for x in objs}
    pool = sorted(names | {f"the {c} {s}" for c in COLOUR_NAMES for s in SHAPES})
    correct = f"the {o.colour} {o.shape}"
    present = sorted(names - {correct})
    rest = rng.sample([p for p in pool if p not in names], 3)
    distract = (present + rest)[:3]
    opts = [correct, *distract]
    rng.shuffle(opts)
    k = opts.index(correct)
    q = rng.choice(
        ("Which object is the largest?", "Which shape is the biggest in the image?", "What is the largest item?")
    )
    prompt = _prompt(rng, q, opts)
    n = len(objs)
    sh = shape_word(o.shape, False, o.ci, n)
    why = pick(
        (
            f"The {o.colour} {sh} {where(o, o.si)} is clearly larger than the other {num(n - 1, True)} shapes.",
            f"Every other {generic(False, o.ci)} in the picture is small, while the {o.colour} {sh} is big.",
            f"Comparing sizes, the {o.colour} {sh} takes up the most room, and the rest are little.",
            f"Only the {o.colour} {sh} is drawn large; the remaining {generic(True, n)} are small.",
        ),
        o.ci,
        n,
        o.si,
    )
    return scene, prompt, why, o, k


def _position(rng: random.Random) -> tuple[Scene, str, str, Obj, int]:
    while True:
        scene = random_scene(rng, 1, 5)
        combos = [(p.shape, p.colour) for p in scene.objects]
        cands = [o for o in scene.objects if combos.count((o.shape, o.colour)) == 1]
        if cands:
            break
    o = rng.choice(cands)
    opts, k = _options(rng, CELL_NAMES[o.cell], list(CELL_NAMES))
    q = rng.choice(("Where is the {} located?", "In which part of the image is the {}?", "Where can you find the {}?"))
    prompt = _prompt(rng, q.format(f"{o.colour} {shape_word(o.shape, False, rng.randrange(3))}"), opts)
    sh = f"{o.colour} {shape_word(o.shape, False, o.cell, o.ci)}"
    why = pick(
        (
            f"The {sh} sits {where(o, o.ci)}, which matches this option.",
            f"Looking at the picture, the {sh} is drawn {where(o, o.si)} and nowhere else.",
            f"The {size_word(o.size, o.ci)} {sh} appears {where(o, o.zi)} of the {scene.bg} canvas.",
            f"Of all the {generic(True, o.cell)}, the {sh} is the one placed {where(o, o.cell)}.",
        ),
        o.cell,
        o.ci,
    )
    return scene, prompt, why, o, k


_MAKERS = {
    "colour": _colour,
    "count": _count,
    "shape": _shape,
    "background": _background,
    "largest": _largest,
    "position": _position,
}


def generate(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    """One ``seed`` item: (image, prompt, reference, letter)."""
    kind = rng.choice(KINDS)
    scene, prompt, why, o, k = _MAKERS[kind](rng)
    letter = LETTERS[k]
    ref = finish([_answer(letter, why, o.ci, k, o.si)], tail(scene, o, o.cell, k), min_words=24)
    return render_scene(scene), prompt, ref, letter
