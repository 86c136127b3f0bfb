"""``ocr``: OCRBench-like reading of one or two large words or a number.

The reference quotes the text first (``The text reads "HOT TEA".``), then adds
a short content-chosen remark about colour, place or spelling.
"""

from __future__ import annotations

import random

from PIL import Image

from . import vocab
from .render import canvas, draw_text, fit_size, text_width
from .scene import BACKGROUNDS, COLOUR_NAMES, COLOURS
from .text import cap, number_word, pick

TEXT_COLOURS = ("red", "green", "blue", "purple", "orange", "black")
PANEL_COLOURS = ("red", "green", "blue", "purple", "black", "gray")
ROWS = ("near the top", "in the middle", "near the bottom")


def _text(rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(("word", "word", "number", "pair", "tagged"))
    if kind == "word":
        return kind, rng.choice(vocab.NOUNS)
    if kind == "number":
        return kind, str(rng.randint(0, 99))
    if kind == "pair":
        return kind, f"{rng.choice(vocab.ADJECTIVES)} {rng.choice(vocab.NOUNS)}"
    return kind, f"{rng.choice(vocab.NUMBER_NOUNS)} {rng.randint(1, 99)}"


def _draw(rng: random.Random, text: str) -> tuple[Image.Image, str, str, int]:
    """Render; returns (image, ink colour name, surface description, row index)."""
    panel = rng.random() < 0.45
    bg = rng.choice(("white", "cream", "mint", "lavender"))
    img, draw = canvas(BACKGROUNDS[bg])
    lines = [text] if text_width(text, 48) <= 190 else text.split(" ")
    size = min(fit_size(line, 196 if not panel else 176, 64) for line in lines)
    row = 1 if len(lines) == 2 else rng.randrange(3)
    cy = (60, 112, 164)[row]
    step = int(size * 1.05)
    if panel:
        pc = rng.choice(PANEL_COLOURS)
        ink_name = "white" if pc != "gray" or rng.random() < 0.5 else "black"
        ink = (255, 255, 255) if ink_name == "white" else COLOURS["black"]
        h = step * len(lines) + 18
        draw.rectangle((8, cy - h / 2, 216, cy + h / 2), fill=COLOURS[pc], outline=(25, 25, 25), width=3)
        surface = f"a {pc} panel"
    else:
        ink_name = rng.choice(TEXT_COLOURS)
        ink = COLOURS[ink_name]
        surface = f"a {bg} background"
    for k, line in enumerate(lines):
        draw_text(draw, 112, cy + (k - (len(lines) - 1) / 2) * step, line, size, ink)
    return img, ink_name, surface, row


def generate(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    """One ``ocr`` item: (image, prompt, reference, text)."""
    kind, text = _text(rng)
    img, ink, surface, row = _draw(rng, text)
    specific = {
        "word": "What word is shown here?",
        "number": "What number is written in the image?",
        "pair": "Read the two words in the image.",
        "tagged": "What does the label in the image say?",
    }[kind]
    prompt = rng.choice(
        (
            "What text is written in the image?",
            "Read the text in this picture.",
            "What does the image say?",
            "Please transcribe the text in this image.",
            "What is written here?",
            specific,
            specific,
        )
    )
    k1 = len(text)
    k2 = ord(text[0]) % 7
    ki = COLOUR_NAMES.index(ink) if ink in COLOUR_NAMES else 8
    noun = {"word": "word", "number": "number", "pair": "words", "tagged": "label"}[kind]
    glyphs = "digits" if kind == "number" else "letters"
    lead = pick(
        (
            f'The image says "{text}".',
            f'The text reads "{text}".',
            f'"{text}" is written in the image.',
            f'It shows the {noun} "{text}".',
            f'I can read "{text}" in large {ink} {glyphs}.',
            f'The picture contains the text "{text}".',
        ),
        k1,
        k2,
        ki,
    )
    extras = [
        f"It is written in {ink} {'digits' if kind == 'number' else 'capital letters'} on {surface}.",
        f"The text is placed {ROWS[row]} of the image.",
        "There is nothing else in the picture.",
    ]
    if kind == "number":
        extras.append(f"In words, that is {number_word(int(text))}.")
    elif kind in ("pair", "tagged"):
        a, b = text.split(" ")
        extras.append(f'The first part is "{a}" and the second part is "{b}".')
    else:
        extras.append(f"The word has {number_word(len(text))} letters.")
    more = pick(extras, k2, ki, row)
    if pick((False, True, True), k1, ki):
        return img, prompt, f"{lead} {cap(more)}", text
    return img, prompt, lead, text
