"""The http transport's own client (`plait.backends.openai._http`) against real loopback servers.

Each test runs a small asyncio server written here, which answers byte for byte
what the test wants (a reply cut short, a bad chunk, a connection closed while
idle), and calls it through `OpenAICompatBackend`, so what is checked is what a
user sees: the reply, or the plait error, and what the server received.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import orjson
import pytest

from plait.backends.openai import OpenAICompatBackend
from plait.backends.types import Message, Request
from plait.errors import BackendConnectionError, BackendError, BackendTimeout, ConfigError
from plait.testing import ScriptedServer

COMPLETION = orjson.dumps(
    {
        "model": "m",
        "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    }
)


def ok(body: bytes = COMPLETION, *extra: bytes) -> bytes:
    """A 200 reply with a Content-Length (kept alive)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(
        body
    )
    return head + b"".join(extra) + b"\r\n" + body


def chunked(*pieces: bytes) -> bytes:
    """A 200 reply whose body is sent in ``pieces``, chunked."""
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


@dataclass
class Seen:
    """What a test server received."""

    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    """Each request's head and body, as received."""
    open_now: int = 0
    most_open: int = 0


Handler = Callable[[int, int, asyncio.StreamWriter], Awaitable[bool]]
"""Answers request number n (over all connections) that is number k on its connection.

Returns False to close the connection afterwards."""


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """Returns one request (head and body), or None when the client closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


@contextlib.asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[tuple[str, Seen]]:
    """Runs a server on a free loopback port; yields its ``/v1`` URL and what it saw."""
    seen = Seen()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.connections += 1
        seen.open_now += 1
        seen.most_open = max(seen.most_open, seen.open_now)
        try:
            on_this = 0
            while (request := await read_request(reader)) is not None:
                seen.requests.append(request)
                on_this += 1
                if not await handler(len(seen.requests), on_this, writer):
                    break
                await writer.drain()
        except asyncio.CancelledError:  # the test's loop ends while a client still holds it
            pass
        finally:
            seen.open_now -= 1
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1", seen
    finally:
        server.close()


def answering(reply: bytes) -> Handler:
    async def handler(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(reply)
        return True

    return handler


def ask(text: str = "hello") -> Request:
    return Request(messages=(Message("user", text),))


@contextlib.asynccontextmanager
async def backend_for(url: str, **options: object) -> AsyncIterator[OpenAICompatBackend]:
    backend = OpenAICompatBackend("m", base_url=url, api_key="k", **options)  # type: ignore[arg-type]
    try:
        yield backend
    finally:
        await backend.aclose()


async def test_successive_calls_share_one_connection_and_send_a_plain_post():
    async with serve(answering(ok())) as (url, seen), backend_for(url) as backend:
        for _ in range(3):
            assert (await backend.complete(ask())).text == "hi"
    assert seen.connections == 1 and len(seen.requests) == 3
    head, _, body = seen.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    assert headers[b"host"] == url.split("/")[2].encode()
    assert headers[b"content-length"] == str(len(body)).encode()
    assert headers[b"authorization"] == b"Bearer k"
    assert b"accept-encoding" not in headers  # so replies come uncompressed, and caps mean bytes
    assert orjson.loads(body)["messages"] == [{"role": "user", "content": "hello"}]


async def test_concurrent_calls_reuse_connections_against_the_scripted_server():
    async with ScriptedServer() as server, backend_for(server.base_url) as backend:
        for _ in range(3):
            replies = await asyncio.gather(*(backend.complete(ask(f"q{i}")) for i in range(8)))
            assert [r.text for r in replies] == [f"echo: q{i}" for i in range(8)]
        assert server.stats.requests == 24


async def test_a_chunked_body_and_a_body_that_ends_with_the_connection_are_read_whole():
    half = len(COMPLETION) // 2
    halves = chunked(COMPLETION[:half], COMPLETION[half:])
    async with serve(answering(halves)) as (url, _), backend_for(url) as backend:
        assert (await backend.complete(ask())).text == "hi"

    async def until_close(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + COMPLETION)
        return False

    async with serve(until_close) as (url, seen), backend_for(url) as backend:
        assert (await backend.complete(ask())).text == "hi"
        assert (await backend.complete(ask())).text == "hi"
    assert seen.connections == 2  # a connection the server closes is not reused


async def test_a_body_cut_short_is_a_connection_error():
    async def half_sent(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok()[: -len(COMPLETION) // 2])
        return False

    async with serve(half_sent) as (url, seen), backend_for(url) as backend:
        with pytest.raises(BackendConnectionError, match="closed the connection in the middle"):
            await backend.complete(ask())
    assert len(seen.requests) == 1  # not resent: the server had begun its reply


async def test_a_body_over_the_cap_is_refused_by_its_declared_length_or_as_it_arrives():
    big = b'{"pad": "' + b"x" * 5000 + b'"}'
    declared = answering(ok(big))
    async with serve(declared) as (url, _), backend_for(url, max_response_bytes=1000) as backend:
        with pytest.raises(BackendError, match=r"its declared length.*max_response_bytes=1000"):
            await backend.complete(ask())
    arriving = answering(chunked(*[big[i : i + 500] for i in range(0, len(big), 500)]))
    async with serve(arriving) as (url, _), backend_for(url, max_response_bytes=1000) as backend:
        with pytest.raises(BackendError, match=r"read so far.*max_response_bytes=1000") as info:
            await backend.complete(ask())
    assert info.value.retryable is False


async def test_a_chunked_body_with_a_bad_chunk_size_is_a_connection_error():
    bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
    async with serve(answering(bad)) as (url, _), backend_for(url) as backend:
        with pytest.raises(BackendConnectionError, match=r"not valid HTTP/1\.1") as info:
            await backend.complete(ask())
    assert info.value.retryable is True


async def test_an_endless_header_is_refused_at_64_kib_not_read_until_the_timeout():
    sent = asyncio.Event()

    async def endless_header(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        for _ in range(512):  # 32 MiB of one header's value (more than socket buffers hold)
            writer.write(b"a" * 65536)
            await writer.drain()
        sent.set()
        return True

    async with serve(endless_header) as (url, _), backend_for(url, timeout=30) as backend:
        with pytest.raises(BackendConnectionError, match="headers passed 64 KiB"):
            await backend.complete(ask())
    assert not sent.is_set()  # refused while the server was still sending


async def test_an_endless_trailer_after_a_chunked_body_is_refused_past_the_cap():
    async def endless_trailer(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n0\r\nX-Trailer: " % (len(COMPLETION), COMPLETION))
        for _ in range(512):  # 32 MiB of one trailer's value, never ended
            writer.write(b"a" * 65536)
            await writer.drain()
        return True

    async with (
        serve(endless_trailer) as (url, _),
        backend_for(url, timeout=30, max_response_bytes=100_000) as backend,
    ):
        with pytest.raises(BackendError, match="max_response_bytes"):
            await backend.complete(ask())


SSE = (
    b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n',
    b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n',
)
"""A whole stream's events: the text "hi", its end, and ``[DONE]``."""

EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"


async def test_an_interim_100_continue_sent_apart_from_the_reply_is_skipped():
    async def continue_then_ok(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # so the client most likely reads the interim reply alone
        writer.write(ok())
        return True

    async with serve(continue_then_ok) as (url, seen), backend_for(url) as backend:
        for _ in range(2):
            assert (await backend.complete(ask())).text == "hi"
    assert seen.connections == 1


async def test_early_hints_before_a_reply_are_skipped_and_the_connection_stays_in_step():
    # The 103 carries headers of its own (which are not the reply's); the second call on the
    # same connection gets its own reply, not a leftover of the first.
    async def hints_then_ok(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        body = COMPLETION.replace(b'"hi"', b'"reply %d"' % n)
        processing = b"HTTP/1.1 102 Processing\r\n\r\n"
        writer.write(processing + EARLY_HINTS + ok(body, b"X-Final: %d\r\n" % n))
        return True

    async with serve(hints_then_ok) as (url, seen), backend_for(url) as backend:
        assert (await backend.complete(ask())).text == "reply 1"
        assert (await backend.complete(ask())).text == "reply 2"
    assert seen.connections == 1 and len(seen.requests) == 2


async def test_early_hints_before_a_streamed_reply_are_skipped():
    async with (
        serve(answering(EARLY_HINTS + chunked(*SSE))) as (url, seen),
        backend_for(url) as backend,
    ):
        for _ in range(2):
            assert "".join([chunk.text async for chunk in backend.stream(ask())]) == "hi"
    assert seen.connections == 1


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_101_switching_protocols_is_a_connection_error_naming_it(
    streamed: bool, caplog: pytest.LogCaptureFixture
):
    switch = (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    )
    async with serve(answering(switch + b"\x81\x02hi")) as (url, seen), backend_for(url) as backend:
        for _ in range(2):  # each on a new connection: an upgraded one is not HTTP any more
            with pytest.raises(BackendConnectionError, match=r"101 Switching Protocols.*not ask"):
                if streamed:
                    async for _chunk in backend.stream(ask()):
                        pass
                else:
                    await backend.complete(ask())
    assert seen.connections == 2
    assert not [r for r in caplog.records if r.name == "asyncio"]  # no parser error escaped


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_endless_series_of_interim_replies_is_refused_at_64_kib(streamed: bool):
    sent = asyncio.Event()

    async def endless_hints(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        for _ in range(512):  # 32 MiB of interim replies (more than socket buffers hold)
            writer.write(EARLY_HINTS * (65536 // len(EARLY_HINTS)))
            await writer.drain()
        sent.set()
        return True

    async with serve(endless_hints) as (url, _), backend_for(url, timeout=30) as backend:
        with pytest.raises(
            BackendConnectionError, match=r"\d+ interim \(1xx\) replies.*passed 64 KiB"
        ):
            if streamed:
                async for _chunk in backend.stream(ask()):
                    pass
            else:
                await backend.complete(ask())
    assert not sent.is_set()  # refused while the server was still sending


async def test_an_endless_trailer_after_a_streamed_body_is_refused_at_64_kib():
    sent = asyncio.Event()

    async def endless_trailer(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(chunked(*SSE)[: -len(b"\r\n")] + b"X-Trailer: ")
        for _ in range(512):  # 32 MiB of one trailer's value, never ended
            writer.write(b"a" * 65536)
            await writer.drain()
        sent.set()
        return True

    async with serve(endless_trailer) as (url, _), backend_for(url, timeout=30) as backend:
        texts = []
        with pytest.raises(BackendConnectionError, match="passed 64 KiB after the body"):
            async for chunk in backend.stream(ask()):
                texts.append(chunk.text)
    assert texts == ["hi"]  # the events came; the trailer after them was refused
    assert not sent.is_set()  # while the server was still sending


async def test_a_short_trailer_after_a_streamed_body_is_read_and_the_connection_kept():
    trailed = chunked(*SSE)[: -len(b"\r\n")] + b"X-Trailer: " + b"t" * 1000 + b"\r\n\r\n"
    async with serve(answering(trailed)) as (url, seen), backend_for(url) as backend:
        for _ in range(2):
            assert "".join([chunk.text async for chunk in backend.stream(ask())]) == "hi"
    assert seen.connections == 1


async def test_a_large_body_in_the_same_read_as_its_headers_is_read_whole():
    message = {"role": "assistant", "content": "x" * 200_000}
    body = orjson.dumps({"model": "m", "choices": [{"message": message, "finish_reason": "stop"}]})
    async with serve(answering(ok(body))) as (url, _), backend_for(url) as backend:
        assert len((await backend.complete(ask())).text) == 200_000


async def test_a_keep_alive_connection_the_server_closed_while_idle_is_not_used_again():
    async def closes_after_replying(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok())
        return False  # no "Connection: close": the client learns it from the close itself

    async with serve(closes_after_replying) as (url, seen), backend_for(url) as backend:
        for _ in range(3):
            assert (await backend.complete(ask())).text == "hi"
            for _ in range(500):  # until the server has closed it (its close is then on its way)
                if seen.open_now == 0:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
    # Each call found its idle connection closed and took a new one: no request was lost.
    assert seen.connections == 3 and len(seen.requests) == 3


async def test_a_request_dropped_unanswered_on_a_reused_connection_is_not_resent():
    # The server reads the second request of each connection and closes without a byte of
    # reply. It may have acted on it, so the client does not send it again by itself: the
    # failure is a retryable dropped connection, and resending is the resource layer's call.
    async def closes_after_one(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        if k > 1:
            return False
        writer.write(ok())
        return True

    async with serve(closes_after_one) as (url, seen), backend_for(url) as backend:
        assert (await backend.complete(ask())).text == "hi"
        with pytest.raises(BackendConnectionError) as info:
            await backend.complete(ask())
        assert info.value.retryable is True
        assert (await backend.complete(ask())).text == "hi"  # on a new connection
    assert seen.connections == 2 and len(seen.requests) == 3


async def test_a_new_connection_dropped_without_a_reply_is_not_resent():
    async def drops(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        return False

    async with serve(drops) as (url, seen), backend_for(url) as backend:
        with pytest.raises(BackendConnectionError, match="closed the connection"):
            await backend.complete(ask())
    assert len(seen.requests) == 1  # retrying is the resource layer's decision


async def test_a_reused_connection_dropped_after_part_of_a_reply_is_not_resent():
    async def cuts_the_second(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok() if k == 1 else ok()[:20])
        return k == 1

    async with serve(cuts_the_second) as (url, seen), backend_for(url) as backend:
        assert (await backend.complete(ask())).text == "hi"
        with pytest.raises(BackendConnectionError, match="in the middle of its reply"):
            await backend.complete(ask())
    assert len(seen.requests) == 2


async def test_a_slow_server_times_out_and_its_connection_is_not_reused():
    release = asyncio.Event()

    async def slow_first(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        if n == 1:
            await release.wait()
        writer.write(ok())
        return True

    async with serve(slow_first) as (url, seen), backend_for(url, timeout=0.2) as backend:
        with pytest.raises(BackendTimeout, match=r"within 0\.2 s"):
            await backend.complete(ask())
        release.set()
        assert (await backend.complete(ask())).text == "hi"
    assert seen.connections == 2


async def test_a_call_with_a_shorter_deadline_times_out_at_its_own_among_longer_ones():
    # The pool keeps its calls' deadlines on one timer, armed at the earliest: a call
    # started later with a shorter timeout must move it, and the long calls go on.
    release = asyncio.Event()

    async def held_until_released(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        await release.wait()
        writer.write(ok())
        return True

    async with serve(held_until_released) as (url, _), backend_for(url, timeout=60) as backend:
        long_calls = [asyncio.create_task(backend.complete(ask())) for _ in range(3)]
        await asyncio.sleep(0.05)  # their deadlines (60 s) are kept first
        short = Request(messages=(Message("user", "quick"),), timeout=0.2)
        with pytest.raises(BackendTimeout, match=r"within 0\.2 s"):
            await asyncio.wait_for(backend.complete(short), timeout=20)  # not the 60 s timer
        again = Request(messages=(Message("user", "quick again"),), timeout=0.2)
        with pytest.raises(BackendTimeout, match=r"within 0\.2 s"):
            await asyncio.wait_for(backend.complete(again), timeout=20)
        release.set()
        assert [(await call).text for call in long_calls] == ["hi", "hi", "hi"]


async def test_max_connections_caps_the_connections_open_at_once():
    async def slowly(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.01)
        writer.write(ok())
        return True

    async with serve(slowly) as (url, seen), backend_for(url, max_connections=2) as backend:
        replies = await asyncio.gather(*(backend.complete(ask()) for _ in range(8)))
    assert [r.text for r in replies] == ["hi"] * 8
    assert seen.most_open <= 2 and len(seen.requests) == 8


async def test_an_error_reply_of_a_stream_is_read_within_the_cap_and_mapped():
    body = b'{"error": {"message": "slow down"}}'
    reply = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    async with serve(answering(reply)) as (url, seen), backend_for(url) as backend:
        for _ in range(2):
            with pytest.raises(BackendError, match="HTTP 429 Too Many Requests: slow down") as info:
                async for _chunk in backend.stream(ask()):
                    pass
            assert info.value.retry_after == 7
    assert seen.connections == 1  # the error body was read to its end: the connection is kept


async def test_a_large_error_reply_to_a_stream_is_read_whole_without_stalling():
    body = b'{"error": {"message": "broken' + b"." * 400_000 + b'"}}'
    reply = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )

    async def in_two_parts(n: int, k: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(reply[:300_000])  # past the unread bytes a stream may hold
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(reply[300_000:])
        return True

    async with serve(in_two_parts) as (url, _), backend_for(url, timeout=10) as backend:
        with pytest.raises(BackendError, match="HTTP 500 Internal Server Error: broken") as info:
            async for _chunk in backend.stream(ask()):
                pass
    assert info.value.retryable is True


async def test_a_stream_sent_in_many_small_chunks_arrives_whole():
    events = [b'data: {"choices": [{"delta": {"content": "%d "}}]}\n\n' % i for i in range(200)] + [
        b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
    ]
    async with serve(answering(chunked(*events))) as (url, seen), backend_for(url) as backend:
        for _ in range(2):
            text = "".join([chunk.text async for chunk in backend.stream(ask())])
            assert text == "".join(f"{i} " for i in range(200))
    assert seen.connections == 1


@pytest.mark.parametrize("transport", ["http", "sdk"])
def test_a_header_with_a_line_break_is_refused_when_the_backend_is_built(transport: str):
    with pytest.raises(ConfigError, match="header 'X-Bad' has a malformed name or a line break"):
        OpenAICompatBackend(
            "m",
            headers={"X-Bad": "a\r\nInjected: yes"},
            transport=transport,  # type: ignore[arg-type]
        )


async def test_a_stream_larger_than_the_read_buffer_arrives_whole_and_in_order():
    # Over a megabyte of events read by a slow consumer: the client stops reading the
    # socket while it holds 256 KiB unread and starts again as the reader takes them,
    # and what arrives while the consumer is away (the end included) is still read.
    words = [f"{i:05d}" + "x" * 500 for i in range(2500)]
    events = [b'data: {"choices": [{"delta": {"content": "%s"}}]}\n\n' % w.encode() for w in words]
    events.append(
        b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
    )
    async with (
        serve(answering(chunked(*events))) as (url, seen),
        backend_for(url, timeout=20) as backend,
    ):
        pieces = []
        async for chunk in backend.stream(ask()):
            pieces.append(chunk.text)
            if len(pieces) % 100 == 0:  # a consumer busy with other work now and then
                await asyncio.sleep(0.005)
        assert "".join(pieces) == "".join(words)
    assert seen.connections == 1


async def test_https_to_a_server_that_speaks_no_tls_is_a_connection_error():
    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(ok())  # plain HTTP where the client expects a TLS handshake
        await writer.drain()
        await reader.read()
        writer.close()

    server = await asyncio.start_server(plain, "127.0.0.1", 0)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    try:
        async with backend_for(url, timeout=30) as backend:
            with pytest.raises(BackendConnectionError, match="SSL"):
                await backend.complete(ask())
    finally:
        server.close()


def test_a_call_to_an_ascii_host_loads_no_idna_codec():
    # Its import (stringprep, unicodedata) would cost a cold process's first call more
    # than the rest of the URL's parse; non-ASCII names still go through it.
    code = (
        "import asyncio, sys\n"
        "from plait.backends.openai import OpenAICompatBackend\n"
        "from plait.backends.types import Message, Request\n"
        "from plait.testing import ScriptedServer\n"
        "async def main():\n"
        "    async with ScriptedServer() as server:\n"
        "        backend = OpenAICompatBackend('m', base_url=server.base_url, api_key='k')\n"
        "        reply = await backend.complete(Request(messages=(Message('user', 'hi'),)))\n"
        "        await backend.aclose()\n"
        "    print(reply.text, 'encodings.idna' in sys.modules)\n"
        "asyncio.run(main())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["echo:", "hi", "False"]
