"""``chart``: ChartQA-like questions on 2-4 bar charts (read, compare, explain).

Checkable field: the bar value (first number in the answer) for value
questions, or the bar label (first ``"quoted"`` label) for compare/extreme
questions.  Labels are always quoted in references; values are plain digits.
"""

from __future__ import annotations

import random

from PIL import Image

from .render import render_chart
from .scene import COLOUR_NAMES, Chart, random_chart
from .text import cap, join_and, num, pick, sentences, word_count

KINDS = ("value", "max", "min", "compare")
RANKS = ("highest", "second highest", "third highest", "lowest")


def q(label: str) -> str:
    """A label as it appears in answers: quoted."""
    return f'"{label}"'


def tall(chart: Chart, *keys: int) -> tuple[str, str]:
    """(superlative-high, superlative-low) words fitting the chart orientation."""
    if chart.horizontal:
        return pick((("longest", "shortest"), ("largest", "smallest")), *keys)
    return pick((("tallest", "shortest"), ("highest", "lowest"), ("largest", "smallest")), *keys)


def listing(chart: Chart, skip: int | None, *keys: int) -> str:
    """``"A" is 3, "B" is 7 and "C" is 5`` (optionally without bar ``skip``)."""
    verb = pick(("is", "shows", "reaches"), *keys)
    items = [
        f"{q(lab)} {verb} {v}" for i, (lab, v) in enumerate(zip(chart.labels, chart.values, strict=True)) if i != skip
    ]
    return join_and(items)


def overview(chart: Chart, *keys: int) -> list[str]:
    """Context sentences about the chart as a whole (used to pad answers)."""
    n = len(chart.values)
    colour = "each bar has its own colour" if chart.multicolour else f"all bars are {chart.colour}"
    grid = "every 20" if chart.scale == 10 else "every 2"
    return [
        pick(
            (
                f"The chart has {num(n, True)} {'horizontal' if chart.horizontal else 'vertical'} bars, and {colour}.",
                f"Gridlines are drawn {grid} units, which makes the bars easy to compare.",
                f"The values range from {min(chart.values)} to {max(chart.values)}.",
                f"Each value is printed {'at the end' if chart.horizontal else 'on top'} of its bar.",
            ),
            *keys,
        ),
        f"In this chart, {colour}.",
        f"The values range from {min(chart.values)} to {max(chart.values)}.",
    ]


def _finish(parts: list[str], extra: list[str], min_words: int = 22) -> str:
    text = sentences(*parts)
    for e in extra:
        if word_count(text) >= min_words:
            break
        if e not in text:
            text = sentences(text, e)
    return text


def generate(rng: random.Random) -> tuple[Image.Image, str, str, str]:
    """One ``chart`` item: (image, prompt, reference, value or label)."""
    chart = random_chart(rng)
    kind = rng.choice(KINDS)
    n = len(chart.values)
    order = sorted(range(n), key=lambda i: -chart.values[i])
    f = chart.features()
    ci = COLOUR_NAMES.index(chart.colour)
    hi_word, lo_word = tall(chart, *f)
    if kind == "value":
        i = rng.randrange(n)
        lab, v = chart.labels[i], chart.values[i]
        prompt = rng.choice(
            (
                f"What is the value of the {q(lab)} bar?",
                f"What value does {q(lab)} have in the chart?",
                f"According to the chart, what is the value for {q(lab)}?",
                f"How high is the bar labelled {q(lab)}?",
                f"Read the value of {q(lab)} from the bar chart.",
            )
        )
        k = (v // chart.scale, i, ci)
        lead = pick(
            (
                f"The {q(lab)} bar has a value of {v}.",
                f"According to the chart, {q(lab)} is {v}.",
                f"The bar labelled {q(lab)} reaches {v}.",
                f"Reading the chart, the value for {q(lab)} is {v}.",
                f"{v} is the value shown for {q(lab)}.",
            ),
            *k,
        )
        rank = order.index(i)
        rank_word = "lowest" if rank == n - 1 else RANKS[rank]
        why = pick(
            (
                f"It is the {rank_word} of the {num(n, True)} bars.",
                f"For comparison, {listing(chart, i, *k)}.",
                f"The number {v} is also printed {'at the end' if chart.horizontal else 'on top'} of the bar.",
            ),
            *k,
            salt=1,
        )
        return render_chart(chart), prompt, _finish([lead, why], overview(chart, *k)), str(v)
    if kind in ("max", "min"):
        i = order[0] if kind == "max" else order[-1]
        lab, v = chart.labels[i], chart.values[i]
        word = hi_word if kind == "max" else lo_word
        prompt = rng.choice(
            (
                f"Which bar has the {'highest' if kind == 'max' else 'lowest'} value?",
                f"Which label has the {'largest' if kind == 'max' else 'smallest'} value in the chart?",
                f"Which category is the {'biggest' if kind == 'max' else 'smallest'}?",
                f"Which bar is the {word}?",
            )
        )
        k = (i, v // chart.scale, n)
        lead = pick(
            (
                f"The {q(lab)} bar is the {word}, with a value of {v}.",
                f"{q(lab)} has the {'largest' if kind == 'max' else 'smallest'} value, {v}.",
                f"The answer is {q(lab)}, because its bar reaches {v}.",
                f"Looking at the chart, {q(lab)} is the {word} bar at {v}.",
            ),
            *k,
        )
        others = pick(
            (
                f"The other bars are {'lower' if kind == 'max' else 'higher'}: {listing(chart, i, *k)}.",
                f"By comparison, {listing(chart, i, *k)}.",
                f"No other bar comes {'close to' if kind == 'max' else 'as low as'} {v}.",
            ),
            *k,
            salt=1,
        )
        return render_chart(chart), prompt, _finish([lead, others], overview(chart, *k)), lab
    i, j = rng.sample(range(n), 2)
    li, lj = chart.labels[i], chart.labels[j]
    prompt = rng.choice(
        (
            f"Which is greater, {q(li)} or {q(lj)}?",
            f"Is {q(li)} larger than {q(lj)}? Which one has the higher value?",
            f"Compare {q(li)} and {q(lj)}. Which bar is higher?",
            f"Which of {q(li)} and {q(lj)} has the bigger value?",
        )
    )
    w, lo = (i, j) if chart.values[i] > chart.values[j] else (j, i)
    lw, ll, vw, vl = chart.labels[w], chart.labels[lo], chart.values[w], chart.values[lo]
    k = (w, vw // chart.scale, (vw - vl) // chart.scale)
    lead = pick(
        (
            f"{cap(q(lw))} is greater: it shows {vw}, while {q(ll)} shows only {vl}.",
            f"The {q(lw)} bar is higher, at {vw} compared with {vl} for {q(ll)}.",
            f"{cap(q(lw))} has the bigger value. Its bar reaches {vw}, but {q(ll)} stops at {vl}.",
            f"The answer is {q(lw)}, since {vw} is more than {vl}.",
        ),
        *k,
    )
    gap = vw - vl
    diff = pick(
        (
            f"The difference between the two bars is {gap}.",
            f"So {q(lw)} is ahead by {gap}.",
            f"That is a gap of {gap} between them.",
        ),
        *k,
        salt=1,
    )
    return render_chart(chart), prompt, _finish([lead, diff], overview(chart, *k)), lw
