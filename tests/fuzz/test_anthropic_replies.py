"""Anthropic Messages API replies, whole and streamed, as they come over real HTTP.

The official SDK sends real requests to a loopback `RawServer` that answers
with fuzzed bytes; the call goes through `ResourceManager` and
`AnthropicBackend` into the readers of `plait.backends.anthropic._wire`. Any
reply must give a `Response` (or streamed chunks) or a `BackendError`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from plait.backends.types import Message, Request, ResponseSchema, ToolCall, ToolSpec
from plait.errors import BackendError
from plait.resources import ResourceManager

from .support import RawServer, documents, fuzz, json_text, mutated_bytes, outcome_async

pytest.importorskip("anthropic")

WEATHER = ToolSpec(
    name="weather",
    description="Weather of a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
ANSWER = ResponseSchema("answer", {"type": "object", "properties": {"answer": {"type": "string"}}})
WITH_TOOLS = Request(messages=(Message("user", "Weather?"),), tools=(WEATHER,), tool_choice="auto")
STRUCTURED = Request(messages=(Message("user", "Capital?"),), response_schema=ANSWER)


def message(*content: dict[str, Any], stop_reason: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": list(content),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 7, "cache_read_input_tokens": 2},
    }


TOOL_REPLY = message(
    {"type": "text", "text": "Let me check."},
    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
    stop_reason="tool_use",
)
STRUCTURED_REPLY = message(
    {"type": "tool_use", "id": "toolu_2", "name": "answer", "input": {"answer": "Paris"}},
    stop_reason="tool_use",
)
CASES = [(WITH_TOOLS, TOOL_REPLY), (STRUCTURED, STRUCTURED_REPLY)]


def stream_events(reply: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Returns the SSE events Anthropic sends for ``reply``, in its documented order."""
    start = {**reply, "content": [], "stop_reason": None, "usage": {"input_tokens": 11}}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(reply["content"]):
        if block["type"] == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            opening = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            ("content_block_start", {"type": "content_block_start", "index": index,
                                     "content_block": opening}),
            ("ping", {"type": "ping"}),
            ("content_block_delta", {"type": "content_block_delta", "index": index,
                                     "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]  # fmt: skip
    events += [
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": reply["stop_reason"]},
                           "usage": {"output_tokens": 7}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    return events


def sse_body(events: list[tuple[str, bytes]]) -> bytes:
    return b"".join(
        b"event: " + name.encode() + b"\ndata: " + data + b"\n\n" for name, data in events
    )


EVENT_NAMES = st.sampled_from(
    ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
     "message_delta", "message_stop", "ping", "error", "completion", "unknown"]
)  # fmt: skip


@st.composite
def streams(draw: st.DrawFn, reply: dict[str, Any]) -> bytes:
    """A stream near the valid one: one or more events edited, renamed, dropped or repeated."""
    events = stream_events(reply)
    wire = [(name, json_text(data)) for name, data in events]
    for _ in range(draw(st.integers(1, 3))):
        if not events:
            break
        position = draw(st.integers(0, len(events) - 1))
        edit = draw(st.sampled_from(["data", "name", "drop", "repeat"]))
        if edit == "data":
            wire[position] = (wire[position][0], draw(documents(events[position][1])))
        elif edit == "name":
            wire[position] = (draw(EVENT_NAMES), wire[position][1])
        elif edit == "drop":
            del events[position], wire[position]
        else:
            events.insert(position, events[position])
            wire.insert(position, wire[position])
    return sse_body(wire)


@dataclass
class Wire:
    server: RawServer
    manager: ResourceManager


def endpoint(server: RawServer, max_retries: int = 0) -> dict[str, Any]:
    return {
        "provider": "anthropic",
        "model": "claude-test",
        "api_key": "test-key",
        "base_url": server.base_url,
        "max_retries": max_retries,
        "retry_base_delay": 0.0,
        "timeout": 10,
    }


@pytest.fixture
async def wire() -> AsyncIterator[Wire]:
    async with RawServer() as server, ResourceManager({"llm": endpoint(server)}) as manager:
        yield Wire(server, manager)


@fuzz(100)
@given(case=st.sampled_from(CASES), data=st.data())
@example(case=CASES[0], data=None)
async def test_any_reply_body_is_a_response_or_a_backend_error(
    wire: Wire, case: tuple[Request, dict[str, Any]], data: st.DataObject | None
) -> None:
    request, reply = case
    body = json_text(reply) if data is None else data.draw(documents(reply))
    wire.server.answer(body)
    await outcome_async("Anthropic reply (whole)", lambda: wire.manager.complete("llm", request))


async def streamed(wire: Wire, request: Request) -> list[Any]:
    return [chunk async for chunk in wire.manager.stream("llm", request)]


@fuzz(100)
@given(case=st.sampled_from(CASES), data=st.data())
async def test_any_stream_gives_chunks_or_a_backend_error(
    wire: Wire, case: tuple[Request, dict[str, Any]], data: st.DataObject
) -> None:
    request, reply = case
    valid = sse_body([(name, json_text(d)) for name, d in stream_events(reply)])
    body = data.draw(
        st.one_of(streams(reply), mutated_bytes(valid, (b"event: ", b"data: ", b"\n\n")))
    )
    wire.server.answer(body, "text/event-stream")
    await outcome_async("Anthropic reply (stream)", lambda: streamed(wire, request))


# -- what the fuzzing found, pinned ---------------------------------------------------------

DEEP = b"[" * 100_000


def edited(reply: dict[str, Any], **fields: Any) -> bytes:
    return json_text({**reply, **fields})


BAD_REPLIES = {
    "empty body": (b"", "answered HTTP 200 with a body that is not JSON"),
    "cut short": (
        b'{"id": "msg_1", "content": [',
        "answered HTTP 200 with a body that is not JSON",
    ),
    "not UTF-8": (b"\x80", "answered HTTP 200 with a body that is not JSON"),
    "nested too deeply": (DEEP, "answered HTTP 200 with a body that is not JSON"),
    "a number too long": (b"1" * 5_000, "answered HTTP 200 with a body that is not JSON"),
    "a number": (b"0", "the reply is an integer, expected an object"),
    "no content": (b"{}", "content is null, expected a list"),
    "content is text": (edited(TOOL_REPLY, content="hi"), "content is a string, expected a list"),
    "a block is a number": (edited(TOOL_REPLY, content=[7]), "content[0] is an integer"),
    "text is a number": (
        edited(TOOL_REPLY, content=[{"type": "text", "text": 5}]),
        "content[0].text is an integer, expected a string",
    ),
    "tool input is a list": (
        edited(TOOL_REPLY, content=[{"type": "tool_use", "id": "t", "name": "w", "input": [1]}]),
        "content[0].input is a list, expected an object",
    ),
    "tokens as text": (
        edited(TOOL_REPLY, usage={"input_tokens": "11", "output_tokens": 7}),
        "usage.input_tokens is a string, expected an integer",
    ),
    "negative tokens": (
        edited(TOOL_REPLY, usage={"input_tokens": 1, "output_tokens": -7}),
        "usage.output_tokens is -7, expected an integer >= 0",
    ),
    "stop reason is a list": (
        edited(TOOL_REPLY, stop_reason=["end_turn"]),
        "stop_reason is a list, expected a string",
    ),
}


@pytest.mark.parametrize(("body", "problem"), BAD_REPLIES.values(), ids=BAD_REPLIES)
async def test_a_malformed_reply_is_a_backend_error_naming_the_field(
    wire: Wire, body: bytes, problem: str
) -> None:
    wire.server.answer(body)
    with pytest.raises(BackendError) as info:
        await wire.manager.complete("llm", WITH_TOOLS)
    message = str(info.value)
    assert "alias 'llm'" in message and "Anthropic endpoint" in message
    assert problem in message
    assert info.value.retryable is False


def stream_with(position: int, name: str, data: bytes) -> bytes:
    """The valid stream of TOOL_REPLY with event ``position`` replaced."""
    events = [(n, json_text(d)) for n, d in stream_events(TOOL_REPLY)]
    events[position] = (name, data)
    return sse_body(events)


BAD_STREAMS = {
    "start without message": (
        stream_with(0, "message_start", b'{"type": "message_start"}'),
        "streamed a malformed event (message_start.message is null, expected an object)",
    ),
    "block index is text": (
        stream_with(1, "content_block_start", b'{"type": "content_block_start", "index": "first", '
                    b'"content_block": {"type": "text", "text": ""}}'),
        "content_block_start.index is a string, expected an integer",
    ),
    "text delta is a number": (
        stream_with(3, "content_block_delta", b'{"type": "content_block_delta", "index": 0, '
                    b'"delta": {"type": "text_delta", "text": 5}}'),
        "content_block_delta.delta.text is an integer, expected a string",
    ),
    "usage as text": (
        stream_with(-2, "message_delta", b'{"type": "message_delta", "delta": {}, '
                    b'"usage": {"output_tokens": "seven"}}'),
        "message_delta.usage.output_tokens is a string, expected an integer",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("body", "problem"), BAD_STREAMS.values(), ids=BAD_STREAMS)
async def test_a_malformed_stream_event_is_a_backend_error_naming_the_field(
    wire: Wire, body: bytes, problem: str
) -> None:
    wire.server.answer(body, "text/event-stream")
    with pytest.raises(BackendError) as info:
        await streamed(wire, WITH_TOOLS)
    message = str(info.value)
    assert "alias 'llm'" in message and "Anthropic endpoint" in message
    assert problem in message
    assert info.value.retryable is False


GARBLED_STREAMS = {
    "not JSON": stream_with(1, "content_block_start", b'{"type": "content_block_start",'),
    "not UTF-8": stream_with(1, "content_block_start", b'{"type": "\xff"}'),
    "nested too deeply": stream_with(1, "content_block_start", DEEP),
    "a number too long": stream_with(1, "content_block_start", b"1" * 5_000),
}


@pytest.mark.parametrize("body", GARBLED_STREAMS.values(), ids=GARBLED_STREAMS)
async def test_a_garbled_stream_event_is_retried_then_a_backend_error(body: bytes) -> None:
    async with RawServer() as server:
        server.answer(body, "text/event-stream")
        async with ResourceManager({"llm": endpoint(server, max_retries=1)}) as manager:
            with pytest.raises(
                BackendError, match="streamed an event that is not UTF-8 JSON"
            ) as info:
                await streamed(Wire(server, manager), WITH_TOOLS)
        # Garbled bytes may be a damaged transfer: retried, within max_retries.
        assert server.requests == 2
    assert "gave up after 2 attempts" in str(info.value)
    assert "Anthropic endpoint" in str(info.value)


async def test_a_structured_reply_streamed_nested_too_deeply_comes_as_sent(wire: Wire) -> None:
    nested = "[" * 100_000
    events = stream_events(STRUCTURED_REPLY)
    events[3] = (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "input_json_delta", "partial_json": nested}},
    )  # fmt: skip
    wire.server.answer(sse_body([(n, json_text(d)) for n, d in events]), "text/event-stream")
    chunks = await streamed(wire, STRUCTURED)
    # Not JSON that can be read: shown as sent, for the structured parse to refuse.
    assert "".join(chunk.text for chunk in chunks) == nested


async def test_an_earlier_tool_call_nested_too_deeply_is_a_backend_error(wire: Wire) -> None:
    call = ToolCall("toolu_1", "weather", '{"city": ' + "[" * 100_000)
    request = Request(
        messages=(
            Message("user", "Weather?"),
            Message("assistant", "", tool_calls=(call,)),
            Message("tool", "sunny", tool_call_id="toolu_1"),
        ),
        tools=(WEATHER,),
    )
    with pytest.raises(BackendError, match="arguments that are not a JSON object"):
        await wire.manager.complete("llm", request)
    assert wire.server.requests == 0


ERROR_BODY = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


@fuzz(100)
@given(
    status=st.integers(400, 599),
    body=documents(ERROR_BODY),
    as_stream=st.booleans(),
)
async def test_any_error_answer_is_a_backend_error(
    wire: Wire, status: int, body: bytes, as_stream: bool
) -> None:
    wire.server.answer(body, status=status)
    if as_stream:
        error = await outcome_async("Anthropic error answer", lambda: streamed(wire, WITH_TOOLS))
    else:
        error = await outcome_async(
            "Anthropic error answer", lambda: wire.manager.complete("llm", WITH_TOOLS)
        )
    assert isinstance(error, BackendError) and error.status == status


async def test_an_error_body_nested_too_deeply_is_still_a_backend_error(wire: Wire) -> None:
    # JSON the SDK reads (about 1,000 levels) but orjson does not write (255).
    wire.server.answer(b"[" * 300 + b"1" + b"]" * 300, status=400)
    with pytest.raises(BackendError) as info:
        await wire.manager.complete("llm", WITH_TOOLS)
    assert info.value.status == 400
    assert "[[[[[" in str(info.value)
