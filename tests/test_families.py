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


def test_the_recorded_survey_covers_the_families_built_here() -> None:
    """The record describes the families this transformers offers (a new or renamed family fails
    here until the survey is rerun), and enough of them are tested below."""
    built = {f"{f.kind}:{f.model_type}" for f in all_families()}
    assert built == set(STATUS), (
        f"families without a record: {sorted(built - set(STATUS))}, records without a family: "
        f"{sorted(set(STATUS) - built)}; rerun python tools/model_families.py"
    )
    tested = [f for f in FAMILIES if STATUS[f"{f.kind}:{f.model_type}"] == "pass"]
    assert sum(f.kind == "text" for f in tested) >= 60 and sum(f.kind == "image-text" for f in tested) >= 8
    assert not [key for key, status in STATUS.items() if status in ("mismatch", "crash")]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f"{f.kind}:{f.model_type}")
def test_family_passes_or_is_refused_as_recorded(family: Family) -> None:
    outcome = check(family, lengths=(48,), seed=5, sampled=True)
    assert outcome.status == STATUS[f"{family.kind}:{family.model_type}"], outcome.detail
