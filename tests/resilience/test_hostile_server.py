"""A server that is careless or hostile: credentials in its URL.

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

import pytest

from plait.backends._urls import basic_authorization
from plait.backends.openai_compat import OpenAICompatBackend
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
    with pytest.raises(ConfigError, match=r"alias 'llm': key 'base_url' must be an http\(s\) URL"):
        ResourceConfig({"llm": {"provider": "openai", "model": MODEL, "base_url": url}})
    try:
        ResourceConfig({"llm": {"provider": "openai", "model": MODEL, "base_url": url}})
    except ConfigError as error:
        assert_no_secret(str(error))


@pytest.mark.parametrize(
    "url",
    [
        f"http://user:{SECRET}@[::1/v1?api-key={SECRET}",
        f"ftp://user:{SECRET}@127.0.0.1/v1?api-key={SECRET}",
        f"http://a..b/v1?api-key={SECRET}",
    ],
)
@pytest.mark.parametrize("transport", ["aiohttp"])
async def test_a_backend_built_with_an_invalid_url_fails_without_retry_or_secret(
    url: str, transport: str
) -> None:
    backend = OpenAICompatBackend(MODEL, base_url=url, transport=transport)
    try:
        with pytest.raises(BackendError, match="invalid request URL") as info:
            await backend.complete(ask())
    finally:
        await backend.aclose()
    assert info.value.retryable is False and info.value.status is None
    assert_no_secret(repr(backend), *(str(e) for e in chain(info.value)))


async def test_a_redirect_to_an_invalid_url_is_not_retried() -> None:
    location = f"ftp://user:{SECRET}@127.0.0.1/v1?api-key={SECRET}"
    redirect = RawReply(status=307, headers={"Location": location})
    async with ScriptedServer(responder=lambda body: redirect) as server:
        config = secret_config(server, max_retries=3)
        async with ResourceManager(config) as manager:
            with pytest.raises(BackendError, match="invalid request URL") as info:
                await manager.complete("llm", ask())
        assert server.stats.requests == 1
    assert "alias 'llm'" in str(info.value)
    assert_no_secret(*(str(e) for e in chain(info.value)))
