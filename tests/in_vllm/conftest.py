"""vLLM tests: they run where vLLM imports (``bash scripts/setup-vllm-venv.sh``, then
``.venv-vllm/bin/python -m pytest tests/in_vllm``) and are skipped in recap's main environment."""

from recap.vllm.bench import engine_env

engine_env()  # before vLLM is imported: the engine runs in this process


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped elsewhere)")
