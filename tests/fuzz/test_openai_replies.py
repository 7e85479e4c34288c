"""OpenAI-compatible replies, whole and streamed, as they come over real HTTP.

The scripted server puts each fuzzed body on the wire byte for byte
(`RawReply`); the call goes through `ResourceManager` and the backend's real
transport (plait's HTTP client, or the official SDK) into the readers of
`plait.backends.openai._wire`. Any reply must give a `Response` (or streamed
chunks) or a `BackendError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from plait.backends.types import Message, Request
from plait.errors import BackendError
from plait.resources import ResourceManager
from plait.testing import RawReply, ScriptedServer
from plait.testing._replies import Reply, completion_payload, stream_events

from .support import documents, fuzz, json_text, mutated_bytes, mutated_json, outcome_async
from .test_sse import SSE_FRAGMENTS, VALID_BODY

REPLY = Reply(
    content="It is sunny.",
    tool_calls=[{"id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'}],
    finish_reason="tool_calls",
    usage={"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
)
COMPLETION = completion_payload(REPLY, model="m", request_id="r1", created=1)
EVENTS = stream_events(REPLY, model="m", request_id="r1", created=1, pieces=2, include_usage=True)
SSE = {"Content-Type": "text/event-stream"}


@dataclass
class Script:
    """The reply the server gives next (one per example)."""

    answer: RawReply = field(default_factory=RawReply)


@dataclass
class Wire:
    script: Script
    manager: ResourceManager


@contextlib.asynccontextmanager
async def scripted_wire(**options: Any) -> AsyncIterator[Wire]:
    """A scripted server answering with ``Script.answer``, and a manager with one endpoint on it."""
    script = Script()
    async with ScriptedServer(responder=lambda body: script.answer, keep_log=False) as server:
        entry = server.endpoint(max_retries=0, timeout=10, **options)
        async with ResourceManager({"llm": entry}) as manager:
            yield Wire(script, manager)


@pytest.fixture(params=["http", "sdk"])
async def wire(request: pytest.FixtureRequest) -> AsyncIterator[Wire]:
    async with scripted_wire(transport=request.param) as ready:
        yield ready


ASK = Request(messages=(Message("user", "Weather in Paris?"),))


async def complete(wire: Wire) -> Any:
    return await wire.manager.complete("llm", ASK)


async def stream(wire: Wire) -> list[Any]:
    return [chunk async for chunk in wire.manager.stream("llm", ASK)]


@fuzz(150)
@given(body=documents(COMPLETION))
@example(body=orjson.dumps(COMPLETION))
async def test_any_reply_body_is_a_response_or_a_backend_error(wire: Wire, body: bytes) -> None:
    wire.script.answer = RawReply(body)
    await outcome_async("OpenAI reply (whole)", lambda: complete(wire))


def event_lists() -> st.SearchStrategy[list[bytes]]:
    """Streams near the valid one: an edited event among valid ones, or random events."""
    valid = [orjson.dumps(e) for e in EVENTS]

    @st.composite
    def one_edited(draw: st.DrawFn) -> list[bytes]:
        position = draw(st.integers(0, len(EVENTS) - 1))
        edited = draw(documents(EVENTS[position]))
        return [*valid[:position], edited, *valid[position + 1 :]]

    @st.composite
    def all_edited(draw: st.DrawFn) -> list[bytes]:
        return [json_text(draw(mutated_json(event))) for event in EVENTS]

    return st.one_of(one_edited(), st.lists(st.binary(max_size=60), max_size=5), all_edited())


@fuzz(150)
@given(events=event_lists())
async def test_any_stream_of_events_gives_chunks_or_a_backend_error(
    wire: Wire, events: list[bytes]
) -> None:
    wire.script.answer = RawReply(stream_events=events)
    await outcome_async("OpenAI reply (stream events)", lambda: stream(wire))


@fuzz(100)
@given(body=st.one_of(st.binary(max_size=300), mutated_bytes(VALID_BODY, SSE_FRAGMENTS)))
async def test_any_streamed_body_gives_chunks_or_a_backend_error(wire: Wire, body: bytes) -> None:
    wire.script.answer = RawReply(body, headers=SSE)
    await outcome_async("OpenAI reply (SSE body)", lambda: stream(wire))


# -- what the fuzzing found, pinned ---------------------------------------------------------

NESTED_ARGUMENTS = b'{"a": ' * 300 + b"1" + b"}" * 300
"""Tool-call arguments sent as an object (not JSON text) nested 300 levels deep."""


async def test_tool_arguments_nested_too_deeply_are_a_backend_error(wire: Wire) -> None:
    function = b'{"name": "weather", "arguments": ' + NESTED_ARGUMENTS + b"}"
    body = (
        b'{"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": '
        b'[{"id": "call_1", "type": "function", "function": ' + function + b"}]}}]}"
    )
    wire.script.answer = RawReply(body)
    with pytest.raises(BackendError) as info:
        await complete(wire)
    assert "choices[0].message.tool_calls[0].function.arguments is nested too deeply" in str(
        info.value
    )
    assert info.value.retryable is False


async def test_streamed_tool_arguments_nested_too_deeply_are_a_backend_error(wire: Wire) -> None:
    fragment = b'{"index": 0, "id": "c", "function": {"name": "w", "arguments": '
    event = b'{"choices": [{"delta": {"tool_calls": [' + fragment + NESTED_ARGUMENTS + b"}}]}}]}"
    wire.script.answer = RawReply(stream_events=[event])
    with pytest.raises(BackendError) as info:
        await stream(wire)
    assert "choices[0].delta.tool_calls[0].function.arguments is nested too deeply" in str(
        info.value
    )


ERROR_BODY = {"error": {"message": "Rate limited", "type": "rate_limit_error", "code": None}}
RETRY_AFTER = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["1", "0.5", "-3", "inf", "nan", "1e400", "Wed, 21 Oct 2015 07:28:00 GMT"]),
)


@pytest.fixture
async def error_wire() -> AsyncIterator[Wire]:
    # A Retry-After the endpoint would wait for must not stall the next input.
    async with scripted_wire(max_retry_after=0.01) as ready:
        yield ready


@fuzz(150)
@given(
    status=st.integers(400, 599),
    body=documents(ERROR_BODY),
    retry_after=st.none() | RETRY_AFTER,
    streamed=st.booleans(),
)
async def test_any_error_answer_is_a_backend_error(
    error_wire: Wire, status: int, body: bytes, retry_after: str | None, streamed: bool
) -> None:
    headers = {"Content-Type": "application/json"}
    if retry_after is not None and retry_after.isprintable() and retry_after.isascii():
        headers["Retry-After"] = retry_after.strip() or "0"
    error_wire.script.answer = RawReply(body, status=status, headers=headers)
    call = (lambda: stream(error_wire)) if streamed else (lambda: complete(error_wire))
    error = await outcome_async("OpenAI error answer", call)
    assert isinstance(error, BackendError) and error.status == status


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
async def test_an_error_body_nested_too_deeply_is_still_a_backend_error(
    error_wire: Wire, streamed: bool
) -> None:
    body = b"[" * 300 + b"1" + b"]" * 300  # JSON orjson reads (1024 levels), not writes (255)
    error_wire.script.answer = RawReply(body, status=400)
    with pytest.raises(BackendError) as info:
        await (stream(error_wire) if streamed else complete(error_wire))
    assert info.value.status == 400
    assert "HTTP 400 Bad Request: [[[[[" in str(info.value)
