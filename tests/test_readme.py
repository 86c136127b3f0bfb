"""The README's Python quickstart runs as written, in a fresh interpreter, and says the truth; the README
and the manuals in docs/ link only to files and headings that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

# appended to the quickstart: what its comments claim
CHECKS = """
L = inputs["input_ids"].shape[1]
expected = model.generate(**inputs, max_new_tokens=200)
assert result.token_ids == expected[0, L:].tolist()
assert sequences.tolist() == expected.tolist()
torch.manual_seed(0)
drawn = model.generate(**inputs, max_new_tokens=200, do_sample=True, temperature=0.7, top_p=0.9)
assert sampled.token_ids == drawn[0, L:].tolist()
assert result.stats.mean_accepted_length > 1
print("QUICKSTART OK")
"""


def quickstart() -> str:
    text = README.read_text()
    section = text[text.index("## Python quickstart") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    code = quickstart()
    assert "recap.zoo.load" in code and "import recap\n" in code
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", code + CHECKS], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "QUICKSTART OK" in done.stdout
    assert "mean accepted length" in done.stdout  # the summary line it prints


ROOT = README.parent
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]  # the front page and the manuals (not bench/ or experiments/)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page (headings inside code blocks are not headings)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    headings = re.findall(r"^#{1,6} (.+?)\s*$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name}: link to {target}: no such file"
        if anchor:
            assert anchor in anchors(file), f"{page.name}: link to {target}: no such heading"


def test_readme_is_a_front_page() -> None:
    """Manuals, generated tables and full results live in docs/; the README stays short."""
    assert len(README.read_text().splitlines()) <= 300


def test_family_table_markers() -> None:
    """tools/model_families.py writes the family table between these markers of docs/models.md."""
    text = (ROOT / "docs" / "models.md").read_text()
    assert text.count("<!-- families:start -->") == 1 and text.count("<!-- families:end -->") == 1
