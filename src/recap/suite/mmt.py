"""``mmt``: MMT-Bench-like mixed perception (count, colour, side, size, shape).

Answers are one to three full sentences.  Every wording slot is keyed by scene
content (see :func:`recap.suite.text.pick`); only the question kind, the scene
and the prompt phrasing are random draws.
"""

from __future__ import annotations

import random

from PIL import Image

from .phrases import finish, tail
from .render import render_scene
from .scene import (
    ROW_WORDS,
    SHAPES,
    Scene,
    describe_obj,
    generic,
    random_scene,
    shape_word,
    size_word,
    where,
)
from .text import be, cap, join_and, num, pick, with_article

KINDS = ("count_shape", "count_colour", "count_total", "colour_of", "side_of", "size_of", "shape_at")


def _count_shape(rng: random.Random) -> tuple[Scene, str, str, str]:
    scene = random_scene(rng, 2, 6)
    shape = rng.choice(scene.objects).shape
    group = scene.with_shape(shape)
    n, t = len(group), len(scene.objects)
    si = group[0].si
    q_pl = shape_word(shape, True, rng.randrange(3))
    prompt = rng.choice(
        (
            f"How many {q_pl} are there in the image?",
            f"Count the {q_pl} in this picture.",
            f"How many {q_pl} can you see?",
            f"What is the number of {q_pl} shown here?",
            f"Tell me how many {q_pl} appear in the image.",
            f"How many {q_pl} does this picture contain?",
        )
    )
    noun = shape_word(shape, n != 1, n, group[0].ci)
    nw = num(n, pick((True, True, False), n, si))
    lead = pick(
        (
            f"There {be(n)} {nw} {noun} in the image.",
            f"I can count {nw} {noun} in this picture.",
            f"The picture contains {nw} {noun}.",
            f"{cap(nw)} {noun} {be(n)} visible in the image.",
            f"Counting carefully, I find {nw} {noun}.",
            f"The answer is {nw}, because the image shows {nw} {noun}.",
        ),
        n,
        si,
        group[0].ci,
    )
    k = group[0].ci + n
    if n == 1:
        o = group[0]
        detail = pick(
            (
                f"It is {o.colour} and sits {where(o, k)}.",
                f"It is {describe_obj(o, k, o.si, size=True)} placed {where(o, k)}.",
                f"This single one is {size_word(o.size, k)} and {o.colour}, found {where(o, o.ci)}.",
            ),
            o.ci,
            o.zi,
        )
    else:
        items = [f"{describe_obj(o, o.ci, k)} {where(o, o.cell)}" for o in group]
        lead_in = pick(
            ("They are", "Going from top to bottom, there is", "Specifically, the picture has", "Among them are"),
            si,
            n,
        )
        detail = f"{lead_in} {join_and(items)}."
    others = t - n
    extra = []
    if others:
        ow = num(others, True)
        extra.append(
            pick(
                (
                    f"Besides these, there {be(others)} {ow} other {generic(others != 1, t)}, {t} in total.",
                    f"The remaining {ow} {generic(others != 1, si)} {be(others)} not {shape_word(shape, True, 0)}.",
                    f"The other {generic(others != 1, t, si)} in the picture {be(others)} different shapes.",
                ),
                t,
                si,
            )
        )
    return scene, prompt, finish([lead, detail], extra + tail(scene, None, t)), str(n)


def _count_colour(rng: random.Random) -> tuple[Scene, str, str, str]:
    scene = random_scene(rng, 2, 6)
    colour = rng.choice(scene.objects).colour
    group = scene.with_colour(colour)
    n, t = len(group), len(scene.objects)
    ci = group[0].ci
    prompt = rng.choice(
        (
            f"How many {colour} shapes are in the image?",
            f"How many {colour} objects can you see?",
            f"Count the {colour} items in this picture.",
            f"What is the number of {colour} shapes here?",
            f"How many things in the picture are {colour}?",
        )
    )
    noun = generic(n != 1, ci, n)
    nw = num(n, pick((True, False, True), ci, n))
    lead = pick(
        (
            f"There {be(n)} {nw} {colour} {noun}.",
            f"I can see {nw} {colour} {noun} in the image.",
            f"The image has {nw} {noun} coloured {colour}.",
            f"{cap(nw)} of the {generic(True, ci)} {be(n)} {colour}.",
            f"Exactly {nw} {noun} in this picture {be(n)} {colour}.",
        ),
        ci,
        n,
        group[0].si,
    )
    k = ci + 2 * n
    if n == 1:
        o = group[0]
        detail = pick(
            (
                f"It is {describe_obj(o, k, colour=False)} {where(o, o.si)}.",
                f"That one is {describe_obj(o, o.si, colour=False)}, and it sits {where(o, k)}.",
                f"You can find it {where(o, k)}, where it forms {describe_obj(o, o.zi, colour=False)}.",
            ),
            o.si,
            o.cell,
        )
    else:
        items = [f"{describe_obj(o, o.si, k, colour=False)} {where(o, o.cell, k)}" for o in group]
        listed = join_and(items)
        detail = pick((f"They are {listed}.", f"The {colour} ones are {listed}.", f"In detail: {listed}."), ci, n)
    rest = sorted({o.colour for o in scene.objects if o.colour != colour})
    extra = []
    if rest:
        extra.append(
            pick(
                (
                    f"The other {generic(True, t)} are {join_and(rest, 'or')}.",
                    f"The rest of the picture uses {join_and(rest)}.",
                    f"No other {generic(False, ci)} shares this colour; the others are {join_and(rest)}.",
                ),
                ci,
                len(rest),
            )
        )
    return scene, prompt, finish([lead, detail], extra + tail(scene, None, t)), str(n)


def _count_total(rng: random.Random) -> tuple[Scene, str, str, str]:
    scene = random_scene(rng, 1, 6)
    t = len(scene.objects)
    f = scene.objects[0]
    prompt = rng.choice(
        (
            "How many objects are there in total?",
            "How many shapes are in this picture?",
            "Count all the shapes in the image.",
            "How many figures can you see altogether?",
            "What is the total number of objects shown?",
        )
    )
    noun = generic(t != 1, t, f.ci)
    tw = num(t, pick((True, False), t, f.si))
    lead = pick(
        (
            f"There {be(t)} {tw} {noun} in total.",
            f"I count {tw} {noun} altogether.",
            f"The picture shows {tw} {noun}.",
            f"{cap(tw)} {noun} {be(t)} drawn on the {scene.bg} background.",
            f"Altogether there {be(t)} {tw} {noun} in this image.",
        ),
        t,
        f.ci,
        scene.bi,
    )
    if t == 1:
        detail = f"It is {describe_obj(f, f.ci, f.si)} {where(f, f.cell)}."
    elif pick((0, 1), t, f.si):
        shapes = sorted({o.shape for o in scene.objects}, key=lambda s: (-len(scene.with_shape(s)), SHAPES.index(s)))
        counts = [len(scene.with_shape(s)) for s in shapes]
        parts = [f"{num(c, True)} {shape_word(s, c != 1, t)}" for s, c in zip(shapes, counts, strict=True)]
        detail = pick(("By shape, there {} {}.", "Grouped by shape, the image has {1}."), t, f.ci).format(
            be(len(scene.with_shape(shapes[0]))), join_and(parts)
        )
    else:
        items = [describe_obj(o, o.ci, t) for o in scene.objects]
        listed = join_and(items)
        detail = pick(
            (f"They are {listed}.", f"Reading from the top, I see {listed}.", f"The list is {listed}."), f.ci, t
        )
    return scene, prompt, finish([lead, detail], tail(scene, f, t, f.si)), str(t)


def _colour_of(rng: random.Random) -> tuple[Scene, str, str, str]:
    while True:
        scene = random_scene(rng, 1, 5)
        by_shape = scene.unique("shape")
        if by_shape:
            break
    o = rng.choice(by_shape)
    by_pos = rng.random() < 0.4
    q_shape = shape_word(o.shape, False, rng.randrange(3))
    ref = f"shape {where(o, rng.randrange(3))}" if by_pos else q_shape
    prompt = rng.choice(
        (
            f"What colour is the {ref}?",
            f"Which colour does the {ref} have?",
            f"What is the colour of the {ref} in this image?",
            f"Tell me the colour of the {ref}.",
            f"What color is the {ref}?",
        )
    )
    sh = shape_word(o.shape, False, o.ci, o.cell)
    lead = pick(
        (
            f"The {sh} is {o.colour}.",
            f"It is {o.colour}: the {sh} {where(o, o.ci)} is painted {o.colour}.",
            f"The {sh} {where(o, o.si)} has a {o.colour} colour.",
            f"{cap(o.colour)} is the colour of the {sh}.",
            f"That {sh} is coloured {o.colour}.",
            f"The colour of the {sh} is {o.colour}.",
        ),
        o.ci,
        o.si,
        int(by_pos),
    )
    size = pick(
        (
            f"It is one of the {'larger' if o.zi else 'smaller'} shapes in the picture.",
            f"It is drawn fairly {size_word(o.size, o.ci)} {where(o, o.cell, o.zi)}.",
            f"The {size_word(o.size, o.si)} shape stands out against the {scene.bg} background.",
        ),
        o.zi,
        o.cell,
    )
    return scene, prompt, finish([lead, size], tail(scene, o, o.ci + o.cell)), o.colour


def _side_of(rng: random.Random) -> tuple[Scene, str, str, str]:
    while True:
        scene = random_scene(rng, 1, 5)
        cands = [
            o
            for o in scene.objects
            if o.col != 1 and sum(p.shape == o.shape and p.colour == o.colour for p in scene.objects) == 1
        ]
        if cands:
            break
    o = rng.choice(cands)
    side = "left" if o.col == 0 else "right"
    q = f"{o.colour} {shape_word(o.shape, False, rng.randrange(3))}"
    prompt = rng.choice(
        (
            f"Is the {q} on the left or the right side of the image?",
            f"On which side is the {q}, left or right?",
            f"Which half of the picture contains the {q}: left or right?",
            f"Where is the {q}, on the left or on the right?",
        )
    )
    sh = f"{o.colour} {shape_word(o.shape, False, o.ci, o.row)}"
    lead = pick(
        (
            f"The {sh} is on the {side} side of the image.",
            f"It is on the {side}.",
            f"You can find the {sh} in the {side} half of the picture.",
            f"The {sh} sits toward the {side} edge.",
            f"Look to the {side}: that is where the {sh} is.",
        ),
        o.ci,
        o.row,
        o.si,
    )
    vert = pick(
        (
            f"More precisely, it is {ROW_WORDS[o.row]}.",
            f"Vertically, it is placed {ROW_WORDS[o.row]} of the picture.",
            f"It is {size_word(o.size, o.ci)} and sits {ROW_WORDS[o.row]}.",
        ),
        o.row,
        o.zi,
        o.ci,
    )
    return scene, prompt, finish([lead, vert], tail(scene, o, o.si + o.row)), side


def _size_of(rng: random.Random) -> tuple[Scene, str, str, str]:
    while True:
        scene = random_scene(rng, 2, 6)
        cands = [
            o for o in scene.objects if sum(p.shape == o.shape and p.colour == o.colour for p in scene.objects) == 1
        ]
        if cands:
            break
    o = rng.choice(cands)
    q = f"{o.colour} {shape_word(o.shape, False, rng.randrange(3))}"
    prompt = rng.choice(
        (
            f"Is the {q} large or small?",
            f"How big is the {q}, large or small?",
            f"Would you describe the {q} as big or small?",
            f"Is the {q} one of the large shapes or a small one?",
        )
    )
    sz = size_word(o.size, o.ci, o.si)
    sh = f"{o.colour} {shape_word(o.shape, False, o.si, o.zi)}"
    lead = pick(
        (
            f"The {sh} is {sz}.",
            f"It is a {sz} one.",
            f"That {sh} is fairly {sz}.",
            f"The {sh} looks {sz} compared with the others.",
            f"I would call the {sh} {sz}.",
        ),
        o.si,
        o.ci,
        o.zi,
    )
    big = sum(p.zi for p in scene.objects)
    small = len(scene.objects) - big
    tw, bw, sw = num(len(scene.objects), True), num(big, True), num(small, True)
    room = "fills much of its corner" if o.zi else "leaves a lot of empty space around it"
    spot = "Its outline is wide and easy to spot" if o.zi else "It takes up only a little room"
    comp = pick(
        (
            f"Of the {tw} shapes, {bw} {be(big)} large and {sw} {be(small)} small.",
            f"It sits {where(o, o.ci)} and {room}.",
            f"{spot} {where(o, o.si)}.",
        ),
        o.zi,
        big,
        o.cell,
    )
    return scene, prompt, finish([lead, comp], tail(scene, o, o.cell)), o.size


def _shape_at(rng: random.Random) -> tuple[Scene, str, str, str]:
    scene = random_scene(rng, 1, 6)
    o = rng.choice(scene.objects)
    prompt = rng.choice(
        (
            f"Which shape is {where(o, rng.randrange(3))}?",
            f"What kind of shape can be seen {where(o, rng.randrange(3))}?",
            f"What shape is drawn {where(o, rng.randrange(3))}?",
            f"Name the shape located {where(o, rng.randrange(3))}.",
        )
    )
    sh = shape_word(o.shape, False, o.ci, o.zi)
    sz = size_word(o.size, o.ci)
    lead = pick(
        (
            f"The shape {where(o, o.si)} is {with_article(f'{o.colour} {sh}')}.",
            f"It is {with_article(f'{sz} {o.colour} {sh}')}.",
            f"There you can see {with_article(sh)}, coloured {o.colour}.",
            f"That spot holds {with_article(sh)} in {o.colour}.",
            f"{cap(with_article(f'{sz} {sh}'))} is drawn there, and it is {o.colour}.",
        ),
        o.si,
        o.ci,
        o.cell,
    )
    return scene, prompt, finish([lead], tail(scene, o, o.ci, o.si)), o.shape


_MAKERS = {
    "count_shape": _count_shape,
    "count_colour": _count_colour,
    "count_total": _count_total,
    "colour_of": _colour_of,
    "side_of": _side_of,
    "size_of": _size_of,
    "shape_at": _shape_at,
}


def generate(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    """One ``mmt`` item: (image, prompt, reference, check)."""
    kind = rng.choice(KINDS)
    scene, prompt, ref, check = _MAKERS[kind](rng)
    return render_scene(scene), prompt, ref, check
