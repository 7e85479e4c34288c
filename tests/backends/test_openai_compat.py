"""OpenAICompatBackend against the scripted server over real loopback HTTP.

Every behaviour test runs twice, once per transport (plait's own HTTP client and
the official SDK), and asserts on what the server received and answered, so
both transports are held to one contract.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from email.utils import formatdate
from typing import Any

import pytest

from plait.backends._urls import basic_authorization
from plait.backends.openai import OpenAICompatBackend
from plait.backends.types import (
    Message,
    Request,
    ResponseSchema,
    SamplingOptions,
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
from plait.porting.mellea import Context
from plait.testing import Fault, ScriptedServer, start_server_process

SCHEMA = ResponseSchema(
    name="person",
    schema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    strict=True,
)
WEATHER = ToolSpec(
    name="weather",
    description="Looks up the weather.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


def ask(text: str = "hello world", **fields: Any) -> Request:
    return Request(messages=(Message("user", text),), **fields)


@pytest.fixture(params=["http", "sdk"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def connect(transport: str):
    """Returns ``connect(server, **options)``; every backend made is closed at teardown."""
    made: list[OpenAICompatBackend] = []

    def make(server: ScriptedServer, model: str = "test-model", **options: Any):
        options.setdefault("base_url", server.base_url)
        backend = OpenAICompatBackend(model, transport=transport, **options)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.aclose()


async def collect(backend: OpenAICompatBackend, request: Request) -> list[Any]:
    return [chunk async for chunk in backend.stream(request)]


# -- text ----------------------------------------------------------------------------


async def test_text_reply_with_usage_finish_reason_and_model(connect):
    async with ScriptedServer() as server:
        reply = await connect(server).complete(ask("hello world"))
    assert reply.text == "echo: hello world"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (2, 3)
    assert reply.finish_reason == "stop"
    assert reply.model == "test-model"
    assert reply.tool_calls == ()


async def test_every_sampling_option_reaches_the_wire(connect):
    options = SamplingOptions(
        temperature=0.25,
        max_tokens=50,
        top_p=0.5,
        stop=("END",),
        seed=7,
        presence_penalty=0.1,
        frequency_penalty=0.2,
    )
    async with ScriptedServer() as server:
        await connect(server).complete(ask(options=options, model="override"))
    body = server.stats.log[0].body
    assert body["model"] == "override"
    assert body["messages"] == [{"role": "user", "content": "hello world"}]
    for name, value in {
        "temperature": 0.25,
        "max_tokens": 50,
        "top_p": 0.5,
        "stop": ["END"],
        "seed": 7,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
    }.items():
        assert body[name] == value, name
    assert "stream" not in body and "response_format" not in body and "tools" not in body


@pytest.mark.parametrize(
    ("dialect", "field"),
    [("openai", "max_completion_tokens"), ("llama_cpp", "max_tokens"), (None, "max_tokens")],
)
async def test_token_limit_field_follows_the_dialect(connect, dialect, field):
    async with ScriptedServer() as server:
        await connect(server, dialect=dialect).complete(ask(options=SamplingOptions(max_tokens=5)))
    body = server.stats.log[0].body
    assert body[field] == 5
    assert {"max_tokens", "max_completion_tokens"} - {field} - set(body) == {
        "max_tokens",
        "max_completion_tokens",
    } - {field}


async def test_conversation_with_tool_turns_reaches_the_wire_in_openai_shape(connect):
    call = ToolCall(id="call_1", name="weather", arguments='{"city": "Oslo"}')
    request = Request(
        messages=(
            Message("system", "Be brief."),
            Message("user", "Weather in Oslo?"),
            Message("assistant", "", tool_calls=(call,)),
            Message("tool", "rain", tool_call_id="call_1", name="weather"),
        ),
        tools=(WEATHER,),
        tool_choice="weather",
    )
    async with ScriptedServer() as server:
        await connect(server).complete(request)
    body = server.stats.log[0].body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "content": "rain", "tool_call_id": "call_1", "name": "weather"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Looks up the weather.",
                "parameters": WEATHER.parameters,
            },
        }
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "weather"}}


async def test_keyword_tool_choice_is_sent_as_a_string(connect):
    async with ScriptedServer() as server:
        await connect(server).complete(ask(tools=(WEATHER,), tool_choice="required"))
    assert server.stats.log[0].body["tool_choice"] == "required"


# -- tool calls ------------------------------------------------------------------------

TWO_CALLS = {
    "tool_calls": [
        {"id": "call_a", "name": "weather", "arguments": {"city": "Oslo"}},
        {"id": "call_b", "name": "clock", "arguments": {"zone": "UTC", "format": "24h"}},
    ]
}


async def test_tool_calls_are_parsed(connect):
    async with ScriptedServer(responder=lambda body: TWO_CALLS) as server:
        reply = await connect(server).complete(ask(tools=(WEATHER,)))
    assert reply.text == ""
    assert reply.finish_reason == "tool_calls"
    assert [(c.id, c.name) for c in reply.tool_calls] == [
        ("call_a", "weather"),
        ("call_b", "clock"),
    ]
    assert json.loads(reply.tool_calls[1].arguments) == {"zone": "UTC", "format": "24h"}


async def test_streamed_tool_call_fragments_are_joined_into_whole_calls(connect):
    async with ScriptedServer(responder=lambda body: TWO_CALLS, stream_pieces=4) as server:
        chunks = await collect(connect(server), ask(tools=(WEATHER,)))
    *text_chunks, last = chunks
    assert all(not c.tool_calls for c in text_chunks)
    assert [(c.id, c.name) for c in last.tool_calls] == [("call_a", "weather"), ("call_b", "clock")]
    assert json.loads(last.tool_calls[0].arguments) == {"city": "Oslo"}
    assert json.loads(last.tool_calls[1].arguments) == {"zone": "UTC", "format": "24h"}
    assert last.finish_reason == "tool_calls"


# -- streaming -----------------------------------------------------------------------


async def test_stream_yields_text_pieces_then_a_last_chunk_with_usage(connect):
    async with ScriptedServer(stream_pieces=3) as server:
        chunks = await collect(connect(server), ask("stream this please"))
    *pieces, last = chunks
    assert len(pieces) == 3
    assert "".join(c.text for c in pieces) == "echo: stream this please"
    assert all(c.usage is None and c.finish_reason is None for c in pieces)
    assert last.text == ""
    assert last.finish_reason == "stop"
    assert (last.usage.input_tokens, last.usage.output_tokens) == (3, 4)
    body = server.stats.log[0].body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


async def test_thunk_streams_and_resolves_through_this_backend(connect):
    async with ScriptedServer() as server:
        backend = connect(server)
        thunk, ctx = backend.generate_from_context(Message("user", "hi there"), Context())
        streamed = [piece async for piece in thunk]
        response = await thunk
        (raw_thunk,) = backend.generate_from_raw([ask("again")])
        raw = await raw_thunk
    assert "".join(streamed) == response.text == "echo: hi there"
    assert response.usage.output_tokens == 3
    assert raw.text == "echo: again"
    # The context after the call holds the reply now that the thunk is computed.
    assert ctx.messages == (Message("user", "hi there"), Message("assistant", "echo: hi there"))


# -- structured output dialects ----------------------------------------------------------


async def test_openai_dialect_sends_json_schema(connect):
    async with ScriptedServer() as server:
        await connect(server, dialect="openai").complete(ask(response_schema=SCHEMA))
    assert server.stats.log[0].body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": SCHEMA.schema, "strict": True},
    }


async def test_llama_cpp_dialect_sends_json_object_with_schema(connect):
    async with ScriptedServer(dialect="llama_cpp") as server:
        backend = connect(server, dialect="llama_cpp")
        await backend.complete(ask(response_schema=SCHEMA))
    assert server.stats.log[0].body["response_format"] == {
        "type": "json_object",
        "schema": SCHEMA.schema,
    }
    assert server.stats.requests == 1


async def test_auto_dialect_falls_back_once_and_remembers_the_endpoint(connect):
    async with ScriptedServer(dialect="llama_cpp") as server:
        backend = connect(server)
        assert backend.dialect == "generic"
        first = await backend.complete(ask("one", response_schema=SCHEMA))
        second = await backend.complete(ask("two", response_schema=SCHEMA))
        chunks = await collect(backend, ask("three", response_schema=SCHEMA))
    kinds = [r.body["response_format"]["type"] for r in server.stats.log]
    assert kinds == ["json_schema", "json_object", "json_object", "json_object"]
    assert [r.status for r in server.stats.log] == [500, 200, 200, 200]
    assert backend.dialect == "llama_cpp"
    assert (first.text, second.text) == ("echo: one", "echo: two")
    assert "".join(c.text for c in chunks) == "echo: three"


async def test_auto_dialect_falls_back_for_a_stream_too(connect):
    async with ScriptedServer(dialect="llama_cpp") as server:
        backend = connect(server)
        chunks = await collect(backend, ask("streamed", response_schema=SCHEMA))
    assert "".join(c.text for c in chunks) == "echo: streamed"
    assert [r.status for r in server.stats.log] == [500, 200]
    assert backend.dialect == "llama_cpp"


async def test_concurrent_first_calls_all_fall_back(connect):
    async with ScriptedServer(dialect="llama_cpp") as server:
        backend = connect(server)
        replies = await asyncio.gather(
            *(backend.complete(ask(f"n{i}", response_schema=SCHEMA)) for i in range(4))
        )
    assert [r.text for r in replies] == [f"echo: n{i}" for i in range(4)]
    assert backend.dialect == "llama_cpp"
    refused = [r for r in server.stats.log if r.status == 500]
    assert 1 <= len(refused) <= 4
    assert server.stats.requests == 4 + len(refused)  # each call retried at most once


async def test_auto_dialect_settles_once_json_schema_has_worked(connect):
    async with ScriptedServer() as server:
        backend = connect(server)
        await backend.complete(ask(response_schema=SCHEMA))
        server.inject(Fault(status=400, message="Invalid value for response_format: nope", times=1))
        with pytest.raises(BackendError, match="response_format") as caught:
            await backend.complete(ask(response_schema=SCHEMA))
    assert caught.value.status == 400
    assert server.stats.requests == 2  # no fallback retry once settled
    assert backend.dialect == "generic"


async def test_errors_unrelated_to_response_format_are_never_retried(connect):
    async with ScriptedServer(faults=[Fault(status=400, times=1)]) as server:
        with pytest.raises(BackendError):
            await connect(server).complete(ask(response_schema=SCHEMA))
    assert server.stats.requests == 1


# -- errors --------------------------------------------------------------------------

ERROR_CASES = [
    # (fault status, headers, expected type, retryable, retry_after)
    (429, {"Retry-After": "2"}, RateLimitError, True, 2.0),
    (429, {"retry-after-ms": "1500"}, RateLimitError, True, 1.5),
    (429, {}, RateLimitError, True, None),
    (500, {}, BackendError, True, None),
    (503, {"Retry-After": "7"}, BackendError, True, 7.0),
    (408, {}, BackendError, True, None),
    (400, {}, BackendError, False, None),
    (401, {}, BackendError, False, None),
    (403, {}, BackendError, False, None),
    (404, {}, BackendError, False, None),
    (422, {}, BackendError, False, None),
]


@pytest.mark.parametrize(("status", "headers", "kind", "retryable", "retry_after"), ERROR_CASES)
async def test_http_errors_map_to_backend_errors(
    connect, status, headers, kind, retryable, retry_after
):
    fault = Fault(status=status, headers=headers, message=f"scripted {status} message")
    async with ScriptedServer(faults=[fault]) as server:
        with pytest.raises(kind) as caught:
            await connect(server).complete(ask())
    error = caught.value
    assert type(error) is kind
    assert error.status == status
    assert error.retryable is retryable
    assert error.retry_after == retry_after
    assert f"scripted {status} message" in str(error)
    assert server.base_url in str(error) and "test-model" in str(error)
    assert error.body["error"]["message"] == f"scripted {status} message"
    assert server.stats.requests == 1  # the backend never retries


async def test_retry_after_as_an_http_date(connect):
    when = formatdate(time.time() + 30, usegmt=True)
    async with ScriptedServer(faults=[Fault(status=429, headers={"Retry-After": when})]) as server:
        with pytest.raises(RateLimitError) as caught:
            await connect(server).complete(ask())
    assert 20.0 < caught.value.retry_after <= 31.0


async def test_errors_on_a_stream_map_the_same_way(connect):
    fault = Fault(status=429, headers={"Retry-After": "3"}, times=1)
    async with ScriptedServer(faults=[fault]) as server:
        with pytest.raises(RateLimitError) as caught:
            await collect(connect(server), ask())
    assert caught.value.retry_after == 3.0


async def test_401_names_the_fix(connect):
    async with ScriptedServer(api_key="sk-right") as server:
        with pytest.raises(BackendError, match="api_key") as caught:
            await connect(server, api_key="sk-wrong").complete(ask())
    assert caught.value.status == 401 and not caught.value.retryable


async def test_slow_server_raises_backend_timeout(connect):
    async with ScriptedServer(faults=[Fault(kind="slow", delay=30.0, times=1)]) as server:
        with pytest.raises(BackendTimeout, match=r"within 0\.3 s") as caught:
            await connect(server, timeout=0.3).complete(ask())
        assert caught.value.retryable
        with pytest.raises(BackendTimeout):  # a per-request timeout overrides the endpoint's
            server.inject(Fault(kind="slow", delay=30.0, times=1))
            await connect(server, timeout=60.0).complete(ask(timeout=0.3))


async def test_slow_stream_raises_backend_timeout(connect):
    async with ScriptedServer(faults=[Fault(kind="slow", delay=30.0, times=1)]) as server:
        with pytest.raises(BackendTimeout):
            await collect(connect(server, timeout=0.3), ask())


async def test_dropped_connection_raises_backend_connection_error(connect):
    async with ScriptedServer(faults=[Fault(kind="drop", times=1)]) as server:
        backend = connect(server)
        with pytest.raises(BackendConnectionError) as caught:
            await backend.complete(ask())
        assert caught.value.retryable and caught.value.status is None
        reply = await backend.complete(ask("after"))  # the pool recovers
    assert reply.text == "echo: after"


async def test_stream_cut_midway_raises_backend_connection_error(connect):
    async with ScriptedServer(faults=[Fault(kind="drop", after_chunks=2)]) as server:
        received = []
        with pytest.raises(BackendConnectionError):
            async for chunk in connect(server).stream(ask("a longer reply to cut")):
                received.append(chunk)
    assert received  # text arrived before the cut; the error still surfaced


async def test_refused_connection_raises_backend_connection_error(connect):
    async with ScriptedServer() as server:
        closed_server = server
    backend = connect(closed_server)
    with pytest.raises(BackendConnectionError, match="connection failed"):
        await backend.complete(ask())


# -- keys and headers ------------------------------------------------------------------


async def test_key_and_custom_headers_reach_the_wire(connect):
    async with ScriptedServer(api_key="sk-test") as server:
        backend = connect(server, api_key="sk-test", headers={"X-Trace": "abc"})
        await backend.complete(ask())
    headers = server.stats.log[0].headers
    assert headers["authorization"] == "Bearer sk-test"
    assert headers["x-trace"] == "abc"


async def test_key_is_read_from_the_named_environment_variable(connect, monkeypatch):
    monkeypatch.setenv("PLAIT_TEST_KEY", "sk-from-env")
    async with ScriptedServer(api_key="sk-from-env") as server:
        reply = await connect(server, api_key_env="PLAIT_TEST_KEY").complete(ask())
    assert reply.text == "echo: hello world"


async def test_credentials_and_query_in_base_url_reach_the_wire(connect, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-shared")  # the URL's own login wins over it
    async with ScriptedServer() as server:
        url = server.base_url.replace("http://", "http://me:pa%24s@") + "?api-version=1"
        backend = connect(server, base_url=url)
        reply = await backend.complete(ask())
        chunks = [chunk async for chunk in backend.stream(ask())]
    assert reply.text == "echo: hello world" and chunks[-1].finish_reason == "stop"
    for record in server.stats.log:
        assert record.target == "/v1/chat/completions?api-version=1"
        assert record.headers["authorization"] == basic_authorization("me", "pa$s")
    assert "pa%24s" not in repr(backend) and "me:" not in repr(backend)


def test_a_login_in_base_url_and_an_api_key_are_refused_together():
    url = "http://me:s3cr3t-pw@127.0.0.1:1/v1"
    with pytest.raises(ConfigError, match="holds user:password@ and an api_key") as info:
        OpenAICompatBackend("m", base_url=url, api_key="sk-other")
    assert "s3cr3t-pw" not in str(info.value)


def test_a_cloud_endpoint_without_a_key_is_refused_when_built(transport, monkeypatch):
    monkeypatch.delenv("PLAIT_TEST_NO_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"needs an API key: set the environment variable "
                       r"PLAIT_TEST_NO_KEY, or give api_key"):  # fmt: skip
        OpenAICompatBackend("gpt-4o-mini", api_key_env="PLAIT_TEST_NO_KEY", transport=transport)
    assert "PLAIT_TEST_NO_KEY" in OpenAICompatBackend.missing_credential(
        api_key_env="PLAIT_TEST_NO_KEY"
    )
    monkeypatch.setenv("PLAIT_TEST_NO_KEY", "sk-test")
    assert OpenAICompatBackend.missing_credential(api_key_env="PLAIT_TEST_NO_KEY") is None
    OpenAICompatBackend("gpt-4o-mini", api_key_env="PLAIT_TEST_NO_KEY", transport=transport)


def test_what_counts_as_the_credential_of_a_cloud_endpoint(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    missing = OpenAICompatBackend.missing_credential
    assert missing(api_key="") is not None  # an empty key is none
    assert missing(api_key_env=None) == (
        "needs an API key: give api_key, or name the variable that holds it with api_key_env"
    )
    azure = "https://x.openai.azure.com/openai/v1"
    assert missing(base_url=azure) is not None
    assert missing(base_url=azure, headers={"api-key": "k"}) is None
    assert missing(base_url="https://u:p@api.openai.com/v1") is None
    assert missing(base_url="http://127.0.0.1:8080/v1") is None  # a server of your own


async def test_a_server_of_your_own_needs_no_key(connect, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with ScriptedServer() as server:
        reply = await connect(server).complete(ask("hi"))
    assert reply.text == "echo: hi"


# -- construction, lifecycle, imports ---------------------------------------------------


def test_bad_options_are_config_errors_naming_the_value():
    with pytest.raises(ConfigError, match="transport 'httpx'"):
        OpenAICompatBackend("m", transport="httpx")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"'aiohttp' is now 'http'\); use 'http' or 'sdk'"):
        OpenAICompatBackend("m", transport="aiohttp")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="dialect 'vllm'"):
        OpenAICompatBackend("m", dialect="vllm")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="model name"):
        OpenAICompatBackend("")


def test_repr_names_the_endpoint_but_never_the_key():
    backend = OpenAICompatBackend("m", base_url="http://127.0.0.1:1/v1/", api_key="sk-secret")
    assert "sk-secret" not in repr(backend)
    assert "http://127.0.0.1:1/v1'" in repr(backend)


def test_one_backend_serves_calls_from_successive_event_loops(transport):
    # run_sync-style use: each asyncio.run() is a new loop; the pool must follow.
    with start_server_process() as (_, base_url):
        backend = OpenAICompatBackend("m", base_url=base_url, transport=transport)
        first = asyncio.run(backend.complete(ask("first")))

        async def second_call_then_close():
            try:
                return await backend.complete(ask("second"))
            finally:
                await backend.aclose()

        second = asyncio.run(second_call_then_close())
    assert (first.text, second.text) == ("echo: first", "echo: second")


def test_one_backend_serves_a_loop_in_another_thread_while_its_first_loop_runs(transport):
    # The pool knows its loop without asking asyncio while that loop runs in the calling
    # thread; a call from a loop in another thread, the first still running, is that
    # other loop's.
    with start_server_process() as (_, base_url):
        backend = OpenAICompatBackend("m", base_url=base_url, transport=transport)

        async def first_loop() -> tuple[str, str]:
            here = await backend.complete(ask("here"))
            there = await asyncio.to_thread(asyncio.run, backend.complete(ask("there")))
            await backend.aclose()
            return here.text, there.text

        assert asyncio.run(first_loop()) == ("echo: here", "echo: there")


def test_importing_the_backend_loads_neither_an_http_client_nor_openai():
    code = (
        "import sys, plait.backends.openai, plait.testing\n"
        "loaded = [m for m in ('aiohttp', 'httptools', 'openai') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
