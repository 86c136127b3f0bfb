"""Shared scene wording: context sentences and length padding for answers."""

from __future__ import annotations

from .scene import Obj, Scene, describe_obj, generic, where
from .text import num, pick, sentences, word_count


def tail(scene: Scene, target: Obj | None, *keys: int) -> list[str]:
    """Optional context sentences (used to reach ~20+ words), keyed by content."""
    n = len(scene.objects)
    others = [o for o in scene.objects if o is not target]
    out = []
    if others and target is not None:
        o = others[(keys[0] if keys else 0) % len(others)]
        out.append(
            pick(
                (
                    f"Nearby there is also {describe_obj(o, o.ci)} {where(o, o.si)}.",
                    f"The scene also includes {describe_obj(o, o.si, size=False)} {where(o, o.ci)}.",
                    f"Another shape worth noting is {describe_obj(o, o.zi, o.ci)}, placed {where(o, o.zi)}.",
                ),
                o.ci,
                o.cell,
            )
        )
    out.append(
        pick(
            (
                f"Everything is drawn on a plain {scene.bg} background.",
                f"The background of the picture is a flat {scene.bg} colour.",
                f"In total the {scene.bg} canvas holds {num(n, True)} {generic(n != 1, n)}.",
                f"All {generic(True, scene.bi)} sit on a {scene.bg} background without any other detail.",
            ),
            scene.bi,
            n,
        )
    )
    kinds = len({o.shape for o in scene.objects})
    out.append(
        pick(
            (
                "The picture is simple, with flat colours and no shading or texture.",
                f"The image uses {num(kinds, True)} different kind{'s' if kinds != 1 else ''} of shape.",
                "Nothing else, such as text or lines, appears in the image.",
            ),
            n,
            kinds,
            scene.bi,
        )
    )
    return out


def finish(parts: list[str], extra: list[str], min_words: int = 22) -> str:
    """Join ``parts`` and append ``extra`` sentences until ``min_words`` is reached."""
    text = sentences(*parts)
    for e in extra:
        if word_count(text) >= min_words:
            break
        text = sentences(text, e)
    return text
