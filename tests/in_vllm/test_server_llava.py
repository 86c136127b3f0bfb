"""The embedded LLaVA-NeXT behind ``vllm serve`` with RECAP (``speculative_config(k=4)``): 16
concurrent streaming chat requests with images, every answer (text, token ids, finish reason,
completion tokens) equal to the same server's without speculation. The Qwen2.5-VL server tests
(tests/in_vllm/test_server.py) cover the rest; this checks the other embedded family's image path."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (bash scripts/setup-vllm-venv.sh)")
pytest.importorskip("openai", reason="the openai client comes with vLLM")

from openai_server import eventually, messages, running, streams  # noqa: E402

import recap.vllm  # noqa: E402
from recap.bench.workloads import suite_requests  # noqa: E402

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    chain = json.dumps(recap.vllm.speculative_config(k=4))
    plans = {
        "reference": (["--max-model-len", "2048"], None),
        "recap": (["--max-model-len", "2048", "--speculative-config", chain], None),
    }
    with running(recap.vllm.model_path("tiny-llava-next"), plans, tmp_path_factory.mktemp("servers")) as started:
        yield started


def test_llava_16_concurrent_streams_with_images_equal_the_server_without_speculation(servers) -> None:
    many = [messages(r) for r in suite_requests("all", 2, 0)]
    reference = streams(servers["reference"], many, max_tokens=48)
    answers = streams(servers["recap"], many, max_tokens=48)
    assert answers == reference
    assert all(a.token_ids and len(a.token_ids) == a.completion_tokens for a in reference)
    assert eventually(lambda: servers["recap"].metric(ACCEPTED) > 0), "RECAP drafted nothing vLLM accepted"
