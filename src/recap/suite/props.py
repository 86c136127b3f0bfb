"""Drawn props for the ``science`` and ``textvqa`` families.

Each function draws one simple, flat-coloured object onto an existing
``ImageDraw`` (magnets, a water tank, a balance scale, a sky, a shop, a road
sign, a bus, a door, a bottle, a shirt).  Text is always >= ``MIN_TEXT`` points.
"""

from __future__ import annotations

import math

from PIL import ImageDraw

from .render import MIN_TEXT, darker, draw_shape, draw_text, fit_size, text_width
from .scene import COLOURS

RGB = tuple[int, int, int]
WHITE: RGB = (255, 255, 255)
INK: RGB = (25, 25, 25)
POLE_COLOURS = {"N": (220, 40, 40), "S": (40, 90, 220)}


# --------------------------------------------------------------------------- science


def magnet(draw: ImageDraw.ImageDraw, x: int, y: int, left_pole: str, w: int = 96, h: int = 50) -> None:
    """A horizontal bar magnet whose left half is ``left_pole`` ("N" or "S")."""
    right_pole = "S" if left_pole == "N" else "N"
    half = w // 2
    for k, pole in enumerate((left_pole, right_pole)):
        x0 = x + k * half
        draw.rectangle((x0, y, x0 + half, y + h), fill=POLE_COLOURS[pole], outline=INK, width=2)
        draw_text(draw, x0 + half / 2, y + h / 2 + 1, pole, MIN_TEXT, WHITE)


def tank(draw: ImageDraw.ImageDraw, water_top: int) -> tuple[int, int, int]:
    """A glass tank filled with water up to ``water_top``; returns (left, right, bottom)."""
    left, right, bottom = 18, 206, 206
    draw.rectangle((left, water_top, right, bottom), fill=(150, 195, 240))
    draw.line((left, water_top, right, water_top), fill=(40, 90, 170), width=3)
    draw.line((left, 40, left, bottom), fill=(90, 90, 90), width=4)
    draw.line((right, 40, right, bottom), fill=(90, 90, 90), width=4)
    draw.line((left, bottom, right, bottom), fill=(90, 90, 90), width=4)
    return left, right, bottom


def balance(
    draw: ImageDraw.ImageDraw,
    left_down: bool,
    objs: tuple[tuple[str, str, int], tuple[str, str, int]],
) -> None:
    """A balance scale tilted towards the heavier side; ``objs`` are (shape, colour, radius)."""
    cx, cy, arm = 112, 112, 78
    tilt = math.radians(13 if left_down else -13)
    dx, dy = arm * math.cos(tilt), arm * math.sin(tilt)
    ends = ((cx - dx, cy + dy), (cx + dx, cy - dy))
    draw.polygon([(cx, cy), (cx - 26, 212), (cx + 26, 212)], fill=(120, 120, 120), outline=INK, width=2)
    draw.line((ends[0], ends[1]), fill=(80, 60, 40), width=6)
    for (ex, ey), (shape, colour, r) in zip(ends, objs, strict=True):
        tray_y = ey + 46
        draw.line((ex, ey, ex - 26, tray_y), fill=INK, width=2)
        draw.line((ex, ey, ex + 26, tray_y), fill=INK, width=2)
        draw.rectangle((ex - 32, tray_y, ex + 32, tray_y + 6), fill=(90, 90, 90))
        draw_shape(draw, shape, ex, tray_y - r - 2, r, COLOURS[colour])
    draw.ellipse((cx - 6, cy - 6, cx + 6, cy + 6), fill=INK)


def sky(draw: ImageDraw.ImageDraw, day: bool, corner: int, stars: int, house: str) -> None:
    """Sky with sun (day) or moon and stars (night), ground and a small house."""
    draw.rectangle((0, 0, 224, 224), fill=(135, 200, 250) if day else (20, 30, 70))
    draw.rectangle((0, 170, 224, 224), fill=(70, 170, 70) if day else (20, 70, 35))
    sx = 48 if corner == 0 else 176
    if day:
        for k in range(8):
            a = math.radians(45 * k)
            draw.line(
                (sx + 30 * math.cos(a), 48 + 30 * math.sin(a), sx + 42 * math.cos(a), 48 + 42 * math.sin(a)),
                fill=(240, 200, 20),
                width=4,
            )
        draw.ellipse((sx - 24, 24, sx + 24, 72), fill=(250, 210, 30))
    else:
        draw.ellipse((sx - 24, 24, sx + 24, 72), fill=(240, 240, 220))
        off = 14 if corner == 0 else -14
        draw.ellipse((sx - 24 + off, 18, sx + 24 + off, 66), fill=(20, 30, 70))
        spots = ((112, 30), (150, 70), (80, 80), (196, 110), (30, 120), (120, 105))
        for px, py in spots[:stars]:
            if corner == 1:
                px = 224 - px
            draw_shape(draw, "star", px, py, 9, (250, 245, 200))
    hx = 112 if corner == 0 else 80
    body = COLOURS[house]
    draw.rectangle((hx - 34, 130, hx + 34, 186), fill=body, outline=darker(body), width=2)
    draw.polygon([(hx - 42, 132), (hx, 100), (hx + 42, 132)], fill=(150, 60, 40), outline=INK, width=2)
    lit = (250, 220, 90) if not day else (200, 225, 245)
    draw.rectangle((hx - 24, 142, hx - 8, 158), fill=lit, outline=INK, width=1)
    draw.rectangle((hx + 8, 160, hx + 22, 186), fill=(90, 60, 30))


# --------------------------------------------------------------------------- text props


def board(
    draw: ImageDraw.ImageDraw, cx: float, cy: float, text: str, fill: RGB, ink: RGB, size: int = 44, pad: int = 10
) -> None:
    """A rectangular board with centred text (width follows the text)."""
    w = text_width(text, size) + 2 * pad
    h = int(size * 0.7) + 2 * pad + 4
    draw.rectangle((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), fill=fill, outline=INK, width=3)
    draw_text(draw, cx, cy, text, size, ink)


def shop(draw: ImageDraw.ImageDraw, word: str, wall: str, sign_bg: RGB) -> None:
    """A shop front with the name on a board above the door."""
    rgb = COLOURS[wall]
    draw.rectangle((20, 70, 204, 214), fill=rgb, outline=darker(rgb), width=3)
    draw.rectangle((90, 140, 134, 214), fill=(90, 60, 30), outline=INK, width=2)
    for wx in (34, 150):
        draw.rectangle((wx, 140, wx + 40, 180), fill=(200, 225, 245), outline=INK, width=2)
    size = fit_size(word, 180, 48)
    board(draw, 112, 40, word, sign_bg, INK, size)
    draw.line((20, 70, 204, 70), fill=INK, width=3)


def road_sign(draw: ImageDraw.ImageDraw, word: str, shape: str, fill: RGB, ink: RGB, x: int) -> None:
    """A sign on a pole: ``shape`` is "octagon", "diamond" or "rect"."""
    draw.rectangle((x - 4, 110, x + 4, 214), fill=(110, 110, 110))
    cy = 80
    if shape == "octagon":
        r = 70
        pts = [
            (x + r * math.cos(math.radians(22.5 + 45 * k)), cy + r * math.sin(math.radians(22.5 + 45 * k)))
            for k in range(8)
        ]
        draw.polygon(pts, fill=fill, outline=WHITE, width=3)
        draw_text(draw, x, cy, word, fit_size(word, 120, 44), ink)
    elif shape == "diamond":
        r = 76
        draw.polygon([(x, cy - r), (x + r, cy), (x, cy + r), (x - r, cy)], fill=fill, outline=INK, width=3)
        draw_text(draw, x, cy, word, fit_size(word, 120, 44), ink)
    else:
        board(draw, x, cy, word, fill, ink, fit_size(word, 170, 48), pad=14)


def bus(draw: ImageDraw.ImageDraw, number: str, body: str) -> None:
    """A side view of a bus with its route number in a white box."""
    rgb = COLOURS[body]
    draw.rounded_rectangle((10, 60, 214, 180), radius=16, fill=rgb, outline=darker(rgb), width=3)
    for wx in (24, 70):
        draw.rectangle((wx, 76, wx + 36, 116), fill=(200, 225, 245), outline=INK, width=2)
    draw.rectangle((126, 72, 202, 124), fill=WHITE, outline=INK, width=3)
    draw_text(draw, 164, 99, number, fit_size(number, 70, 46), INK)
    for wx in (54, 170):
        draw.ellipse((wx - 20, 160, wx + 20, 200), fill=INK)
        draw.ellipse((wx - 8, 172, wx + 8, 188), fill=(150, 150, 150))


def door(draw: ImageDraw.ImageDraw, number: str, wall: RGB, colour: str) -> None:
    """A house wall with a coloured door and a number plate above it."""
    draw.rectangle((0, 0, 224, 224), fill=wall)
    rgb = COLOURS[colour]
    draw.rectangle((62, 92, 162, 224), fill=rgb, outline=darker(rgb), width=3)
    draw.ellipse((140, 156, 150, 166), fill=(230, 200, 60))
    board(draw, 112, 46, number, WHITE, INK, 46, pad=12)


def bottle(draw: ImageDraw.ImageDraw, word: str, glass: str, x: int) -> None:
    """A bottle with a white label carrying ``word``."""
    rgb = COLOURS[glass]
    draw.rectangle((x - 18, 18, x + 18, 60), fill=rgb, outline=darker(rgb), width=2)
    draw.rounded_rectangle((x - 66, 56, x + 66, 214), radius=18, fill=rgb, outline=darker(rgb), width=2)
    size = fit_size(word, 112, 44)
    draw.rectangle((x - 61, 108, x + 61, 162), fill=WHITE, outline=INK, width=2)
    draw_text(draw, x, 135, word, size, INK)


def shirt(draw: ImageDraw.ImageDraw, number: str, colour: str, ink: RGB) -> None:
    """A T-shirt with a large number on the front."""
    rgb = COLOURS[colour]
    pts = [
        (70, 30),
        (92, 22),
        (132, 22),
        (154, 30),
        (210, 70),
        (186, 104),
        (160, 88),
        (160, 210),
        (64, 210),
        (64, 88),
        (38, 104),
        (14, 70),
    ]
    draw.polygon(pts, fill=rgb, outline=darker(rgb), width=3)
    draw_text(draw, 112, 136, number, 60, ink)
