"""The README's Python quickstart runs as written, in a fresh interpreter, and says the truth."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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
