"""A request's head is bounded in size, and the time a client takes to send a request, by
the protocol `plait.serve.serve` runs uvicorn with (`http_protocol`): real uvicorn on
loopback, real sockets and httpx.
"""

from __future__ import annotations

import asyncio
import select
import socket
from typing import Any

import httpx
import uvicorn
from uvicorn.server import ServerState

from plait import LLMInference
from plait.serve import ServeOptions, app
from plait.serve.http_protocol import http_protocol
from plait.testing import ScriptedServer
from serve.support import serving, upstream

FLOOD_LIMIT = 17 * 1_048_576
"""Bytes of one header line the flood sends at most (uvicorn alone took all of them)."""

TAKEN_AT_MOST = 16 * 1_048_576
"""What the flood may have sent when it is refused: 64 KiB reach the server's parser, and the
rest is what the kernel's buffers took, and the server's linger dropped, before the client
saw the 431 (the client waits up to 50 ms for it after each 64 KiB, so this margin holds
unless the answer takes seconds)."""


def head_flood(url: str) -> tuple[bytes, int]:
    """Sends one header line without end until the server answers or closes the connection;
    returns what it answered and how many bytes of the line were sent before."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65_536)
        sock.settimeout(10)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Flood: ")
        chunk, sent = b"a" * 65_536, 0
        while sent < FLOOD_LIMIT and not select.select([sock], [], [], 0.05)[0]:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            except TimeoutError:
                return b"(it stopped reading, unanswered)", sent
            sent += len(chunk)
        try:
            answer = sock.recv(65_536)
        except ConnectionResetError:
            answer = b""
        except TimeoutError:
            answer = b"(no answer)"
    return answer, sent


async def exchange(url: str, data: bytes, guard: float = 20.0) -> bytes:
    """Sends ``data`` on a new connection, then reads until the server closes it."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), guard)
    finally:
        writer.close()


def options(**given: Any) -> Any:
    return http_protocol(ServeOptions(**given))


async def test_a_head_over_the_limit_is_431_before_a_megabyte_is_taken() -> None:
    async with ScriptedServer() as server:
        served = app({"llm": LLMInference("llm")}, upstream(server))
        async with serving(served, http=options()) as url:
            answer, sent = await asyncio.to_thread(head_flood, url)
            async with httpx.AsyncClient(timeout=30) as client:
                large = await client.get(f"{url}/healthz", headers={"x-big": "a" * 100_000})
                fits = await client.get(f"{url}/healthz", headers={"x-big": "a" * 60_000})
    assert answer.startswith(b"HTTP/1.1 431 ") or answer == b"", (answer[:200], sent)
    assert sent < TAKEN_AT_MOST, f"the server took {sent} bytes of one header line"
    assert large.status_code == 431
    assert large.json()["error"]["type"] == "head_too_large"
    assert "larger than 65536 bytes" in large.json()["error"]["message"]
    assert fits.status_code == 200


async def test_a_request_not_sent_in_time_is_408_and_its_connection_closed() -> None:
    async with ScriptedServer() as server:
        served = app({"llm": LLMInference("llm")}, upstream(server))
        async with serving(served, http=options(head_timeout=0.5, body_timeout=0.5)) as url:
            half_heads = [
                exchange(url, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
                for _ in range(40)
            ]
            silent = [exchange(url, b"") for _ in range(40)]
            half_body = exchange(
                url,
                b"POST /programs/llm/run HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"prompt"',
            )
            kept_alive = exchange(  # one whole request, then half of the next
                url,
                b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n",
            )
            answers = await asyncio.gather(*half_heads, *silent, half_body, kept_alive)
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers[:40]), answers[0]
    assert b'"type":"request_timeout"' in answers[0] and b"request's head" in answers[0]
    assert answers[40:80] == [b""] * 40  # never started a request: closed unanswered
    assert answers[80].startswith(b"HTTP/1.1 408 ") and b"request's body" in answers[80]
    assert answers[81].startswith(b"HTTP/1.1 200 ") and answers[81].count(b"HTTP/1.1 ") == 2
    assert b"HTTP/1.1 408 " in answers[81]
    assert server.stats.requests == 0


async def test_a_run_longer_than_the_timeouts_is_answered_on_a_kept_alive_connection() -> None:
    async with ScriptedServer(latency=1.0) as server:
        served = app({"llm": LLMInference("llm")}, upstream(server))
        async with (
            serving(served, http=options(head_timeout=0.3, body_timeout=0.3)) as url,
            httpx.AsyncClient(timeout=30) as client,
        ):
            first = await client.post(f"{url}/programs/llm/run", json={"prompt": "a"})
            second = await client.post(f"{url}/programs/llm/run?stream=true", json={"prompt": "b"})
            body = b'{"prompt": "c"}'
            pipelined = await exchange(  # half of the next request waits while the run runs
                url,
                b"POST /programs/llm/run HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                b"GET /healthz HTTP/1.1\r\n" % (len(body), body),
            )
    assert first.status_code == 200 and first.json()["output"] == "echo: a"
    assert second.status_code == 200 and "echo: b" in second.text
    assert pipelined.startswith(b"HTTP/1.1 200 ") and b'"output":"echo: c"' in pipelined
    assert b"HTTP/1.1 408 " in pipelined  # then the half request's own time ran out


class _WriteLog(asyncio.Transport):
    """A connection's transport that keeps what is written to it, one entry per call, so a
    test sees how many writes (system calls, packets) an answer took."""

    def __init__(self) -> None:
        super().__init__({"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)})
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.writes.append(b"".join(list_of_data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def written(transport: _WriteLog, ends: bytes) -> None:
    """Lets the loop turn until what was written to ``transport`` ends with ``ends``."""
    for _ in range(1000):
        if b"".join(transport.writes).endswith(ends):
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not written: {ends!r}; written: {transport.writes!r}")


def connection(asgi: Any) -> tuple[Any, _WriteLog]:
    """The protocol `plait.serve.serve` runs, serving ``asgi`` on a `_WriteLog`."""
    config = uvicorn.Config(
        asgi, http=http_protocol(ServeOptions()), lifespan="off", log_config=None, access_log=False
    )
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = _WriteLog()
    protocol.connection_made(transport)
    return protocol, transport


async def test_a_json_answer_is_written_in_one_write() -> None:
    served = app(LLMInference("llm", "Answer."), {"llm": {"provider": "test"}})
    protocol, transport = connection(served)
    protocol.data_received(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await written(transport, b'{"status":"ok"}')
    protocol.connection_lost(None)
    assert len(transport.writes) == 1, transport.writes  # head and body together
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.writes[0].endswith(b'\r\n\r\n{"status":"ok"}')


async def test_a_head_whose_body_waits_is_written_within_the_loops_turn() -> None:
    go_on = asyncio.Event()

    async def stream(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await go_on.wait()  # no event yet: the client must have the head meanwhile
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": False})

    protocol, transport = connection(stream)
    protocol.data_received(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await written(transport, b"chunked\r\n\r\n")
    assert len(transport.writes) == 1 and transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    go_on.set()
    await written(transport, b"data: 1\n\n\r\n0\r\n\r\n")
    protocol.connection_lost(None)
    assert len(transport.writes) == 2
