"""RECAP behind vLLM's OpenAI-compatible server, started with ``vllm serve`` (docs/vllm.md) and
driven by the ``openai`` client: chat completions with images at temperature 0 on the embedded
Qwen2.5-VL, every answer (text, token ids, finish reason, completion tokens) equal to the same
request on the server without speculation.

Three servers, started once for the module: the reference (no speculation); RECAP's chain
(``speculative_config(k=4)``, vLLM's default multiprocess engine) with vLLM's per-request
spec-decode metrics and RECAP's DEBUG lines (each request's begin and end with the number of
requests live); RECAP's tree mode (32 nodes) with a KV cache of 640 tokens and
``--max-model-len 512``, so that concurrent requests are preempted and a request can reach the
length limit. The two others run the engine without its worker process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, tests/in_vllm/conftest.py), which starts faster."""

from __future__ import annotations

import asyncio
import base64
import json
import re

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (bash scripts/setup-vllm-venv.sh)")
openai = pytest.importorskip("openai", reason="the openai client comes with vLLM")

from openai_server import Server, ask, count_tokens, eventually, messages, request_params, running, streams  # noqa: E402

import recap.vllm  # noqa: E402
from recap.bench.workloads import suite_requests  # noqa: E402

MODEL = "tiny-qwen2.5-vl"
MAX_TOKENS = 48
RECAP_LEN = 2048  # the reference's and RECAP's chain server's max_model_len
SMALL_LEN = 512  # the tree server's max_model_len
SMALL_KV = ["--block-size", "32", "--num-gpu-blocks-override", "20"]  # 640 tokens: ~3 of 12 requests fit
# JSON without free whitespace: the tiny model would fill a schema's whitespace up to max_tokens
JSON_CONFIG = ["--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}']
METRICS = ["--per-request-spec-decode-metrics", "summary"]
LIVE = re.compile(r"recap\.vllm: request (\S+) (began|ended); (\d+) requests live")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    chain, tree = (json.dumps(recap.vllm.speculative_config(k=4)), json.dumps(recap.vllm.speculative_config(tree=32)))
    plans = {
        "reference": ([*JSON_CONFIG, "--max-model-len", str(RECAP_LEN)], None),
        "recap": (
            [*JSON_CONFIG, "--max-model-len", str(RECAP_LEN), "--speculative-config", chain, *METRICS],
            {"RECAP_VLLM_LOG_LEVEL": "DEBUG", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
        ),
        "tree": (
            [*JSON_CONFIG, "--max-model-len", str(SMALL_LEN), *SMALL_KV, "--speculative-config", tree, *METRICS],
            None,
        ),
    }
    with running(recap.vllm.model_path(MODEL), plans, tmp_path_factory.mktemp("servers")) as started:
        yield started


COUNTERS = {  # vLLM's Prometheus counter -> the per-request figure that sums to it
    "vllm:spec_decode_num_drafts_total": "num_spec_steps",
    "vllm:spec_decode_num_draft_tokens_total": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "num_accepted_draft_tokens",
}


def _counters(server: Server) -> dict[str, float]:
    return {name: server.metric(name) for name in COUNTERS}


def _live_lines(server: Server, start: int) -> list[tuple[str, str, int]]:
    return [(m[1], m[2], int(m[3])) for m in LIVE.finditer(server.text()[start:])]


# -- the tests ----------------------------------------------------------------------------------
def test_16_concurrent_streams_with_images_equal_the_server_without_speculation(servers) -> None:
    """16 concurrent streaming requests with images (8 families x 2): equal to the reference; vLLM's
    per-request acceptance figures (``metrics.speculative_decoding``, 0.32's
    ``--per-request-spec-decode-metrics``) add up to its Prometheus counters."""
    many = [messages(r) for r in suite_requests("all", 2, 0)]
    reference = streams(servers["reference"], many, max_tokens=MAX_TOKENS)
    before = _counters(servers["recap"])
    answers = streams(servers["recap"], many, max_tokens=MAX_TOKENS)
    assert answers == reference
    assert {a.finish_reason for a in reference} == {"stop", "length"} and all(a.token_ids for a in reference)
    assert all(len(a.token_ids) == a.completion_tokens for a in answers)

    figures = [a.metrics for a in answers]
    assert all(f is not None for f in figures), "a response without metrics.speculative_decoding"
    for f, answer in zip(figures, answers):
        hist = f["acceptance_histogram"]
        assert sum(hist) == f["num_spec_steps"] <= answer.completion_tokens
        assert sum(j * n for j, n in enumerate(hist)) == f["num_accepted_draft_tokens"] <= f["num_draft_tokens"]
        if f["num_spec_steps"]:
            assert f["mean_acceptance_length"] == pytest.approx(
                1 + f["num_accepted_draft_tokens"] / f["num_spec_steps"]
            )
        if f["num_draft_tokens"]:
            assert f["draft_acceptance_rate"] == pytest.approx(f["num_accepted_draft_tokens"] / f["num_draft_tokens"])
    sums = {name: sum(f[key] for f in figures) for name, key in COUNTERS.items()}
    assert sums["vllm:spec_decode_num_accepted_tokens_total"] > 0, "RECAP drafted nothing vLLM accepted"

    def moved():
        after = _counters(servers["recap"])
        return {name: after[name] - before[name] for name in COUNTERS}

    assert eventually(lambda: moved() == sums), (moved(), sums)


def test_prometheus_spec_decode_counters_move(servers) -> None:
    server = servers["recap"]
    before = _counters(server)
    request = suite_requests("describe", 1, 3)[0]
    assert ask(server, messages(request), max_tokens=MAX_TOKENS) == ask(
        servers["reference"], messages(request), max_tokens=MAX_TOKENS
    )

    def moved():
        after = _counters(server)
        return [after[name] - before[name] for name in COUNTERS]

    assert eventually(lambda: moved()[0] > 0), "vllm:spec_decode_num_drafts_total did not move"
    drafts, tokens, accepted = moved()
    assert 0 < drafts <= tokens and 0 <= accepted <= tokens
    per_position = server.metric("vllm:spec_decode_num_accepted_tokens_per_pos_total")
    assert per_position == server.metric("vllm:spec_decode_num_accepted_tokens_total")


def test_clients_that_disconnect_mid_stream_leave_no_request_state_behind(servers) -> None:
    """30 streams closed after 3 chunks (3 waves of 10): vLLM aborts them, the RECAP proposer frees
    each request's drafter when vLLM frees the request (its DEBUG lines: as many ends as begins, 0
    live at the end); then a request is served equal to the reference.

    Whether a closed stream is aborted or runs to its end first is a race between the client (which
    shares two cores with three servers) and the engine: each stream asks for as many tokens as the
    server allows (no EOS), and most streams (not all) must have been aborted, so that the test
    exercises aborts; a drafter is freed either way (seen on one CI machine: 7 of 30 streams of 1500
    tokens finished before their client's abort arrived)."""
    server = servers["recap"]
    requests = suite_requests("describe", 10, 1)
    start = len(server.text())
    finished = {
        reason: server.metric("vllm:request_success_total", finished_reason=reason) for reason in ("stop", "length")
    }

    chats = [messages(r) for r in requests]
    longest = [RECAP_LEN - count_tokens(server, chat) for chat in chats]  # up to max_model_len: far beyond 3 chunks

    async def close_after_3_chunks(client, chat, max_tokens: int) -> int:
        long = {"max_tokens": max_tokens, "extra_body": {"return_token_ids": True, "ignore_eos": True}}
        stream = await client.chat.completions.create(messages=chat, stream=True, **request_params(long))
        chunks = 0
        async for _ in stream:
            chunks += 1
            if chunks == 3:
                break
        await stream.close()
        return chunks

    async def waves():
        async with server.async_client(timeout=300) as client:
            for _ in range(3):
                got = await asyncio.gather(*[close_after_3_chunks(client, *job) for job in zip(chats, longest)])
                assert got == [3] * len(requests)

    asyncio.run(waves())

    def settled() -> bool:  # 30 begins and 30 ends logged
        lines = _live_lines(server, start)
        return len(lines) >= 60 and lines[-1][2] == 0

    eventually(settled, seconds=60)  # a stream that ran to its end takes a few seconds
    lines = _live_lines(server, start)
    began = [r for r, what, _ in lines if what == "began"]
    ended = [r for r, what, _ in lines if what == "ended"]
    assert len(began) == 30 and sorted(began) == sorted(ended), "a request's drafter was never freed"
    assert lines[-1][2] == 0
    ran_to_the_end = {
        reason: server.metric("vllm:request_success_total", finished_reason=reason) - finished[reason]
        for reason in finished
    }
    assert sum(ran_to_the_end.values()) < len(began) / 2, (
        f"most streams finished instead of being aborted: {ran_to_the_end}"
    )

    chat = chats[0]
    assert ask(server, chat, max_tokens=MAX_TOKENS) == ask(servers["reference"], chat, max_tokens=MAX_TOKENS)
    assert eventually(lambda: _live_lines(server, start)[-1][2] == 0)


def test_forced_preemption_keeps_the_output_equal(servers) -> None:
    """12 concurrent requests on a KV cache where ~3 fit, tree mode: vLLM preempts requests (and
    recomputes them later) and every answer equals the reference."""
    server = servers["tree"]
    many = [messages(r) for r in suite_requests("all", 2, 2)[:12]]
    preemptions = server.metric("vllm:num_preemptions_total")
    answers = streams(server, many, max_tokens=64)
    assert answers == streams(servers["reference"], many, max_tokens=64)
    assert eventually(lambda: server.metric("vllm:num_preemptions_total") > preemptions), "nothing was preempted"


def test_a_request_that_reaches_max_model_len(servers) -> None:
    """A prompt 8-30 tokens below the tree server's max_model_len (512), no max_tokens: the answer
    stops at the limit ("length") equal to the reference's with that many tokens; asked again (warm
    memory), RECAP's drafts are accepted there too (vLLM skips a proposer whose drafts pass the
    drafter's length limit, and tree mode's 32 drafts did from 64 tokens before the end)."""
    server = servers["tree"]
    request = suite_requests("describe", 1, 0)[0]  # a description keeps going when its question repeats

    def repeated(times: int):
        return messages(request, " ".join([request.prompt] * times))

    times = 1
    while count_tokens(server, repeated(times + 1)) <= SMALL_LEN - 8:
        times += 1
    prompt = count_tokens(server, repeated(times))
    assert SMALL_LEN - 30 <= prompt <= SMALL_LEN - 8
    reference = ask(servers["reference"], repeated(times), max_tokens=SMALL_LEN - prompt)
    assert reference.finish_reason == "length" and reference.completion_tokens == SMALL_LEN - prompt
    cold, warm = ask(server, repeated(times)), ask(server, repeated(times))
    assert cold == reference and warm == reference
    assert warm.metrics["num_accepted_draft_tokens"] > 0, "no draft accepted in the last tokens before the limit"


def test_max_tokens_1_and_stop_strings(servers) -> None:
    """max_tokens=1, and stop strings that occur in the reference's answers: the answer is cut
    exactly where the reference's is (before the stop string's first occurrence), chain and tree."""
    requests = suite_requests("all", 1, 4)
    for request in requests[:3]:
        one = ask(servers["reference"], messages(request), max_tokens=1)
        assert one.completion_tokens == 1
        for name in ("recap", "tree"):
            assert ask(servers[name], messages(request), max_tokens=1) == one, name
    cuts = 0
    for request in requests:
        full = ask(servers["reference"], messages(request), max_tokens=MAX_TOKENS).text
        words = [m for m in re.finditer(r"\w{3,}", full) if m.start() > len(full) // 3]
        if not words:
            continue  # a short answer
        stop = words[0][0]
        reference = ask(servers["reference"], messages(request), max_tokens=MAX_TOKENS, stop=[stop])
        assert reference.finish_reason == "stop" and reference.text == full[: full.index(stop)]
        for name in ("recap", "tree"):
            assert ask(servers[name], messages(request), max_tokens=MAX_TOKENS, stop=[stop]) == reference, name
        cuts += 1
    assert cuts >= 3, "too few answers long enough to cut"


SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"type": "string", "enum": ["red", "green", "blue", "yellow", "black", "white", "purple"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["color", "count"],
    "additionalProperties": False,
}


def test_structured_output_with_a_json_schema(servers) -> None:
    """response_format json_schema: the same JSON as the reference, chain and tree (tree mode drafts
    such a request as a chain, and says so once)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    start = len(servers["tree"].text())
    for request in suite_requests("mmt", 2, 5):
        reference = ask(servers["reference"], messages(request), max_tokens=64, response_format=fmt)
        assert reference.finish_reason == "stop"
        assert set(json.loads(reference.text)) == {"color", "count"}
        for name in ("recap", "tree"):
            assert ask(servers[name], messages(request), max_tokens=64, response_format=fmt) == reference, name
    assert "is drafted as a chain: structured output" in servers["tree"].text()[start:]


def test_an_image_that_does_not_load_gets_vllms_error_and_the_next_request_is_served(servers) -> None:
    """Garbage bytes in a PNG data URL: vLLM's 400, as without speculation; an image URL on a port
    nobody listens on: vLLM's error for it (a 500 in 0.32); then a request is served equal to the
    reference."""
    garbage = "data:image/png;base64," + base64.b64encode(b"not a png" * 16).decode()
    unreachable = "http://127.0.0.1:9/image.png"
    request = suite_requests("ocr", 1, 6)[0]

    def with_image(url):
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": request.prompt}]
        return [{"role": "user", "content": content}]

    errors = {}
    for name in ("reference", "recap"):
        with pytest.raises(openai.BadRequestError) as raised:
            ask(servers[name], with_image(garbage), max_tokens=8)
        errors[name] = raised.value.status_code
    assert errors == {"reference": 400, "recap": 400}
    with pytest.raises(openai.APIStatusError, match="127.0.0.1"):
        ask(servers["recap"], with_image(unreachable), max_tokens=8)
    chat = messages(request)
    assert ask(servers["recap"], chat, max_tokens=MAX_TOKENS) == ask(servers["reference"], chat, max_tokens=MAX_TOKENS)
