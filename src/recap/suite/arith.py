"""``math``: MathVista-like counting and arithmetic, solved step by step.

Scene questions (subtract a group, add two groups, compare groups, count
corners) and chart questions (sum, difference, total).  The final number of
the reference is the checkable field.
"""

from __future__ import annotations

import random

from PIL import Image

from .chart import q
from .render import render_chart, render_scene
from .scene import COLOUR_NAMES, SHAPE_CORNERS, Obj, generic, random_chart, random_scene, shape_word, where
from .text import be, cap, join_and, num, pick, sentences, with_article

KINDS = ("subtract", "add", "more", "corners", "chart_sum", "chart_diff", "chart_total")


def _final(r: int, noun: str, *keys: int) -> str:
    return pick(
        (
            f"So the answer is {r}.",
            f"Therefore, the result is {r} {noun}.",
            f"The final answer is {r}.",
            f"This gives {r}.",
        ),
        *keys,
        salt=5,
    )


def _first(*keys: int) -> str:
    return pick(("First,", "To begin,", "Step one:", "Start by counting:"), *keys)


def _then(*keys: int) -> str:
    return pick(("Next,", "Then,", "After that,", "Now"), *keys, salt=2)


def _listing(objs: list[Obj], *keys: int) -> str:
    return join_and([f"one {where(o, o.ci, *keys)}" for o in objs])


def _subtract(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    while True:
        scene = random_scene(rng, 3, 6)
        by_colour = rng.random() < 0.6
        o = rng.choice(scene.objects)
        group = scene.with_colour(o.colour) if by_colour else scene.with_shape(o.shape)
        if len(group) < len(scene.objects):
            break
    t, k = len(scene.objects), len(group)
    r = t - k
    what = f"{o.colour} {generic(True, rng.randrange(4))}" if by_colour else shape_word(o.shape, True, rng.randrange(3))
    prompt = rng.choice(
        (
            f"Subtract all {what}. How many objects are left?",
            f"Remove every one of the {what}. How many shapes remain?",
            f"If all the {what} are taken away, how many objects are left?",
            f"Take away the {what}. How many items are still there?",
        )
    )
    keys = (t, k, o.ci if by_colour else o.si)
    name = f"{o.colour} ones" if by_colour else shape_word(o.shape, True, *keys)
    if by_colour:
        are_what = o.colour
    else:
        are_what = shape_word(o.shape, True, 0) if k != 1 else with_article(shape_word(o.shape, False, 0))
    s1 = pick(
        (
            f"{_first(*keys)} there are {t} objects in the picture.",
            f"Start with the total number of shapes, which is {t}.",
            f"The picture has {num(t, True)} objects in total.",
        ),
        *keys,
    )
    s2 = pick(
        (
            f"{_then(*keys)} count the {name}: there {be(k)} {k}.",
            f"Among them, {num(k, True)} {be(k)} {are_what}.",
            f"The {name} number {k}, namely {_listing(group, *keys)}.",
        ),
        *keys,
        salt=1,
    )
    s3 = pick(
        (
            f"Taking them away leaves {t} - {k} = {r}.",
            f"Now subtract: {t} - {k} = {r}.",
            f"So we compute {t} minus {k}, which gives {r}.",
        ),
        *keys,
        salt=3,
    )
    ref = sentences(s1, s2, s3, _final(r, "objects left", *keys))
    return render_scene(scene), prompt, ref, str(r)


def _add(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    while True:
        scene = random_scene(rng, 3, 6)
        shapes = sorted({o.shape for o in scene.objects})
        if len(shapes) >= 2:
            break
    s1, s2 = rng.sample(shapes, 2)
    a, b = len(scene.with_shape(s1)), len(scene.with_shape(s2))
    p1, p2 = shape_word(s1, True, rng.randrange(3)), shape_word(s2, True, rng.randrange(3))
    prompt = rng.choice(
        (
            f"How many {p1} and {p2} are there altogether?",
            f"Add the number of {p1} to the number of {p2}. What do you get?",
            f"What is the total count of {p1} and {p2} in the image?",
            f"Count the {p1} and the {p2}. How many are there in all?",
        )
    )
    i1, i2 = scene.with_shape(s1)[0].si, scene.with_shape(s2)[0].si
    keys = (a, b, i1, i2)
    w1, w2 = shape_word(s1, a != 1, *keys), shape_word(s2, b != 1, *keys)
    c1 = pick(
        (
            f"{_first(*keys)} there {be(a)} {a} {w1}.",
            f"Counting the {shape_word(s1, True, *keys)} gives {num(a, True)}.",
            f"I see {num(a, True)} {w1} in the picture.",
        ),
        *keys,
    )
    c2 = pick(
        (
            f"{_then(*keys)} there {be(b)} {b} {w2}.",
            f"The {shape_word(s2, True, *keys)} add another {num(b, True)}.",
            f"There {be(b)} also {num(b, True)} {w2}.",
        ),
        *keys,
        salt=1,
    )
    s3 = pick(
        (f"Adding them gives {a} + {b} = {a + b}.", f"Together that is {a} plus {b}, or {a + b}."),
        *keys,
        salt=3,
    )
    ref = sentences(c1, c2, s3, _final(a + b, "shapes", *keys))
    return render_scene(scene), prompt, ref, str(a + b)


def _more(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    while True:
        scene = random_scene(rng, 3, 6)
        counts = {c: len(scene.with_colour(c)) for c in COLOUR_NAMES if scene.with_colour(c)}
        pairs = [(x, y) for x in counts for y in counts if counts[x] > counts[y]]
        if pairs:
            break
    c1, c2 = rng.choice(pairs)
    a, b = counts[c1], counts[c2]
    prompt = rng.choice(
        (
            f"How many more {c1} shapes are there than {c2} shapes?",
            f"By how much does the number of {c1} objects exceed the number of {c2} objects?",
            f"Compare the {c1} and {c2} shapes. How many more {c1} ones are there?",
            f"What is the difference between the number of {c1} shapes and {c2} shapes?",
        )
    )
    keys = (a, b, COLOUR_NAMES.index(c1), COLOUR_NAMES.index(c2))
    g1, g2 = generic(a != 1, *keys), generic(b != 1, *keys)
    s1 = pick(
        (
            f"{_first(*keys)} there {be(a)} {a} {c1} {g1}.",
            f"The {c1} {generic(True, *keys)} are {_listing(scene.with_colour(c1), *keys)}, so there {be(a)} {a}.",
            f"I count {num(a, True)} {c1} {g1}.",
        ),
        *keys,
    )
    s2 = pick(
        (
            f"{_then(*keys)} there {be(b)} {b} {c2} {g2}.",
            f"Only {num(b, True)} {g2} {be(b)} {c2}.",
            f"The {c2} group has {num(b, True)}.",
        ),
        *keys,
        salt=1,
    )
    s3 = pick(
        (f"The difference is {a} - {b} = {a - b}.", f"Subtracting, {a} minus {b} equals {a - b}."),
        *keys,
        salt=3,
    )
    ref = sentences(s1, s2, s3, _final(a - b, f"more {c1} shapes", *keys))
    return render_scene(scene), prompt, ref, str(a - b)


def _corners(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    shape = rng.choice(sorted(SHAPE_CORNERS))
    scene = random_scene(rng, 2, 6)
    if not scene.with_shape(shape):
        o = scene.objects[0]
        objs = (Obj(shape, o.colour, o.size, o.row, o.col, o.x, o.y), *scene.objects[1:])
        scene = type(scene)(scene.bg, objs)
    m, k = len(scene.with_shape(shape)), SHAPE_CORNERS[shape]
    part = "points" if shape == "star" else "corners"
    pl = shape_word(shape, True, rng.randrange(3))
    prompt = rng.choice(
        (
            f"Each {shape} has {k} {part}. How many {part} do all the {pl} have together?",
            f"A {shape} has {k} {part}. Count the {part} of all the {pl} in the image.",
            f"How many {part} are there in total on the {pl}? Each one has {k}.",
        )
    )
    keys = (m, k, scene.with_shape(shape)[0].ci)
    s1 = pick(
        (
            f"{_first(*keys)} there {be(m)} {m} {shape_word(shape, m != 1, *keys)} in the picture.",
            f"I find {num(m, True)} {shape_word(shape, m != 1, *keys)}.",
            f"The image contains {num(m, True)} {shape_word(shape, m != 1, *keys)}.",
        ),
        *keys,
    )
    s2 = pick(
        (
            f"Each of them has {k} {part}." if m > 1 else f"It has {k} {part}.",
            f"Every {shape_word(shape, False, *keys)} has {num(k, True)} {part}.",
        ),
        *keys,
        salt=1,
    )
    s3 = pick(
        (f"Multiplying gives {m} x {k} = {m * k}.", f"So we need {m} times {k}, which is {m * k}."),
        *keys,
        salt=3,
    )
    ref = sentences(s1, s2, s3, _final(m * k, part, *keys))
    return render_scene(scene), prompt, ref, str(m * k)


def _chart(rng: random.Random, kind: str) -> tuple[Image.Image, str, str, str]:
    chart = random_chart(rng)
    n = len(chart.values)
    vals, labs = chart.values, chart.labels
    keys = (n, vals[0] // chart.scale, chart.top)
    reads = [f"{q(lab)} is {v}" for lab, v in zip(labs, vals, strict=True)]
    if kind == "chart_sum":
        i, j = sorted(rng.sample(range(n), 2))
        prompt = rng.choice(
            (
                f"What is the sum of {q(labs[i])} and {q(labs[j])}?",
                f"Add the values of {q(labs[i])} and {q(labs[j])}. What is the total?",
                f"What do {q(labs[i])} and {q(labs[j])} add up to?",
            )
        )
        r = vals[i] + vals[j]
        steps = [
            pick((f"{_first(*keys)} read the two bars.", "Read the chart carefully."), *keys),
            pick(
                (
                    f"{cap(reads[i])} and {reads[j]}.",
                    f"The bar for {q(labs[i])} shows {vals[i]}, and {q(labs[j])} shows {vals[j]}.",
                ),
                *keys,
                salt=1,
            ),
            pick(
                (f"Adding them gives {vals[i]} + {vals[j]} = {r}.", f"{vals[i]} plus {vals[j]} makes {r}."),
                *keys,
                salt=3,
            ),
        ]
    elif kind == "chart_diff":
        hi, lo = chart.top, chart.bottom
        prompt = rng.choice(
            (
                "What is the difference between the highest and the lowest bar?",
                "How much larger is the biggest value than the smallest value?",
                "Subtract the smallest value from the largest. What is the result?",
            )
        )
        r = vals[hi] - vals[lo]
        steps = [
            pick(
                (
                    f"{_first(*keys)} find the highest bar: {q(labs[hi])} at {vals[hi]}.",
                    f"The largest value belongs to {q(labs[hi])}, which is {vals[hi]}.",
                ),
                *keys,
            ),
            pick(
                (
                    f"{_then(*keys)} find the lowest bar: {q(labs[lo])} at {vals[lo]}.",
                    f"The smallest value is {vals[lo]}, for {q(labs[lo])}.",
                ),
                *keys,
                salt=1,
            ),
            pick(
                (f"The difference is {vals[hi]} - {vals[lo]} = {r}.", f"{vals[hi]} minus {vals[lo]} is {r}."),
                *keys,
                salt=3,
            ),
        ]
    else:
        prompt = rng.choice(
            (
                "What is the total of all the bars?",
                "Add up all the values in the chart. What is the sum?",
                "What is the sum of every bar in this chart?",
            )
        )
        r = sum(vals)
        steps = [
            pick((f"{_first(*keys)} read every bar.", f"There are {n} bars to add."), *keys),
            pick((f"{cap(join_and(reads))}.", f"The values are {join_and([str(v) for v in vals])}."), *keys, salt=1),
            pick(
                (
                    f"Adding them gives {' + '.join(str(v) for v in vals)} = {r}.",
                    f"Their sum is {' + '.join(str(v) for v in vals)}, which equals {r}.",
                ),
                *keys,
                salt=3,
            ),
        ]
    ref = sentences(*steps, _final(r, "in total" if kind != "chart_diff" else "units", *keys))
    return render_chart(chart), prompt, ref, str(r)


def generate(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    """One ``math`` item: (image, prompt, worked solution, final number)."""
    kind = rng.choice(KINDS)
    if kind.startswith("chart"):
        return _chart(rng, kind)
    return {"subtract": _subtract, "add": _add, "more": _more, "corners": _corners}[kind](rng)
