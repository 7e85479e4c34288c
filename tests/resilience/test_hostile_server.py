"""A server that is careless or hostile: credentials in its URL, replies of the wrong shape.

Every call goes through `ResourceManager` to the scripted server over loopback
HTTP. Replies no well-behaved server sends are put on the wire byte for byte
with `RawReply`. What is asserted is what a user would see: the error's type,
its message (alias, endpoint, model, the start of the reply), how many
requests the server received, and that no credential shows anywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from plait.backends._urls import basic_authorization
from plait.backends.openai import OpenAICompatBackend
from plait.backends.types import Message, Request
from plait.errors import BackendError, ConfigError
from plait.resources import ResourceConfig, ResourceManager
from plait.resources.endpoint import create_backend
from plait.testing import Fault, RawReply, ScriptedServer

SECRET = "s3cr3t-KEY"
MODEL = "odd-model"
FAST_RETRY = {"retry_base_delay": 0.0, "retry_max_delay": 0.01}


def ask(text: str = "hello") -> Request:
    return Request(messages=(Message("user", text),))


def chain(error: BaseException) -> Iterator[BaseException]:
    """Yields ``error`` and every exception chained under it as a cause."""
    seen: BaseException | None = error
    while seen is not None:
        yield seen
        seen = seen.__cause__


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text, text


async def call(manager: ResourceManager, streamed: bool) -> str:
    if not streamed:
        return (await manager.complete("llm", ask())).text
    return "".join([chunk.text async for chunk in manager.stream("llm", ask())])


# -- credentials inside base_url ----------------------------------------------------------


def secret_config(server: ScriptedServer, **options: Any) -> ResourceConfig:
    url = f"http://user:{SECRET}@127.0.0.1:{server.port}/v1?api-key={SECRET}"
    entry = {"provider": "openai", "model": MODEL, "base_url": url, **FAST_RETRY, **options}
    return ResourceConfig({"llm": entry})


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize(
    "fault",
    [Fault(status=401), Fault(status=500), Fault(kind="drop")],
    ids=["401", "500", "drop"],
)
async def test_credentials_in_base_url_show_in_no_repr_error_or_log(
    fault: Fault, streamed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="plait")
    async with ScriptedServer(faults=[fault]) as server:
        config = secret_config(server, max_retries=1)
        endpoint = config.resolve("llm")
        async with ResourceManager(config) as manager:
            with pytest.raises(BackendError) as info:
                await call(manager, streamed)
        record = server.stats.log[0]
        backend = create_backend(endpoint)
        await backend.aclose()

    error = info.value
    assert "alias 'llm'" in str(error) and f"127.0.0.1:{server.port}" in str(error)
    assert "http://***:***@127.0.0.1" in str(error) and "api-key=***" in str(error)
    assert_no_secret(repr(config), repr(endpoint), endpoint.describe(), repr(backend))
    assert_no_secret(*(text for e in chain(error) for text in (str(e), repr(e))))
    assert_no_secret(*(r.getMessage() for r in caplog.records))
    # The credentials still did their job: Basic auth and the query reached the server.
    assert record.headers["authorization"] == basic_authorization("user", SECRET)
    assert record.target == f"/v1/chat/completions?api-key={SECRET}"


@pytest.mark.parametrize(
    "url",
    [
        f"user:{SECRET}@127.0.0.1:8000/v1",  # no scheme
        f"ftp://user:{SECRET}@127.0.0.1/v1",
        f"http://user:{SECRET}@/v1?api-key={SECRET}",  # no host
        f"http://user:{SECRET}@127.0.0.1 /v1",  # a space
        f"http://user:{SECRET}@[::1/v1?token={SECRET}",  # does not parse
        f"http://127.0.0.1:99999/v1?api-key={SECRET}",
        f"http://a..b/v1?api-key={SECRET}",  # the resolver refuses the host
    ],
)
def test_an_invalid_base_url_is_refused_when_the_config_is_built(url: str) -> None:
    expected = r"alias 'llm': key 'base_url' must be an http\(s\) URL"
    with pytest.raises(ConfigError, match=expected) as info:
        ResourceConfig({"llm": {"provider": "openai", "model": MODEL, "base_url": url}})
    assert_no_secret(str(info.value))


@pytest.mark.parametrize(
    "url",
    [
        f"http://user:{SECRET}@[::1/v1?api-key={SECRET}",
        f"ftp://user:{SECRET}@127.0.0.1/v1?api-key={SECRET}",
        f"http://a..b/v1?api-key={SECRET}",
    ],
)
async def test_a_backend_built_with_an_invalid_url_fails_without_retry_or_secret(url: str) -> None:
    backend = OpenAICompatBackend(MODEL, base_url=url)  # the default (http) transport
    try:
        with pytest.raises(BackendError, match="invalid request URL") as info:
            await backend.complete(ask())
    finally:
        await backend.aclose()
    assert info.value.retryable is False and info.value.status is None
    assert_no_secret(repr(backend), *(str(e) for e in chain(info.value)))


async def test_a_redirect_is_not_followed_nor_retried_and_names_where_it_points() -> None:
    location = f"ftp://user:{SECRET}@127.0.0.1/v1?api-key={SECRET}"
    redirect = RawReply(status=307, headers={"Location": location})
    async with ScriptedServer(responder=lambda body: redirect) as server:
        config = secret_config(server, max_retries=3)
        async with ResourceManager(config) as manager:
            with pytest.raises(BackendError, match=r"HTTP 307.* a redirect to ftp://") as info:
                await manager.complete("llm", ask())
        assert server.stats.requests == 1
    assert info.value.retryable is False and info.value.status == 307
    assert "set base_url to the address" in str(info.value)
    assert "alias 'llm'" in str(info.value)
    assert_no_secret(*(str(e) for e in chain(info.value)))


# -- replies that are valid JSON of the wrong shape -----------------------------------------


def reply(message: Any = None, **fields: Any) -> dict[str, Any]:
    """A completion whose first choice holds ``message``; ``fields`` replace top-level keys."""
    if message is None:
        message = {"role": "assistant", "content": "hi"}
    body = {"model": MODEL, "choices": [{"message": message, "finish_reason": "stop"}]}
    return {**body, **fields}


ODD_REPLIES = {
    "message is a string": (reply("hello"), "choices[0].message is a string"),
    "usage is a string": (reply(usage="lots"), "usage is a string, expected an object"),
    "prompt_tokens is a word": (
        reply(usage={"prompt_tokens": "ten", "completion_tokens": 1}),
        "usage.prompt_tokens is a string, expected an integer",
    ),
    "negative tokens": (
        reply(usage={"prompt_tokens": 1, "completion_tokens": -3}),
        "usage.completion_tokens is -3, expected an integer >= 0",
    ),
    "tool_calls holds a string": (
        reply({"role": "assistant", "content": None, "tool_calls": ["x"]}),
        "choices[0].message.tool_calls[0] is a string, expected an object",
    ),
    "content is an int": (
        reply({"role": "assistant", "content": 42}),
        "choices[0].message.content is an integer, expected a list",
    ),
    "content is a list of numbers": (
        reply({"role": "assistant", "content": [1, 2]}),
        "choices[0].message.content[0] is an integer, expected an object",
    ),
    "content part is an image": (
        reply({"role": "assistant", "content": [{"type": "image_url", "image_url": {}}]}),
        "choices[0].message.content[0] is a part of type 'image_url', expected 'text'",
    ),
    "choices is an object": (reply(choices={"0": {}}), "choices is an object, expected a list"),
    "choices is empty": (reply(choices=[]), "choices is empty"),
    "reply is a list": ([reply()], "the reply is a list, expected an object"),
    "finish_reason is a number": (
        reply(choices=[{"message": {"content": "hi"}, "finish_reason": 7}]),
        "choices[0].finish_reason is an integer, expected a string",
    ),
    "long body": (reply("x" * 1000), "choices[0].message is a string"),
}


@pytest.fixture(params=["http", "sdk"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


def odd_endpoint(server: ScriptedServer, transport: str, **options: Any) -> dict[str, Any]:
    return server.endpoint(model=MODEL, transport=transport, **FAST_RETRY, **options)


@pytest.mark.parametrize(("data", "problem"), ODD_REPLIES.values(), ids=ODD_REPLIES)
async def test_a_malformed_reply_is_a_backend_error_naming_alias_endpoint_model_and_body(
    data: Any, problem: str, transport: str
) -> None:
    body = orjson.dumps(data)
    async with ScriptedServer(responder=lambda _: RawReply(body)) as server:
        config = {"llm": odd_endpoint(server, transport, max_retries=3)}
        async with ResourceManager(config) as manager:
            with pytest.raises(BackendError) as info:
                await manager.complete("llm", ask())
        # A malformed 200 is not retried: the same request gets the same answer.
        assert server.stats.requests == 1

    message = str(info.value)
    assert message.startswith("alias 'llm': HTTP 200 is not retried: ")
    assert f"endpoint {server.base_url} (model '{MODEL}')" in message
    assert problem in message
    assert body.decode()[:120] in message
    assert len(message) < 300 + 400  # the body is cut to 300 characters
    assert info.value.status == 200 and info.value.retryable is False


ODD_EVENTS = {
    "event is a JSON list": (b"[1, 2]", "the event is a list, expected an object"),
    "choices is a string": (b'{"choices": "none"}', "choices is a string, expected a list"),
    "delta is a string": (
        b'{"choices": [{"delta": "hi", "finish_reason": null}]}',
        "choices[0].delta is a string, expected an object",
    ),
    "delta content is an int": (
        b'{"choices": [{"delta": {"content": 5}, "finish_reason": null}]}',
        "choices[0].delta.content is an integer, expected a list",
    ),
    "tool_calls holds a string": (
        b'{"choices": [{"delta": {"tool_calls": ["x"]}, "finish_reason": null}]}',
        "choices[0].delta.tool_calls[0] is a string, expected an object",
    ),
    "usage is a string": (
        b'{"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}], "usage": "lots"}',
        "usage is a string, expected an object",
    ),
}


@pytest.mark.parametrize(("event", "problem"), ODD_EVENTS.values(), ids=ODD_EVENTS)
async def test_a_malformed_stream_event_is_a_backend_error_naming_the_event(
    event: bytes, problem: str, transport: str
) -> None:
    answer = RawReply(stream_events=[event])
    async with ScriptedServer(responder=lambda _: answer) as server:
        config = {"llm": odd_endpoint(server, transport, max_retries=3)}
        async with ResourceManager(config) as manager:
            with pytest.raises(BackendError) as info:
                await call(manager, streamed=True)
        assert server.stats.requests == 1

    message = str(info.value)
    assert message.startswith("alias 'llm': HTTP 200 is not retried: ")
    assert f"endpoint {server.base_url} (model '{MODEL}') streamed a malformed event" in message
    assert problem in message
    assert orjson.dumps(orjson.loads(event)).decode()[:60] in message


@pytest.mark.parametrize(
    "event", [b'{"choices": "\xff\xfe"}', b'{"choices": ['], ids=["not UTF-8", "not JSON"]
)
async def test_a_garbled_stream_event_is_retried_then_named(event: bytes, transport: str) -> None:
    answer = RawReply(stream_events=[event])
    async with ScriptedServer(responder=lambda _: answer) as server:
        config = {"llm": odd_endpoint(server, transport, max_retries=2)}
        async with ResourceManager(config) as manager:
            with pytest.raises(BackendError) as info:
                await call(manager, streamed=True)
        # Garbled bytes may be a damaged transfer: retried, within max_retries.
        assert server.stats.requests == 3

    message = str(info.value)
    assert message.startswith("alias 'llm': gave up after 3 attempts (max_retries=2)")
    assert f"endpoint {server.base_url} (model '{MODEL}')" in message
    assert "streamed an event that is not UTF-8 JSON: " + '{"choices": ' in message


async def test_a_body_that_is_not_utf8_is_a_backend_error(transport: str) -> None:
    answer = RawReply(b'{"choices": "\xff\xfe"}')
    async with ScriptedServer(responder=lambda _: answer) as server:
        config = {"llm": odd_endpoint(server, transport)}
        async with ResourceManager(config) as manager:
            with pytest.raises(BackendError, match="with a body that is not JSON") as info:
                await manager.complete("llm", ask())
    assert f"(model '{MODEL}')" in str(info.value) and "alias 'llm'" in str(info.value)


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
async def test_content_as_a_list_of_text_parts_is_joined(streamed: bool, transport: str) -> None:
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    event = {"choices": [{"delta": {"content": parts}, "finish_reason": "stop"}]}
    answer = RawReply(
        orjson.dumps(reply({"role": "assistant", "content": parts})),
        stream_events=[orjson.dumps(event)],
    )
    async with ScriptedServer(responder=lambda _: answer) as server:
        manager = ResourceManager({"llm": odd_endpoint(server, transport)})
        async with manager:
            assert await call(manager, streamed) == "Hello"
