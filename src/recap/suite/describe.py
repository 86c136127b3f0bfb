"""``describe``: free-form "describe the image" prompts answered with a paragraph.

The paragraph opens with the total number of shapes (the checkable field),
then walks over the objects (order and sentence frames chosen by content) and
closes with one or two summary sentences.
"""

from __future__ import annotations

import random
from collections import Counter

from PIL import Image

from .phrases import finish, tail
from .render import render_scene
from .scene import Obj, Scene, describe_obj, generic, random_scene, shape_word, where
from .text import be, cap, num, pick

PROMPTS = (
    "Describe the image.",
    "What do you see in this picture?",
    "Give a short description of the scene.",
    "Can you describe what is shown here?",
    "Write a few sentences about this image.",
    "Tell me about the picture.",
    "Describe this image in detail.",
    "What is in this image?",
)


def _opening(scene: Scene) -> str:
    n = len(scene.objects)
    f = scene.objects[0]
    nw = num(n, pick((True, True, False), n, f.ci))
    g = generic(n != 1, n, scene.bi)
    return pick(
        (
            f"The image shows {nw} {g} on a {scene.bg} background.",
            f"This picture contains {nw} flat {g} drawn on a plain {scene.bg} background.",
            f"In this image, {nw} {g} {be(n)} arranged on a {scene.bg} background.",
            f"I can see {nw} {g} against a {scene.bg} backdrop.",
            f"There {be(n)} {nw} {g} in this simple picture, set on a {scene.bg} background.",
        ),
        n,
        f.ci,
        scene.bi,
    )


def _object_sentence(o: Obj, i: int, n: int) -> str:
    if n == 1:
        return pick(
            (
                f"It is {describe_obj(o, o.ci)} placed {where(o, o.si)}.",
                f"The only shape is {describe_obj(o, o.si)}, and it sits {where(o, o.ci)}.",
                f"{cap(where(o, o.zi))} there is {describe_obj(o, o.cell)}, with nothing else around it.",
            ),
            o.ci,
            o.si,
        )
    frames = [
        f"{cap(where(o, o.ci))} there is {describe_obj(o, o.si)}.",
        f"{cap(describe_obj(o, o.ci, o.zi))} sits {where(o, o.si)}.",
        f"{cap(where(o, o.si))}, you can see {describe_obj(o, o.ci, size=False)} that is fairly "
        f"{'big' if o.zi else 'small'}.",
    ]
    if i > 0:
        frames += [
            f"There is also {describe_obj(o, o.zi)} {where(o, o.ci)}.",
            f"Next comes {describe_obj(o, o.si, size=False)} {where(o, o.cell)}.",
        ]
    return pick(frames, o.ci, o.si, o.cell, i)


def _order(scene: Scene) -> list[Obj]:
    objs = list(scene.objects)
    mode = pick((0, 1, 2), len(objs), objs[0].ci)
    if mode == 1:
        objs.sort(key=lambda o: (-o.zi, o.cell))
    elif mode == 2:
        objs.sort(key=lambda o: (o.col, o.row))
    return objs


def _summary(scene: Scene) -> list[str]:
    objs = scene.objects
    n = len(objs)
    out = []
    colours = Counter(o.colour for o in objs)
    shapes = Counter(o.shape for o in objs)
    top_c, kc = colours.most_common(1)[0]
    top_s, ks = shapes.most_common(1)[0]
    big = sum(o.zi for o in objs)
    bw, sw = num(big, True), num(n - big, True)
    mostly = "mostly large" if 2 * big >= n else "mostly small"
    if n > 1:
        if kc > 1:
            out.append(
                pick(
                    (
                        f"{cap(num(kc, True))} of the {generic(True, n)} are {top_c}.",
                        f"The colour {top_c} appears most often, on {num(kc, True)} of them.",
                    ),
                    kc,
                    n,
                )
            )
        elif len(colours) == n:
            out.append(pick(("Each shape has a different colour.", "No two shapes share a colour."), n, objs[0].ci))
        if ks > 1:
            out.append(
                pick(
                    (
                        f"{cap(num(ks, True))} of them are {shape_word(top_s, True, ks)}.",
                        f"The most common shape is the {shape_word(top_s, False, n)}, seen {num(ks, True)} times.",
                    ),
                    ks,
                    objs[0].si,
                )
            )
        out.append(
            pick(
                (
                    f"Overall, {bw} of the shapes {be(big)} large and {sw} {be(n - big)} small.",
                    "The shapes are spread out, and none of them overlap."
                    if len({o.row for o in objs}) > 1
                    else "All of the shapes line up in a single row.",
                    f"The picture looks clean and simple, with {mostly} shapes.",
                ),
                big,
                n,
                scene.bi,
            )
        )
    return out


def generate(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    """One ``describe`` item: (image, prompt, paragraph, total count)."""
    scene = random_scene(rng, 1, 6)
    prompt = rng.choice(PROMPTS)
    objs = _order(scene)
    parts = [_opening(scene)]
    parts += [_object_sentence(o, i, len(objs)) for i, o in enumerate(objs)]
    summary = _summary(scene)
    keep = pick((1, 2, 3), len(objs), objs[0].si)
    parts += summary[:keep]
    ref = finish(parts, tail(scene, None, len(objs)), min_words=24)
    return render_scene(scene), prompt, ref, str(len(scene.objects))
