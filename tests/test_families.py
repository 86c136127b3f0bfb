"""Every transformers family the survey (tools/model_families.py) built: each still passes
the lossless check, or is still refused up front with a clear reason (tests/family_status.json,
the table in docs/models.md). A shorter check than the survey's: one prompt per family (two for
image-text models: with and without an image), each with and without a mid-way EOS, and the
first prompt sampled with a repetition penalty under a seed (equal to generate's draws)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from families import Family, all_families, check

STATUS = json.loads((Path(__file__).parent / "family_status.json").read_text())
FAMILIES = [f for f in all_families() if STATUS.get(f"{f.kind}:{f.model_type}") in ("pass", "refused")]


def test_the_survey_covers_enough_families() -> None:
    passing = [key for key, status in STATUS.items() if status == "pass"]
    assert sum(key.startswith("text:") for key in passing) >= 60
    assert sum(key.startswith("image-text:") for key in passing) >= 8
    assert not [key for key, status in STATUS.items() if status in ("mismatch", "crash")]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f"{f.kind}:{f.model_type}")
def test_family_passes_or_is_refused_as_recorded(family: Family) -> None:
    outcome = check(family, lengths=(48,), seed=5, sampled=True)
    assert outcome.status == STATUS[f"{family.kind}:{family.model_type}"], outcome.detail
