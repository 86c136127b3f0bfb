"""Random scene model: a few large flat shapes on a 3x3 grid, and bar charts.

Everything here is plain data plus the shared vocabulary used to talk about it
(colour names, shape synonyms, position phrases).  Drawing lives in
``render.py``; wording of answers in the family modules.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .text import pick

SIZE_PX = 224

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 90, 220),
    "yellow": (240, 200, 20),
    "purple": (140, 60, 180),
    "orange": (245, 130, 20),
    "black": (25, 25, 25),
    "gray": (130, 130, 130),
}
COLOUR_NAMES: tuple[str, ...] = tuple(COLOURS)

BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "white": (255, 255, 255),
    "cream": (250, 240, 212),
    "mint": (214, 240, 222),
    "lavender": (232, 226, 248),
}
BACKGROUND_NAMES: tuple[str, ...] = tuple(BACKGROUNDS)

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star", "diamond", "hexagon")

# (singular, plural) synonyms; index 0 is the canonical name.
SHAPE_SYNONYMS: dict[str, tuple[tuple[str, str], ...]] = {
    "circle": (("circle", "circles"), ("disc", "discs"), ("round shape", "round shapes"), ("dot", "dots")),
    "square": (("square", "squares"), ("box", "boxes"), ("block", "blocks")),
    "triangle": (("triangle", "triangles"), ("three-sided shape", "three-sided shapes"), ("wedge", "wedges")),
    "star": (("star", "stars"), ("star shape", "star shapes"), ("five-pointed star", "five-pointed stars")),
    "diamond": (("diamond", "diamonds"), ("rhombus", "rhombuses"), ("diamond shape", "diamond shapes")),
    "hexagon": (
        ("hexagon", "hexagons"),
        ("six-sided shape", "six-sided shapes"),
        ("hexagonal tile", "hexagonal tiles"),
    ),
}
SHAPE_CORNERS = {"square": 4, "triangle": 3, "diamond": 4, "hexagon": 6, "star": 5}

SIZES: dict[str, int] = {"small": 19, "large": 31}
SIZE_WORDS = {"small": ("small", "little", "tiny"), "large": ("large", "big")}

# 3x3 grid cells, row-major.  Phrases never contain "left"/"right" unless the
# cell is in that column (the side checker relies on it).
CELL_NAMES = (
    "top left",
    "top",
    "top right",
    "left",
    "center",
    "right",
    "bottom left",
    "bottom",
    "bottom right",
)
POSITION_PHRASES: tuple[tuple[str, ...], ...] = (
    ("in the top left corner", "at the upper left", "near the top-left corner"),
    ("at the top", "along the top edge", "in the upper middle"),
    ("in the top right corner", "at the upper right", "near the top-right corner"),
    ("on the left side", "at the middle of the left edge", "on the left"),
    ("in the center", "in the very middle", "at the center of the picture"),
    ("on the right side", "at the middle of the right edge", "on the right"),
    ("in the bottom left corner", "at the lower left", "near the bottom-left corner"),
    ("at the bottom", "along the bottom edge", "in the lower middle"),
    ("in the bottom right corner", "at the lower right", "near the bottom-right corner"),
)
_CENTRES = (37, 112, 187)


@dataclass(frozen=True)
class Obj:
    """One flat shape placed in a grid cell."""

    shape: str
    colour: str
    size: str
    row: int
    col: int
    x: int
    y: int

    @property
    def cell(self) -> int:
        return self.row * 3 + self.col

    @property
    def r(self) -> int:
        return SIZES[self.size]

    @property
    def si(self) -> int:
        return SHAPES.index(self.shape)

    @property
    def ci(self) -> int:
        return COLOUR_NAMES.index(self.colour)

    @property
    def zi(self) -> int:
        return 1 if self.size == "large" else 0


@dataclass(frozen=True)
class Scene:
    """A background colour and 1-6 objects in reading order."""

    bg: str
    objects: tuple[Obj, ...]

    @property
    def bi(self) -> int:
        return BACKGROUND_NAMES.index(self.bg)

    def with_shape(self, shape: str) -> list[Obj]:
        return [o for o in self.objects if o.shape == shape]

    def with_colour(self, colour: str) -> list[Obj]:
        return [o for o in self.objects if o.colour == colour]

    def unique(self, key: str) -> list[Obj]:
        """Objects whose ``key`` attribute value occurs once in the scene."""
        vals = [getattr(o, key) for o in self.objects]
        return [o for o, v in zip(self.objects, vals, strict=True) if vals.count(v) == 1]


def random_scene(
    rng: random.Random,
    n_min: int = 1,
    n_max: int = 6,
    shapes: tuple[str, ...] = SHAPES,
    colours: tuple[str, ...] = COLOUR_NAMES,
) -> Scene:
    """Draw a scene: ``n`` objects in distinct cells with small position jitter."""
    n = rng.randint(n_min, n_max)
    cells = sorted(rng.sample(range(9), n))
    objs = []
    for cell in cells:
        row, col = divmod(cell, 3)
        size = rng.choice(("small", "large"))
        j = 2 if size == "large" else 8
        objs.append(
            Obj(
                shape=rng.choice(shapes),
                colour=rng.choice(colours),
                size=size,
                row=row,
                col=col,
                x=_CENTRES[col] + rng.randint(-j, j),
                y=_CENTRES[row] + rng.randint(-j, j),
            )
        )
    return Scene(bg=rng.choice(BACKGROUND_NAMES), objects=tuple(objs))


# --------------------------------------------------------------------------- words


def shape_word(shape: str, plural: bool, *keys: int) -> str:
    """A (content-chosen) synonym for ``shape``."""
    sing, plur = pick(SHAPE_SYNONYMS[shape], *keys)
    return plur if plural else sing


def size_word(size: str, *keys: int) -> str:
    """``small``/``little``/``tiny`` or ``large``/``big``."""
    return pick(SIZE_WORDS[size], *keys)


def where(obj: Obj, *keys: int) -> str:
    """A position phrase for the object's cell, e.g. ``"at the upper left"``."""
    return pick(POSITION_PHRASES[obj.cell], *keys)


# --------------------------------------------------------------------------- charts

LETTER_SETS = (("A", "B", "C", "D"), ("P", "Q", "R", "S"), ("W", "X", "Y", "Z"))
WORD_LABELS = ("CAT", "PIG", "HEN", "FOX", "BEE", "ANT", "SUN", "SKY", "CAR", "BOX", "EGG", "JAR")


@dataclass(frozen=True)
class Chart:
    """A bar chart: labels, integer values, scale (1 or 10) and layout."""

    labels: tuple[str, ...]
    values: tuple[int, ...]
    scale: int
    horizontal: bool
    colour: str
    multicolour: bool
    bg: str

    def bar_colour(self, i: int) -> str:
        if not self.multicolour:
            return self.colour
        return COLOUR_NAMES[(COLOUR_NAMES.index(self.colour) + i) % len(COLOUR_NAMES)]

    @property
    def top(self) -> int:
        return self.values.index(max(self.values))

    @property
    def bottom(self) -> int:
        return self.values.index(min(self.values))

    def features(self) -> tuple[int, int, int, int]:
        return (len(self.values), self.values[0] // self.scale, self.top, int(self.horizontal))


def random_chart(rng: random.Random, distinct: bool = True) -> Chart:
    """Draw a chart: 2-4 vertical letter-labelled bars or 2 horizontal word-labelled bars."""
    horizontal = rng.random() < 0.3
    if horizontal:
        n = 2
        labels = tuple(rng.sample(WORD_LABELS, n))
    else:
        n = rng.randint(2, 4)
        labels = rng.choice(LETTER_SETS)[:n]
    scale = rng.choice((1, 10))
    units = rng.sample(range(1, 10), n) if distinct else [rng.randint(1, 9) for _ in range(n)]
    return Chart(
        labels=labels,
        values=tuple(u * scale for u in units),
        scale=scale,
        horizontal=horizontal,
        colour=rng.choice(("red", "green", "blue", "purple", "orange", "gray")),
        multicolour=rng.random() < 0.4,
        bg=rng.choice(("white", "cream")),
    )


GENERIC = (("shape", "shapes"), ("object", "objects"), ("figure", "figures"), ("item", "items"))
ROW_WORDS = ("near the top", "halfway down", "close to the bottom")


def generic(plural: bool, *keys: int) -> str:
    """A generic noun for the things in a scene ("shape", "objects", ...)."""
    sing, plur = pick(GENERIC, *keys)
    return plur if plural else sing


def describe_obj(obj: Obj, *keys: int, colour: bool = True, size: bool = True) -> str:
    """``"a big red disc"`` with optional colour and size words."""
    parts = []
    if size:
        parts.append(size_word(obj.size, *keys))
    if colour:
        parts.append(obj.colour)
    parts.append(shape_word(obj.shape, False, *keys))
    phrase = " ".join(parts)
    return f"{'an' if phrase[0] in 'aeiou' else 'a'} {phrase}"
