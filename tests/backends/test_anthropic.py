"""AnthropicBackend against a loopback server that speaks the Messages API.

The real ``anthropic`` SDK sends real HTTP to `MessagesStub`, which records
every request body and answers with scripted messages, as JSON or as the SSE
event sequence Anthropic documents (message_start, content_block_start /
delta / stop, ping, message_delta, message_stop). So each test checks both
directions of the translation: what reached the wire, and what came back.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from plait.backends.anthropic import AnthropicBackend
from plait.backends.types import (
    Message,
    Request,
    ResponseSchema,
    SamplingOptions,
    StreamChunk,
    ToolCall,
    ToolSpec,
)
from plait.errors import (
    BackendConnectionError,
    BackendError,
    BackendTimeout,
    ConfigError,
    RateLimitError,
)

pytest.importorskip("anthropic")


@dataclass
class Failure:
    """An HTTP error answer."""

    status: int
    error_type: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class StreamFailure:
    """A 200 stream that breaks off with an SSE ``error`` event."""

    error_type: str


@dataclass
class Slow:
    """An answer that never comes while the client waits (released when the server stops)."""


def message(
    *content: dict[str, Any],
    stop_reason: str = "end_turn",
    input_tokens: int = 11,
    output_tokens: int = 7,
) -> dict[str, Any]:
    """Builds a Messages API reply with the given content blocks."""
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": list(content),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(id_: str, name: str, input_: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": name, "input": input_}


def _pieces(value: str, n: int = 3) -> list[str]:
    size = max(1, -(-len(value) // n))
    return [value[i : i + size] for i in range(0, len(value), size)]


def sse_events(reply: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Returns the event stream Anthropic sends for ``reply``, in its documented order."""
    start = {**reply, "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": reply["usage"]["input_tokens"], "output_tokens": 1}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(reply["content"]):
        if block["type"] == "text":
            opening = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in _pieces(block["text"])]
        else:
            opening = {**block, "input": {}}
            raw = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in _pieces(raw)]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
        )
        events.append(("ping", {"type": "ping"}))
        for delta in deltas:
            events.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reply["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": reply["usage"]["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


class MessagesStub:
    """Serves ``POST /v1/messages`` on loopback from a script of replies."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.replies: list[Any] = []
        self._runner: web.AppRunner | None = None
        self._release = asyncio.Event()
        self.base_url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/messages", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        reply = self.replies.pop(0)
        if isinstance(reply, Slow):
            await self._release.wait()
            return web.json_response(message(text("late")))
        if isinstance(reply, Failure):
            error = {"type": "error", "error": {"type": reply.error_type, "message": reply.message}}
            return web.json_response(error, status=reply.status, headers=reply.headers)
        if not body.get("stream"):
            return web.json_response(reply)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        if isinstance(reply, StreamFailure):
            events = sse_events(message(text("partial")))[:2]
            error = {"type": "error", "error": {"type": reply.error_type, "message": "Overloaded"}}
            events.append(("error", error))
        else:
            events = sse_events(reply)
        for name, data in events:
            await response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        await response.write_eof()
        return response


@pytest.fixture
async def stub() -> AsyncIterator[MessagesStub]:
    server = MessagesStub()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def backend(stub: MessagesStub) -> AsyncIterator[AnthropicBackend]:
    client = AnthropicBackend(
        "claude-test", api_key="test-key", base_url=stub.base_url, timeout=5.0
    )
    yield client
    await client.aclose()


WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather of a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
    "required": ["answer", "confidence"],
}


def ask(*messages: Message, **kwargs: Any) -> Request:
    return Request(messages=messages, **kwargs)


def sent_key(headers: dict[str, str]) -> str | None:
    """Returns the API key a request carried (older SDKs use x-api-key, 2.x a bearer token)."""
    if "x-api-key" in headers:
        return headers["x-api-key"]
    return headers.get("authorization", "").removeprefix("Bearer ") or None


async def collect(backend: AnthropicBackend, request: Request) -> list[StreamChunk]:
    return [chunk async for chunk in backend.stream(request)]


async def test_text_reply_and_what_reaches_the_wire(backend, stub):
    stub.replies.append(message(text("Paris."), input_tokens=21, output_tokens=3))
    request = ask(
        Message("system", "Answer in one word."),
        Message("user", "Capital of France?"),
        Message("assistant", "Which France?"),
        Message("user", "The country."),
        options=SamplingOptions(temperature=0.3, top_p=0.9, max_tokens=50, stop=("\n\n",), seed=7),
    )
    reply = await backend.complete(request)

    assert reply.text == "Paris."
    assert reply.finish_reason == "stop"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (21, 3)
    assert reply.model == "claude-test"
    (body,) = stub.received
    assert body["model"] == "claude-test"
    assert body["system"] == "Answer in one word."
    assert body["messages"] == [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Which France?"},
        {"role": "user", "content": "The country."},
    ]
    assert body["max_tokens"] == 50
    assert body["stop_sequences"] == ["\n\n"]
    assert body["temperature"] == 0.3
    assert body["top_p"] == 0.9
    assert "seed" not in body  # the Messages API has no seed
    assert "tools" not in body and "tool_choice" not in body
    assert sent_key(stub.headers[0]) == "test-key"


async def test_max_tokens_defaults_because_the_api_requires_it(stub):
    backend = AnthropicBackend(
        "claude-test", api_key="k", base_url=stub.base_url, max_tokens_default=321
    )
    stub.replies.append(message(text("ok")))
    await backend.complete(ask(Message("user", "hi"), model="claude-other"))
    await backend.aclose()
    assert stub.received[0]["max_tokens"] == 321
    assert stub.received[0]["model"] == "claude-other"


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("get_weather", {"type": "tool", "name": "get_weather"}),
        ("auto", {"type": "auto"}),
        ("required", {"type": "any"}),
        ("none", {"type": "none"}),
        (None, None),
    ],
)
async def test_tools_and_tool_choice_reach_the_wire(backend, stub, choice, wire):
    stub.replies.append(message(text("ok")))
    await backend.complete(ask(Message("user", "Weather?"), tools=(WEATHER,), tool_choice=choice))
    body = stub.received[0]
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "input_schema": WEATHER.parameters,
        }
    ]
    assert body.get("tool_choice") == wire


async def test_tool_use_reply_becomes_tool_calls(backend, stub):
    stub.replies.append(
        message(
            text("Let me check."),
            tool_use("toolu_1", "get_weather", {"city": "Paris"}),
            stop_reason="tool_use",
        )
    )
    reply = await backend.complete(
        ask(Message("user", "Weather in Paris?"), tools=(WEATHER,), tool_choice="auto")
    )
    assert reply.text == "Let me check."
    assert reply.finish_reason == "tool_calls"
    (call,) = reply.tool_calls
    assert (call.id, call.name) == ("toolu_1", "get_weather")
    assert json.loads(call.arguments) == {"city": "Paris"}


async def test_tool_calls_and_results_are_sent_as_blocks(backend, stub):
    stub.replies.append(message(text("Sunny in both.")))
    calls = (
        ToolCall("toolu_1", "get_weather", '{"city": "Paris"}'),
        ToolCall("toolu_2", "get_weather", '{"city": "Rome"}'),
    )
    await backend.complete(
        ask(
            Message("system", "Be brief."),
            Message("user", "Weather in Paris and Rome?"),
            Message("assistant", "Checking.", tool_calls=calls),
            Message("tool", "sunny, 21C", tool_call_id="toolu_1", name="get_weather"),
            Message("tool", "sunny, 25C", tool_call_id="toolu_2", name="get_weather"),
            tools=(WEATHER,),
        )
    )
    body = stub.received[0]
    assert body["system"] == "Be brief."
    assert body["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
        ],
    }
    # Both results answer one assistant turn, so they share the next user turn.
    assert body["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "sunny, 25C"},
        ],
    }
    assert len(body["messages"]) == 3


async def test_structured_output_forces_a_schema_tool(backend, stub):
    stub.replies.append(
        message(
            tool_use("toolu_9", "answer", {"answer": "Paris", "confidence": 0.9}),
            stop_reason="tool_use",
        )
    )
    reply = await backend.complete(
        ask(
            Message("user", "Capital of France?"),
            response_schema=ResponseSchema("answer", ANSWER_SCHEMA),
        )
    )
    assert json.loads(reply.text) == {"answer": "Paris", "confidence": 0.9}
    assert reply.tool_calls == ()
    assert reply.finish_reason == "stop"
    body = stub.received[0]
    assert body["tool_choice"] == {"type": "tool", "name": "answer"}
    assert body["tools"][0]["name"] == "answer"
    assert body["tools"][0]["input_schema"] == ANSWER_SCHEMA


async def test_structured_output_wraps_a_schema_that_is_not_an_object(backend, stub):
    schema = {"type": "array", "items": {"type": "string"}}
    stub.replies.append(
        message(tool_use("toolu_9", "colours", {"value": ["red", "blue"]}), stop_reason="tool_use")
    )
    reply = await backend.complete(
        ask(Message("user", "Two colours?"), response_schema=ResponseSchema("colours", schema))
    )
    assert json.loads(reply.text) == ["red", "blue"]
    assert stub.received[0]["tools"][0]["input_schema"] == {
        "type": "object",
        "properties": {"value": schema},
        "required": ["value"],
    }


async def test_streaming_reassembles_text_and_usage(backend, stub):
    reply = message(text("The quick brown fox jumps."), input_tokens=30, output_tokens=9)
    stub.replies.append(reply)
    chunks = await collect(backend, ask(Message("user", "A sentence?")))

    assert stub.received[0]["stream"] is True
    assert len([c for c in chunks if c.text]) >= 2
    assert "".join(c.text for c in chunks) == "The quick brown fox jumps."
    last = chunks[-1]
    assert last.finish_reason == "stop"
    assert last.usage is not None
    assert (last.usage.input_tokens, last.usage.output_tokens) == (30, 9)


async def test_streaming_assembles_tool_calls_and_structured_replies(backend, stub):
    stub.replies.append(
        message(
            text("Checking."),
            tool_use("toolu_1", "get_weather", {"city": "Paris"}),
            stop_reason="tool_use",
        )
    )
    chunks = await collect(backend, ask(Message("user", "Weather?"), tools=(WEATHER,)))
    calls = [call for c in chunks for call in c.tool_calls]
    assert [(c.id, c.name, json.loads(c.arguments)) for c in calls] == [
        ("toolu_1", "get_weather", {"city": "Paris"})
    ]
    assert chunks[-1].finish_reason == "tool_calls"

    stub.replies.append(
        message(
            tool_use("toolu_2", "answer", {"answer": "x", "confidence": 1}), stop_reason="tool_use"
        )
    )
    chunks = await collect(
        backend,
        ask(Message("user", "?"), response_schema=ResponseSchema("answer", ANSWER_SCHEMA)),
    )
    assert json.loads("".join(c.text for c in chunks)) == {"answer": "x", "confidence": 1}
    assert all(not c.tool_calls for c in chunks)


async def test_thunk_streams_through_the_backend(backend, stub):
    stub.replies.append(message(text("Hello there, friend.")))
    (thunk,) = backend.generate_from_raw([ask(Message("user", "Hi"))])
    pieces = [piece async for piece in thunk]
    assert "".join(pieces) == "Hello there, friend."
    assert thunk.usage is not None and thunk.usage.output_tokens == 7


async def test_429_becomes_rate_limit_error_with_retry_after(backend, stub):
    stub.replies.append(Failure(429, "rate_limit_error", "Slow down", headers={"retry-after": "7"}))
    with pytest.raises(RateLimitError, match="Slow down") as info:
        await backend.complete(ask(Message("user", "hi")))
    assert info.value.status == 429
    assert info.value.retryable
    assert info.value.retry_after == 7.0
    assert len(stub.received) == 1  # the SDK did not retry on its own


async def test_retry_after_ms_is_preferred(backend, stub):
    stub.replies.append(
        Failure(
            429, "rate_limit_error", "wait", headers={"retry-after-ms": "1500", "retry-after": "9"}
        )
    )
    with pytest.raises(RateLimitError) as info:
        await backend.complete(ask(Message("user", "hi")))
    assert info.value.retry_after == 1.5


async def test_400_is_not_retryable_and_names_the_endpoint(backend, stub):
    stub.replies.append(Failure(400, "invalid_request_error", "messages: field required"))
    with pytest.raises(BackendError, match="messages: field required") as info:
        await backend.complete(ask(Message("user", "hi")))
    assert info.value.status == 400
    assert not info.value.retryable
    assert "claude-test" in str(info.value)


@pytest.mark.parametrize(
    ("status", "error_type"), [(500, "api_error"), (529, "overloaded_error"), (503, "api_error")]
)
async def test_server_errors_are_retryable(backend, stub, status, error_type):
    stub.replies.append(Failure(status, error_type, "try later"))
    with pytest.raises(BackendError) as info:
        await backend.complete(ask(Message("user", "hi")))
    assert info.value.status == status
    assert info.value.retryable
    assert len(stub.received) == 1


async def test_x_should_retry_header_overrides_the_status(backend, stub):
    stub.replies.append(Failure(409, "api_error", "conflict", headers={"x-should-retry": "true"}))
    with pytest.raises(BackendError) as info:
        await backend.complete(ask(Message("user", "hi")))
    assert info.value.retryable


async def test_error_event_inside_a_stream_is_mapped(backend, stub):
    stub.replies.append(StreamFailure("overloaded_error"))
    with pytest.raises(BackendError) as info:
        await collect(backend, ask(Message("user", "hi")))
    assert info.value.status == 529
    assert info.value.retryable


async def test_stream_http_error_is_mapped(backend, stub):
    stub.replies.append(Failure(429, "rate_limit_error", "later", headers={"retry-after": "2"}))
    with pytest.raises(RateLimitError) as info:
        await collect(backend, ask(Message("user", "hi")))
    assert info.value.retry_after == 2.0


async def test_timeout_becomes_backend_timeout(backend, stub):
    stub.replies.append(Slow())
    with pytest.raises(BackendTimeout, match=r"0\.2 s") as info:
        await backend.complete(ask(Message("user", "hi"), timeout=0.2))
    assert info.value.retryable


async def test_refused_connection_becomes_connection_error(stub):
    await stub.stop()
    backend = AnthropicBackend("claude-test", api_key="k", base_url=stub.base_url)
    with pytest.raises(BackendConnectionError) as info:
        await backend.complete(ask(Message("user", "hi")))
    assert info.value.retryable
    await backend.aclose()


@pytest.mark.parametrize("refused", [False, True], ids=["400", "refused"])
async def test_credentials_in_base_url_show_in_no_repr_or_error(stub, refused):
    secret = "s3cr3t-KEY"
    url = stub.base_url.replace("http://", f"http://user:{secret}@") + f"?token={secret}"
    stub.replies.append(Failure(400, "invalid_request_error", "bad request"))
    if refused:
        await stub.stop()
    backend = AnthropicBackend("claude-test", api_key="k", base_url=url)
    with pytest.raises(BackendError) as info:
        await backend.complete(ask(Message("user", "hi")))
    await backend.aclose()
    assert "http://***:***@127.0.0.1" in str(info.value) and "token=***" in str(info.value)
    texts = [repr(backend)]
    error: BaseException | None = info.value
    while error is not None:
        texts += [str(error), repr(error)]
        error = error.__cause__
    assert all(secret not in text for text in texts), texts


async def test_unknown_tool_choice_is_refused_before_sending(backend, stub):
    with pytest.raises(BackendError, match="'get_time' is not among") as info:
        await backend.complete(ask(Message("user", "?"), tools=(WEATHER,), tool_choice="get_time"))
    assert not info.value.retryable
    assert stub.received == []


async def test_invalid_tool_arguments_in_history_are_refused(backend, stub):
    bad = Message("assistant", "", tool_calls=(ToolCall("t1", "get_weather", "{not json"),))
    with pytest.raises(BackendError, match=r"messages\[1\] calls tool 'get_weather'"):
        await backend.complete(
            ask(Message("user", "?"), bad, Message("tool", "x", tool_call_id="t1"))
        )


def test_missing_key_is_a_config_error(monkeypatch):
    monkeypatch.delenv("PLAIT_TEST_NO_KEY", raising=False)
    with pytest.raises(ConfigError, match="PLAIT_TEST_NO_KEY"):
        AnthropicBackend("claude-test", api_key_env="PLAIT_TEST_NO_KEY")


async def test_key_is_read_from_the_named_variable(monkeypatch, stub):
    monkeypatch.setenv("PLAIT_TEST_KEY", "from-env")
    backend = AnthropicBackend("claude-test", api_key_env="PLAIT_TEST_KEY", base_url=stub.base_url)
    stub.replies.append(message(text("ok")))
    await backend.complete(ask(Message("user", "hi")))
    await backend.aclose()
    assert sent_key(stub.headers[0]) == "from-env"


def test_importing_the_backend_does_not_import_the_sdk():
    code = (
        "import sys, plait.backends.anthropic; "
        "assert 'anthropic' not in sys.modules, 'SDK imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_astream_streams_an_anthropic_reply_piece_by_piece(stub):
    from plait import LLMInference, OutputStreamChunk, ResourceConfig

    stub.replies.append(message(text("The capital is Paris.")))
    config = ResourceConfig(
        {"*": {"provider": "anthropic", "model": "claude-test", "api_key": "k",
               "base_url": stub.base_url}}
    )  # fmt: skip
    program = LLMInference("llm").bind(config)
    events = [event async for event in program.astream("Capital of France?")]
    deltas = [e.delta for e in events if isinstance(e, OutputStreamChunk) and e.delta]
    assert len(deltas) == 3 and "".join(deltas) == "The capital is Paris."
    assert stub.received[0]["stream"] is True and events[-1] == "The capital is Paris."
