"""Pillow drawing of scenes, bar charts and large text.

Only Pillow's bundled scalable font (``ImageFont.load_default(size=...)``) is
used, so images are identical on every machine.  Text is never smaller than
``MIN_TEXT`` points (cap height about 28 px).
"""

from __future__ import annotations

import math
from functools import cache

from PIL import Image, ImageDraw, ImageFont

from .scene import BACKGROUNDS, COLOURS, SIZE_PX, Chart, Scene

MIN_TEXT = 40
RGB = tuple[int, int, int]


@cache
def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's bundled font at ``size`` points."""
    return ImageFont.load_default(size=size)


def text_width(text: str, size: int) -> int:
    """Rendered width of ``text`` in pixels."""
    left, _, right, _ = font(size).getbbox(text)
    return int(right - left)


def fit_size(text: str, max_width: int, largest: int, smallest: int = MIN_TEXT) -> int:
    """Largest size in ``[smallest, largest]`` whose width fits ``max_width``."""
    size = largest
    while size > smallest and text_width(text, size) > max_width:
        size -= 2
    return size


def draw_text(draw: ImageDraw.ImageDraw, x: float, y: float, text: str, size: int, fill: RGB) -> None:
    """Draw ``text`` centred on ``(x, y)``."""
    draw.text((x, y), text, font=font(size), fill=fill, anchor="mm")


def darker(rgb: RGB, f: float = 0.6) -> RGB:
    """A darker shade, used for outlines."""
    return (int(rgb[0] * f), int(rgb[1] * f), int(rgb[2] * f))


def shape_points(shape: str, x: float, y: float, r: float) -> list[tuple[float, float]]:
    """Polygon vertices of a shape of radius ``r`` centred on ``(x, y)``."""
    if shape == "square":
        h = r * 0.88
        return [(x - h, y - h), (x + h, y - h), (x + h, y + h), (x - h, y + h)]
    if shape == "diamond":
        return [(x, y - r * 1.1), (x + r * 0.8, y), (x, y + r * 1.1), (x - r * 0.8, y)]
    if shape == "triangle":
        rr = r * 1.12
        yc = y + r * 0.18
        return [(x + rr * math.cos(a), yc + rr * math.sin(a)) for a in _angles(3, -90)]
    if shape == "hexagon":
        return [(x + r * math.cos(a), y + r * math.sin(a)) for a in _angles(6, 0)]
    if shape == "star":
        pts = []
        for k, a in enumerate(_angles(10, -90)):
            rr = r * 1.1 if k % 2 == 0 else r * 0.47
            pts.append((x + rr * math.cos(a), y + rr * math.sin(a)))
        return pts
    raise ValueError(f"unknown polygon shape {shape!r}")


def _angles(n: int, start_deg: float) -> list[float]:
    return [math.radians(start_deg + 360.0 * k / n) for k in range(n)]


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, x: float, y: float, r: float, rgb: RGB) -> None:
    """Draw one flat shape with a thin darker outline."""
    if shape == "circle":
        draw.ellipse((x - r, y - r, x + r, y + r), fill=rgb, outline=darker(rgb), width=2)
    else:
        draw.polygon(shape_points(shape, x, y, r), fill=rgb, outline=darker(rgb), width=2)


def canvas(bg: RGB) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    """A fresh 224x224 RGB image and its drawing context."""
    img = Image.new("RGB", (SIZE_PX, SIZE_PX), bg)
    return img, ImageDraw.Draw(img)


def render_scene(scene: Scene) -> Image.Image:
    """Draw all objects of a scene on its flat background."""
    img, draw = canvas(BACKGROUNDS[scene.bg])
    for o in scene.objects:
        draw_shape(draw, o.shape, o.x, o.y, o.r, COLOURS[o.colour])
    return img


_GRID = (205, 205, 205)
_AXIS = (30, 30, 30)


def render_chart(chart: Chart) -> Image.Image:
    """Draw a vertical (letter labels below) or horizontal (word labels above bars) bar chart."""
    img, draw = canvas(BACKGROUNDS[chart.bg])
    n = len(chart.values)
    units = [v // chart.scale for v in chart.values]
    if not chart.horizontal:
        x0, x1, y0, y1 = 14, 218, 46, 172
        unit = (y1 - y0) / 10.0
        for k in range(2, 11, 2):
            yy = y1 - k * unit
            draw.line((x0, yy, x1, yy), fill=_GRID, width=1)
            draw.line((x0 - 6, yy, x0, yy), fill=_AXIS, width=2)
        slot = (x1 - x0) / n
        bw = min(46.0, slot * 0.62)
        for i, (u, v, lab) in enumerate(zip(units, chart.values, chart.labels, strict=True)):
            cx = x0 + slot * (i + 0.5)
            top = y1 - u * unit
            rgb = COLOURS[chart.bar_colour(i)]
            draw.rectangle((cx - bw / 2, top, cx + bw / 2, y1), fill=rgb, outline=darker(rgb), width=2)
            vs = fit_size(str(v), int(slot) - 2, 44)
            draw_text(draw, cx, top - 19, str(v), vs, _AXIS)
            draw_text(draw, cx, y1 + 22, lab, 42, _AXIS)
        draw.line((x0, y0 - 30, x0, y1), fill=_AXIS, width=2)
        draw.line((x0, y1, x1, y1), fill=_AXIS, width=2)
    else:
        x0, y0, y1 = 14, 4, 216
        val_w = max(text_width(str(v), MIN_TEXT) for v in chart.values)
        x1 = 224 - 6 - val_w - 6
        unit = (x1 - x0) / 10.0
        for k in range(2, 11, 2):
            xx = x0 + k * unit
            draw.line((xx, y0, xx, y1), fill=_GRID, width=1)
            draw.line((xx, y1, xx, y1 + 6), fill=_AXIS, width=2)
        row = (y1 - y0) / n
        bh = min(40.0, row - 42)
        for i, (u, v, lab) in enumerate(zip(units, chart.values, chart.labels, strict=True)):
            ry = y0 + row * i
            top = ry + (row - bh - 36) / 2
            ly, by = top + 16, top + 36
            right = x0 + u * unit
            rgb = COLOURS[chart.bar_colour(i)]
            draw.text((x0 + 4, ly), lab, font=font(MIN_TEXT), fill=_AXIS, anchor="lm")
            draw.rectangle((x0, by, right, by + bh), fill=rgb, outline=darker(rgb), width=2)
            draw.text((right + 6, by + bh / 2), str(v), font=font(MIN_TEXT), fill=_AXIS, anchor="lm")
        draw.line((x0, y0, x0, y1), fill=_AXIS, width=2)
        draw.line((x0, y1, 218, y1), fill=_AXIS, width=2)
    return img
