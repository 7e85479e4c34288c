"""The requests an OpenAI-compatible endpoint sends with http.client while aiohttp is imported.

In a cold process (tests/resources/test_warm_up.py) the transport sends its
first requests this way; here the same path is driven directly, against the
scripted server, to show it reads replies and fails exactly as the aiohttp
path does.
"""

from __future__ import annotations

from typing import Any

import pytest

from plait.backends.openai import OpenAICompatBackend
from plait.backends.openai._first_requests import MAX_IN_FLIGHT, FirstRequests
from plait.backends.openai._transports import _NOT_SENT, AiohttpTransport
from plait.errors import BackendConnectionError, BackendError, BackendTimeout, RateLimitError
from plait.testing import Fault, RawReply, ScriptedServer

BODY = {"model": "test-model", "messages": [{"role": "user", "content": "hello"}]}
WHERE = "the test endpoint"


def first_path(base_url: str, **options: Any) -> tuple[AiohttpTransport, FirstRequests]:
    """Returns a backend's aiohttp transport and the http.client sender it would use first."""
    backend = OpenAICompatBackend("test-model", base_url=base_url, api_key="sk-test", **options)
    transport = backend._transport
    assert isinstance(transport, AiohttpTransport)
    sender = FirstRequests(transport._endpoint, transport._headers, transport._max_body)
    return transport, sender


async def test_a_reply_is_decoded_and_the_request_carries_the_same_headers_and_query():
    async with ScriptedServer() as server:
        transport, sender = first_path(
            server.base_url + "?api-version=1", headers={"X-Trace": "abc"}
        )
        reply = await transport._post_first(sender, BODY, 5.0, WHERE)
    assert reply["choices"][0]["message"]["content"] == "echo: hello"
    record = server.stats.log[0]
    assert record.target == "/v1/chat/completions?api-version=1"
    assert record.body == BODY
    assert record.headers["authorization"] == "Bearer sk-test"
    assert record.headers["x-trace"] == "abc"
    assert record.headers["content-type"] == "application/json"
    assert record.headers["user-agent"].endswith(" plait")
    assert sender.in_flight == 0


@pytest.mark.parametrize(
    ("status", "headers", "kind", "retryable", "retry_after"),
    [(429, {"Retry-After": "7"}, RateLimitError, True, 7.0), (500, {}, BackendError, True, None)],
)
async def test_http_errors_map_as_on_aiohttp(status, headers, kind, retryable, retry_after):
    fault = Fault(status=status, headers=headers, message=f"scripted {status}")
    async with ScriptedServer(faults=[fault]) as server:
        transport, sender = first_path(server.base_url)
        with pytest.raises(kind, match=f"scripted {status}") as caught:
            await transport._post_first(sender, BODY, 5.0, WHERE)
    assert type(caught.value) is kind
    assert caught.value.status == status
    assert caught.value.retryable is retryable
    assert caught.value.retry_after == retry_after


async def test_a_slow_server_is_a_backend_timeout():
    async with ScriptedServer(faults=[Fault(kind="slow", delay=30.0, times=1)]) as server:
        transport, sender = first_path(server.base_url)
        with pytest.raises(BackendTimeout, match=r"within 0\.3 s"):
            await transport._post_first(sender, BODY, 0.3, WHERE)
    assert sender.in_flight == 0


async def test_a_dropped_or_refused_connection_is_a_backend_connection_error():
    async with ScriptedServer(faults=[Fault(kind="drop", times=1)]) as server:
        transport, sender = first_path(server.base_url)
        with pytest.raises(BackendConnectionError, match="connection failed"):
            await transport._post_first(sender, BODY, 5.0, WHERE)
        closed = server.base_url
    with pytest.raises(BackendConnectionError, match="connection failed"):
        await transport._post_first(FirstRequests(*first_args(closed)), BODY, 5.0, WHERE)


def first_args(base_url: str) -> tuple[str, dict[str, str], int]:
    transport, _ = first_path(base_url)
    return transport._endpoint, transport._headers, transport._max_body


async def test_a_body_over_max_response_bytes_is_refused():
    async with ScriptedServer(responder=lambda body: RawReply(b'"' + b"x" * 5000 + b'"')) as server:
        transport, sender = first_path(server.base_url, max_response_bytes=1000)
        with pytest.raises(BackendError, match="max_response_bytes"):
            await transport._post_first(sender, BODY, 5.0, WHERE)


async def test_a_redirect_is_left_for_aiohttp_to_follow():
    moved = RawReply(status=307, headers={"Location": "/v1/chat/completions"})
    async with ScriptedServer(responder=lambda body: moved) as server:
        transport, sender = first_path(server.base_url)
        assert await transport._post_first(sender, BODY, 5.0, WHERE) is _NOT_SENT


def test_only_plain_http_urls_with_ascii_hosts_are_sent_this_way_and_a_few_at_a_time():
    assert FirstRequests("http://127.0.0.1:1/v1/chat/completions", {}, 10).can_send()
    assert FirstRequests("https://api.example.com/v1/chat/completions", {}, 10).usable
    for url in ("ftp://host/v1", "http://bücher.example/v1", "http://[::1/v1", "http:///v1"):
        assert not FirstRequests(url, {}, 10).usable, url
    busy = FirstRequests("http://127.0.0.1:1/v1/chat/completions", {}, 10)
    busy.in_flight = MAX_IN_FLIGHT
    assert not busy.can_send()
