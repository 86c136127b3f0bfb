"""``textvqa``: TextVQA-like questions about a sign or label inside a drawn scene.

Scenes: a shop front, a road sign, a bus, a house door, a bottle, a shirt.
The reference quotes the text first, then uses it in context (what the place
is, what the number means), with frames chosen by the text and colours.
"""

from __future__ import annotations

import random

from PIL import Image

from . import props, vocab
from .phrases import finish
from .render import canvas
from .scene import BACKGROUNDS, COLOUR_NAMES, COLOURS
from .text import cap, number_word, pick

KINDS = ("shop", "road", "bus", "door", "bottle", "shirt")
WALLS = {"cream": (250, 240, 212), "mint": (214, 240, 222), "lavender": (232, 226, 248), "peach": (250, 215, 190)}


def _key(text: str) -> int:
    return sum(ord(c) for c in text)


def _fill(parts: list[str], extra: list[str]) -> str:
    return finish(parts, extra, min_words=24)


def _shop(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    word = rng.choice(sorted(vocab.SHOP_WORDS))
    wall = rng.choice(("red", "green", "blue", "purple", "orange", "gray"))
    sign = rng.choice(((255, 255, 255), (250, 240, 212), (250, 225, 120)))
    img, draw = canvas(BACKGROUNDS[rng.choice(("white", "mint", "lavender"))])
    props.shop(draw, word, wall, sign)
    what, do = vocab.SHOP_WORDS[word]
    prompt = rng.choice(
        (
            "What is the name on the shop sign?",
            "What does the sign above the door say?",
            "What kind of shop is this? Read the sign.",
            "What word is written on the building?",
            "What is written on the sign of this store?",
        )
    )
    k, ci = _key(word), COLOUR_NAMES.index(wall)
    lead = pick(
        (
            f'The sign above the door says "{word}".',
            f'The board on the {wall} building reads "{word}".',
            f'It says "{word}" in big dark letters on the sign.',
            f'"{word}" is written on the sign at the top of the shop.',
            f'The shop sign reads "{word}".',
        ),
        k,
        ci,
    )
    gloss = pick(
        (
            f"This suggests that the building is {what}, where {do}.",
            f"So this is probably {what}, and {do} there.",
            f"That tells us it is {what}, a place where {do}.",
        ),
        k,
        ci,
        salt=1,
    )
    extra = [
        pick(
            (
                f"The shop has {wall} walls, a brown door and two windows.",
                "Below the sign there is a brown door between two windows.",
                f"The front of the shop is painted {wall}.",
            ),
            ci,
            k,
        ),
        "The letters on the board are large and easy to read.",
    ]
    return img, prompt, _fill([lead, gloss], extra), word


def _road(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    word = rng.choice(sorted(vocab.ROAD_WORDS))
    x = rng.randint(98, 126)
    img, draw = canvas(BACKGROUNDS[rng.choice(("white", "cream", "mint", "lavender"))])
    if word == "STOP":
        shape, colour, ink = "octagon", "red", "white"
    elif word == "SLOW":
        shape, colour, ink = "diamond", "yellow", "black"
    else:
        shape, colour, ink = "rect", rng.choice(("green", "blue", "black", "purple")), "white"
    props.road_sign(draw, word, shape, COLOURS[colour], props.WHITE if ink == "white" else props.INK, x)
    what, do = vocab.ROAD_WORDS[word]
    prompt = rng.choice(
        (
            "What does the road sign say?",
            "What word is on the sign?",
            "Read the sign on the pole.",
            "What is written on this traffic sign?",
        )
    )
    k, ci = _key(word), COLOUR_NAMES.index(colour)
    lead = pick(
        (
            f'The road sign says "{word}".',
            f'The sign on the pole reads "{word}".',
            f'"{word}" is written on the {colour} sign.',
            f'It reads "{word}" in {ink} letters.',
        ),
        k,
        ci,
    )
    gloss = pick(
        (
            f"{cap(what)} like this means that {do}.",
            f"It is {what}, telling us that {do}.",
            f"This is {what}, so {do}.",
        ),
        k,
        ci,
        salt=1,
    )
    form = {"octagon": "an eight-sided red board", "diamond": "a yellow diamond", "rect": f"a {colour} rectangle"}
    extra = [
        pick(
            (
                f"The sign is {form[shape]} on a gray pole.",
                f"It stands on a thin gray pole, and the board is {form[shape]}.",
                f"The board has {ink} letters, so the word stands out clearly.",
            ),
            ci,
            k,
        ),
        "Nothing else is drawn next to the sign.",
    ]
    return img, prompt, _fill([lead, gloss], extra), word


def _bus(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    number = str(rng.randint(1, 99))
    body = rng.choice(("red", "yellow", "blue", "green", "orange", "purple"))
    img, draw = canvas(BACKGROUNDS[rng.choice(("white", "cream", "mint"))])
    props.bus(draw, number, body)
    prompt = rng.choice(
        (
            "What number is shown on the bus?",
            "Which route number does this bus have?",
            "What is the number on the bus?",
            "Read the number on the side of the bus.",
        )
    )
    k, ci = int(number), COLOUR_NAMES.index(body)
    lead = pick(
        (
            f'The bus shows the number "{number}".',
            f'The route number on the bus is "{number}".',
            f'It is bus "{number}", written in a white box.',
            f'"{number}" is the number on the {body} bus.',
        ),
        k,
        ci,
    )
    extra = [
        pick(
            (
                "The number is printed in a white box near the front, above the wheels.",
                f"This {body} bus has two windows and two black wheels.",
                f"Passengers waiting at the stop would look for route {number_word(k)}.",
            ),
            k,
            ci,
            salt=1,
        ),
        pick(
            (
                "The digits are black and large, so they are easy to read from far away.",
                f"The body of the bus is painted {body}.",
            ),
            ci,
            k,
        ),
    ]
    return img, prompt, _fill([lead], extra), number


def _door(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    number = str(rng.randint(1, 99))
    colour = rng.choice(("red", "green", "blue", "purple", "orange", "black"))
    wall_name = rng.choice(sorted(WALLS))
    img, draw = canvas(WALLS[wall_name])
    props.door(draw, number, WALLS[wall_name], colour)
    prompt = rng.choice(
        (
            "What is the house number?",
            "What number is above the door?",
            "Which number is shown on the plate?",
            "What is written above the door?",
        )
    )
    k, ci = int(number), COLOUR_NAMES.index(colour)
    lead = pick(
        (
            f'The house number is "{number}".',
            f'The plate above the door shows "{number}".',
            f'"{number}" is written above the {colour} door.',
            f'It says "{number}" on the white sign.',
        ),
        k,
        ci,
    )
    extra = [
        pick(
            (
                f"So a letter for this house would be sent to number {number_word(k)}.",
                f"The door below it is {colour} with a small gold knob.",
                "The plate is white with black digits, and it hangs high on the wall.",
            ),
            k,
            ci,
            salt=1,
        ),
        pick(
            (
                f"The wall around the door is a soft {wall_name} colour.",
                "There are no other words or numbers in the picture.",
            ),
            ci,
            k,
        ),
    ]
    return img, prompt, _fill([lead], extra), number


def _bottle(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    word = rng.choice(sorted(vocab.BOTTLE_WORDS))
    glass = rng.choice(("green", "blue", "orange", "purple", "gray", "red"))
    img, draw = canvas(BACKGROUNDS[rng.choice(("white", "cream", "mint", "lavender"))])
    props.bottle(draw, word, glass, rng.randint(100, 124))
    what, do = vocab.BOTTLE_WORDS[word]
    prompt = rng.choice(
        (
            "What is written on the bottle?",
            "What does the label say?",
            "What is inside this bottle, according to the label?",
            "Read the label on the bottle.",
        )
    )
    k, ci = _key(word), COLOUR_NAMES.index(glass)
    lead = pick(
        (
            f'The label says "{word}".',
            f'The bottle is labelled "{word}".',
            f'"{word}" is written on the white label.',
            f'The word on the {glass} bottle is "{word}".',
        ),
        k,
        ci,
    )
    gloss = pick(
        (f"So it is probably {what}, and {do}.", f"That means {do}.", f"This tells us it is {what}."),
        k,
        ci,
        salt=1,
    )
    extra = [
        pick(
            (
                f"The bottle itself is {glass}, with a white label across the middle.",
                "The label is a white band with black letters.",
                f"It is a single {glass} bottle standing upright.",
            ),
            ci,
            k,
        ),
        "There is no other writing in the picture.",
    ]
    return img, prompt, _fill([lead, gloss], extra), word


def _shirt(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    number = str(rng.randint(1, 99))
    colour = rng.choice(("red", "green", "blue", "purple", "orange", "yellow", "gray"))
    ink_name = "black" if colour in ("yellow", "orange", "gray") else "white"
    img, draw = canvas(BACKGROUNDS[rng.choice(("white", "cream", "mint", "lavender"))])
    props.shirt(draw, number, colour, props.INK if ink_name == "black" else props.WHITE)
    prompt = rng.choice(
        (
            "What number is on the shirt?",
            "Which number does the player wear?",
            "Read the number on the T-shirt.",
            "What is printed on the front of the shirt?",
        )
    )
    k, ci = int(number), COLOUR_NAMES.index(colour)
    lead = pick(
        (
            f'The shirt has the number "{number}" on it.',
            f'The number on the {colour} shirt is "{number}".',
            f'"{number}" is printed on the front.',
            f'The player wears number "{number}".',
        ),
        k,
        ci,
    )
    extra = [
        pick(
            (
                f"The digits are {ink_name} and very large.",
                "This looks like a sports shirt for a team player.",
                f"It is a {colour} T-shirt with short sleeves.",
            ),
            k,
            ci,
            salt=1,
        ),
        pick(
            (
                f"In words, the number is {number_word(k)}.",
                f"The {ink_name} digits stand out against the {colour} cloth.",
                "A player with this shirt would be easy to spot on the field.",
            ),
            ci,
            k,
        ),
        "No other text appears in the image.",
    ]
    return img, prompt, _fill([lead], extra), number


_MAKERS = {"shop": _shop, "road": _road, "bus": _bus, "door": _door, "bottle": _bottle, "shirt": _shirt}


def generate(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    """One ``textvqa`` item: (image, prompt, reference, text)."""
    return _MAKERS[rng.choice(KINDS)](rng)
