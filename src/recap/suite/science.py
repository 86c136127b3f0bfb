"""``science``: ScienceQA-like questions with a short lecture, then the answer.

Kinds: magnets (attract/repel), floating (float/sink), balance scale (colour
of the heavier object) and sky (day/night).  The reference is lecture ->
observation -> answer; the checkable field is the *last* answer word.
"""

from __future__ import annotations

import random

from PIL import Image

from . import props
from .render import canvas, draw_shape
from .scene import BACKGROUNDS, COLOUR_NAMES, COLOURS, SHAPES, shape_word
from .text import cap, num, pick, sentences, vary_words, with_article

KINDS = ("magnets", "float", "balance", "sky")
POLE_WORDS = {"N": "north", "S": "south"}


def _magnets(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    poles = (rng.choice("NS"), rng.choice("NS"))
    gap = rng.choice((10, 18, 26))
    y = rng.randint(70, 110)
    x0 = (224 - 2 * 96 - gap) // 2
    img, draw = canvas(BACKGROUNDS[rng.choice(("white", "cream"))])
    props.magnet(draw, x0, y, poles[0])
    props.magnet(draw, x0 + 96 + gap, y, poles[1])
    facing = ("S" if poles[0] == "N" else "N", poles[1])
    same = facing[0] == facing[1]
    answer = "repel" if same else "attract"
    prompt = rng.choice(
        (
            "Will these magnets attract or repel each other?",
            "Look at the two magnets. Will they pull together or push apart?",
            "Think about the magnetic force between the magnets. Do they attract or repel?",
            "Will the two bar magnets attract or repel?",
            "Two magnets are placed side by side. Will they attract or repel? Explain.",
        )
    )
    fa, fb = POLE_WORDS[facing[0]], POLE_WORDS[facing[1]]
    k = (poles[0] == "N", poles[1] == "N", gap // 8)
    lecture = _lecture(
        (
            (
                "Magnets can pull or push on other magnets without touching them.",
                "Every magnet has two ends, called the north pole and the south pole.",
                "A magnet makes an invisible force around it, and this force is strongest at its poles.",
                "Magnetic forces act between magnets even when there is a small gap between them.",
            ),
            (
                "Opposite poles attract, and like poles repel.",
                "Poles that are different pull together, while poles that are the same push apart.",
                "If a north pole meets a south pole, the magnets attract, but two north poles or two south poles "
                "repel.",
                "When the facing poles differ the magnets attract, and when they match the magnets repel.",
            ),
            (
                "When magnets attract, they move toward each other.",
                "",
                "When magnets repel, they push each other away.",
                "This pull or push is called the magnetic force.",
                "",
            ),
        ),
        k[0],
        k[1],
        k[2],
        y // 20,
    )
    observe = pick(
        (
            f"In this picture, the {fa} pole of the left magnet faces the {fb} pole of the right magnet.",
            f"Look at the ends that are closest together: {facing[0]} on the left magnet and {facing[1]} on the "
            "right one.",
            f"The middle of the picture shows a {fa} pole next to a {fb} pole.",
        ),
        *k,
        salt=1,
    )
    relation = pick(
        (
            "These poles are the same." if same else "These poles are different.",
            "Like poles are facing." if same else "Opposite poles are facing.",
            f"Both facing ends are {fa} poles." if same else f"One facing end is {fa} and the other is {fb}.",
        ),
        *k,
        salt=2,
    )
    verdict = pick(
        (
            f"So the magnets will {answer}.",
            f"Therefore, the answer is that they {answer}.",
            f"This means the two magnets {answer} each other.",
        ),
        *k,
        salt=3,
    )
    return img, prompt, sentences(lecture, observe, relation, verdict), answer


def _float(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    shape = rng.choice(SHAPES)
    colour = rng.choice([c for c in COLOUR_NAMES if c != "blue"])
    floats = rng.random() < 0.5
    water = rng.randint(86, 120)
    r = rng.choice((22, 28))
    x = rng.randint(60, 164)
    img, draw = canvas(BACKGROUNDS[rng.choice(("white", "cream", "lavender"))])
    _, _, bottom = props.tank(draw, water)
    y = water - r // 3 if floats else bottom - r - 4
    draw_shape(draw, shape, x, y, r, COLOURS[colour])
    q = f"{colour} {shape_word(shape, False, rng.randrange(3))}"
    prompt = rng.choice(
        (
            f"Does the {q} float or sink in the water?",
            f"Look at the {q} in the tank. Is it floating or has it sunk?",
            f"Will the {q} float or sink?",
            f"Is the {q} floating on the water or sinking to the bottom?",
        )
    )
    ci, si = COLOUR_NAMES.index(colour), SHAPES.index(shape)
    sh = f"{colour} {shape_word(shape, False, ci, si)}"
    lecture = _lecture(
        (
            (
                "Whether an object floats or sinks depends on its density.",
                "Water pushes up on everything placed in it.",
                "Some objects float on water, and others sink to the bottom.",
                "Density tells how much matter is packed into a space.",
            ),
            (
                "An object that is less dense than water floats, and an object that is denser than water sinks.",
                "If the push of the water can hold the object up, it floats; if not, it sinks.",
                "Light materials such as wood or foam usually float, while stone or iron usually sink.",
            ),
            (
                "",
                "A floating object stays at the surface, and a sinking object goes down to the bottom.",
                "You can tell which happened by looking at where the object ends up.",
            ),
        ),
        ci,
        si,
        r // 6,
        water // 12,
    )
    if floats:
        observe = pick(
            (
                f"In the picture, the {sh} sits at the surface, with part of it above the water line.",
                f"The {sh} stays at the top of the tank instead of going down.",
                f"Here the {sh} rests on the water surface near the top of the tank.",
            ),
            ci,
            si,
        )
        verdict = pick(
            (f"So the {sh} floats.", "Therefore, it floats on the water.", f"This shows that the {sh} floats."),
            si,
            ci,
            salt=1,
        )
        answer = "float"
    else:
        observe = pick(
            (
                f"In the picture, the {sh} lies on the bottom of the tank, far below the water line.",
                f"The {sh} has gone all the way down to the floor of the tank.",
                f"Here the {sh} is resting at the very bottom, under the water.",
            ),
            ci,
            si,
        )
        verdict = pick(
            (f"So the {sh} sinks.", "Therefore, it sinks in the water.", f"This shows that the {sh} sinks."),
            si,
            ci,
            salt=1,
        )
        answer = "sink"
    return img, prompt, sentences(lecture, observe, verdict), answer


def _balance(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    c1, c2 = rng.sample(COLOUR_NAMES, 2)
    s1, s2 = rng.choice(SHAPES), rng.choice(SHAPES)
    r1, r2 = rng.choice((18, 26)), rng.choice((18, 26))
    left_down = rng.random() < 0.5
    img, draw = canvas(BACKGROUNDS[rng.choice(("white", "cream", "mint"))])
    props.balance(draw, left_down, ((s1, c1, r1), (s2, c2, r2)))
    n1 = f"{c1} {shape_word(s1, False, rng.randrange(3))}"
    n2 = f"{c2} {shape_word(s2, False, rng.randrange(3))}"
    prompt = rng.choice(
        (
            f"Which object is heavier, the {n1} or the {n2}?",
            f"Look at the balance scale. Is the {n1} or the {n2} heavier?",
            f"The balance holds {with_article(n1)} and {with_article(n2)}. Which one has more mass?",
            f"Which is heavier: the {n1} on the left or the {n2} on the right?",
        )
    )
    heavy = (s1, c1, r1) if left_down else (s2, c2, r2)
    light = (s2, c2, r2) if left_down else (s1, c1, r1)
    hi, li = COLOUR_NAMES.index(heavy[1]), COLOUR_NAMES.index(light[1])
    hn = f"{heavy[1]} {shape_word(heavy[0], False, hi)}"
    ln = f"{light[1]} {shape_word(light[0], False, li)}"
    side = "left" if left_down else "right"
    lecture = _lecture(
        (
            (
                "A balance scale compares the mass of two objects.",
                "Mass tells how much matter an object has.",
                "You cannot always judge weight by size.",
            ),
            (
                "The side with the heavier object moves down, and the side with the lighter object moves up.",
                "On a balance, the pan holding more mass sinks lower than the other pan.",
                "The heavier load pulls its side of the beam down.",
            ),
            (
                "",
                "If both sides had the same mass, the beam would stay level.",
                "A small object can still be heavy if it is made of a dense material.",
            ),
        ),
        hi,
        li,
        int(left_down),
        heavy[2] // 8,
    )
    size_note = ""
    if heavy[2] < light[2]:
        size_note = pick(
            (
                "Notice that the heavier object is actually the smaller one.",
                "Even though it looks smaller, it still weighs more.",
            ),
            hi,
            li,
        )
    observe = pick(
        (
            f"In the picture, the {side} pan hangs lower, and it holds the {hn}.",
            f"The beam tips down on the {side}, where the {hn} sits, while the {ln} is lifted up.",
            f"The {ln} rises while the {hn} on the {side} side goes down.",
        ),
        hi,
        li,
        salt=1,
    )
    verdict = pick(
        (
            f"So the heavier object is the {hn}.",
            f"Therefore, the one with more mass is the {hn}.",
            f"This means the answer is the {hn}.",
        ),
        hi,
        heavy[2] // 8,
        salt=2,
    )
    return img, prompt, sentences(lecture, observe, size_note, verdict), heavy[1]


def _sky(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    day = rng.random() < 0.5
    corner = rng.randrange(2)
    stars = rng.randint(2, 6)
    house = rng.choice(("red", "yellow", "orange", "purple", "gray", "green"))
    img, draw = canvas((0, 0, 0))
    props.sky(draw, day, corner, stars, house)
    prompt = rng.choice(
        (
            "Is it day or night in this picture?",
            "Does this scene show daytime or night-time?",
            "What time is shown here, day or night?",
            "Look at the sky. Is it day or night?",
        )
    )
    hi = COLOUR_NAMES.index(house)
    where = "left" if corner == 0 else "right"
    lecture = _lecture(
        (
            (
                "The Earth spins around once every day.",
                "The sun lights up the sky during the day.",
                "We can tell day from night by looking at the sky.",
            ),
            (
                "The side of the Earth facing the sun has day, and the side facing away has night.",
                "During the day the sky looks bright and blue, but at night it is dark.",
                "A bright sky with the sun means day, and a dark sky with the moon means night.",
            ),
            (
                "",
                "At night you can often see the moon and stars.",
                "Houses turn on their lights when it gets dark.",
            ),
        ),
        hi,
        corner,
        int(day),
        stars,
    )
    if day:
        observe = pick(
            (
                f"In this image the sky is bright blue, and a yellow sun shines in the upper {where} corner.",
                f"A shining sun is drawn at the top {where}, and the {house} house has no lights on.",
                f"The picture shows a light blue sky with the sun above the {house} house.",
            ),
            hi,
            corner,
        )
        verdict = pick(
            ("So the picture shows daytime.", "Therefore, it is day.", "This scene is set during the day."), hi, salt=1
        )
    else:
        observe = pick(
            (
                f"In this image the sky is dark, with a pale moon in the upper {where} corner and "
                f"{num(stars, True)} small stars.",
                f"A crescent moon and {num(stars, True)} stars shine above the {house} house, whose window is lit.",
                f"The sky is dark blue, and the {house} house has a glowing yellow window.",
            ),
            hi,
            corner,
            stars,
        )
        verdict = pick(
            ("So the picture shows night-time.", "Therefore, it is night.", "This scene is set during the night."),
            hi,
            stars,
            salt=1,
        )
    return img, prompt, sentences(lecture, observe, verdict), "day" if day else "night"


def _lecture(slots: tuple[tuple[str, ...], ...], *keys: int) -> str:
    """Compose a lecture: one (content-chosen) sentence per slot; empty strings skip a slot."""
    text = sentences(*(pick(options, *keys, salt=7 * i) for i, options in enumerate(slots)))
    return vary_words(text, *keys)


_MAKERS = {"magnets": _magnets, "float": _float, "balance": _balance, "sky": _sky}


def generate(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    """One ``science`` item: (image, prompt, lecture + answer, answer word)."""
    img, prompt, ref, check = _MAKERS[rng.choice(KINDS)](rng)
    return img, cap(prompt), ref, check
