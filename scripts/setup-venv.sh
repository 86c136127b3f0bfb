#!/usr/bin/env bash
# Create .venv in the repository root and install recap into it (editable, with test tools).
# torch: a fresh venv gets the CPU build torch==2.13.0 unless RECAP_TORCH names another
# requirement (e.g. RECAP_TORCH="torch==2.14.1" for a CUDA build); an existing torch is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet "${RECAP_TORCH:-torch==2.13.0}"
fi
.venv/bin/python -m pip install --quiet -e ".[dev]"
touch .venv/.installed
