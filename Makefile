# Each target creates and uses the virtual environment .venv in the repository root.
VENV := .venv
BIN := $(VENV)/bin

VLLM_VENV := .venv-vllm
# vLLM's CPU build runs speculative steps much faster with the Intel OpenMP it ships
VLLM_RUN := LD_PRELOAD=$(abspath $(VLLM_VENV))/lib/libiomp5.so $(VLLM_VENV)/bin/python

.PHONY: bench bench-full bench-vllm bench-vllm-restart test test-vllm lint overhead gpu-check

$(VENV)/.installed: pyproject.toml scripts/setup-venv.sh
	bash scripts/setup-venv.sh

$(VLLM_VENV)/.installed: pyproject.toml scripts/setup-vllm-venv.sh
	bash scripts/setup-vllm-venv.sh

# The main job: a quick side-by-side bench on the embedded default model (a few minutes on a CPU).
bench: $(VENV)/.installed
	$(BIN)/recap bench --model tiny-qwen2.5-vl --samples 2 --max-new-tokens 96 --out bench_out/quick

# The full offline suite on both embedded models, warm memory (the numbers in the README): the default
# configuration, then RECAP without each of its parts and the paper's RECAP vs ours at fixed budgets.
bench-full: $(VENV)/.installed
	for m in tiny-qwen2.5-vl tiny-llava-next; do \
	  $(BIN)/recap bench --model $$m --samples 10 --max-new-tokens 200 --out bench_out/$$m || exit 1; \
	  $(BIN)/recap bench --model $$m --samples 10 --max-new-tokens 200 --methods generate,token_recycling,recap \
	    --ablate --budgets 7,15,31,63 --no-costs --out bench_out/$$m-ablations || exit 1; \
	done

test: $(VENV)/.installed
	$(BIN)/python -m pytest

# RECAP inside vLLM (its own environment, vLLM 0.32 on the CPU), and the HF backend's lossless tests
# once more under the oldest transformers recap allows (5.19, vLLM's pin; `make test` runs the newest)
test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_RUN) -m pytest tests/in_vllm tests/test_vllm_plugin.py tests/test_lossless.py

# RECAP vs vLLM's ngram and suffix methods inside vLLM, both embedded models (the README's table)
bench-vllm: $(VLLM_VENV)/.installed
	$(VLLM_RUN) -m recap.vllm.bench --samples 5 --max-tokens 200 --batch 1,8 -k 4 --out bench_out/vllm

# A server restarted from its RECAP snapshot against the same server kept running, both embedded models
# (docs/vllm.md, "A restart from the snapshot, measured")
bench-vllm-restart: $(VLLM_VENV)/.installed
	for m in tiny-qwen2.5-vl tiny-llava-next; do \
	  $(VLLM_RUN) -m recap.vllm.restart_bench --model $$m --samples 5 --max-tokens 200 --batch 1,8 \
	    --out bench_out/vllm-restart-$$m || exit 1; \
	done

# ruff, and the import contracts of pyproject.toml's [tool.importlinter] (layers, no circles)
lint: $(VENV)/.installed
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools
	$(BIN)/lint-imports

# Host-side overhead of one RECAP step (63-node tree, k = 8), without a model.
overhead: $(VENV)/.installed
	$(BIN)/python benchmarks/host_overhead.py

# The checks for a GPU machine: lossless tests on CUDA, benches of both embedded models and the 7B shape in
# bf16, verify cost per tree size, one markdown report (gpu_check_out/gpu_check.md). Without CUDA it runs its
# CPU-safe parts. It uses .venv where there is one, else the machine's python3 (the device machine has torch
# and transformers preinstalled and builds no venv).
GPU_CHECK_PYTHON := $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	PYTHONPATH=src:. $(GPU_CHECK_PYTHON) -m tools.gpu_check
