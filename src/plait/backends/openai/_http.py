"""plait's HTTP/1.1 client for one endpoint: keep-alive connections read by httptools.

`HttpTransport` sends every chat-completions request through here. The
client does only what such a request needs, so a call costs little more than
its socket: each request is one ``POST`` written as bytes (the request line
and the endpoint's headers are built once per endpoint), each reply is parsed
by httptools (the C llhttp parser) inside an ``asyncio.Protocol``, and
connections are kept open and reused, last used first. On the 2,000-call
workload of ``benchmarks/scheduler_bench.py`` (64 in flight) a bare client of
this design spent ~0.08 ms of CPU per call where bare aiohttp spent 0.2-0.29,
and plait as a whole went from 0.37-0.45 ms per call on aiohttp to 0.17-0.22
on this client; most of what is left is the kernel's send on loopback.

What it does, and what it leaves out on purpose:

* Bodies with a ``Content-Length``, chunked bodies, and bodies that end when
  the server closes the connection; a body over the cap is refused as soon as
  its declared length, or what has arrived, passes it (`BodyTooLarge`).
* Interim replies (``100 Continue``, ``102 Processing``, ``103 Early Hints``)
  are skipped, their headers dropped, and the final reply after them is read;
  a ``101 Switching Protocols`` fails the call and closes its connection (no
  upgrade is ever asked for).
* A reply's status line and headers, with any interim replies before them,
  may take 64 KiB; a capped reply its cap plus 64 KiB of framing and trailers;
  an uncapped body (a stream's) 64 KiB of framing and trailers after the last
  read that brought it a byte. All counted as fed to the parser (which buffers
  a header or trailer until its line ends): an endless one is refused.
* No ``Accept-Encoding`` is sent, so replies come uncompressed and a cap on
  the bytes read is a cap on the body.
* Redirects are not followed (the caller reports them): a chat request is a
  ``POST``, and following it elsewhere is the user's decision.
* A proxy when the environment names one (``HTTPS_PROXY``, ``HTTP_PROXY``,
  ``NO_PROXY``; `_proxy`): decided once per pool, so a pool without one opens
  connections as before; https goes through a ``CONNECT`` tunnel. No cookies.
* A connection the server closed while it was idle is dropped from the pool
  when its close arrives, before any request could use it. A request that is
  dropped without a reply on a reused connection is not sent again here: the
  server may have read it (a POST is not safe to repeat unseen), so it fails
  as a dropped connection and the resource layer decides, counting the retry
  as any other (tests/resilience/test_faults.py holds the counts to the
  server's log).
* A stream's socket stops being read while 256 KiB of it wait unread, and
  reading starts again as the consumer takes them.
* One deadline covers a whole call: connecting, sending and reading the reply
  (for a stream, every event), as aiohttp's ``total`` timeout did. The waits of a
  pool's calls share one timer (`_deadlines.Deadlines`), not one each.

Failures raise `TimeoutError`, `OSError` (a `ConnectionError` for a dropped
connection, a reply that is not HTTP, a ``101``, or a head or an uncapped
body's trailers past 64 KiB; `ssl.SSLError`, a failed name lookup),
`BodyTooLarge` (a capped reply past its cap) or `InvalidURL`; the transport
turns them into plait's errors. httptools is imported with this module, which
the transport imports at its first call (``import plait`` stays fast).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

import httptools

from plait.backends.openai._deadlines import Deadlines
from plait.backends.openai._proxy import ProxyError, connect, open_tunnel, proxy_for

if TYPE_CHECKING:
    import ssl

__all__ = ["BodyTooLarge", "ConnectionPool", "Exchange", "InvalidURL", "ProxyError", "Reply"]

_PAUSE_AT = 256 * 1024
"""Bytes of a streamed body held unread before the socket stops being read."""
_MAX_HEAD = 64 * 1024
"""The most bytes a reply's status line and headers may take (interim 1xx replies before
them included), what a capped reply may take beyond its cap for chunk framing and trailers,
and what an uncapped body may take of them in a row without a body byte (a hostile server's
endless header or trailer is refused here: httptools buffers one until its line ends)."""

_SWITCHED = "the server answered 101 Switching Protocols, an upgrade plait did not ask for"

# Characters left as they are in the request target: what may stand in a URL
# unescaped. Anything else (a space, a control character, non-ASCII) is
# percent-encoded, as yarl did for aiohttp.
_TARGET_SAFE = "!#$%&'()*+,/:;=?@[]~"

_tls_context: ssl.SSLContext | None = None


class InvalidURL(ValueError):
    """The endpoint's URL cannot be sent to: what is wrong is the message."""


class BodyTooLarge(Exception):
    """A reply body passed the cap: ``size`` bytes, its ``declared`` length or what arrived."""

    def __init__(self, size: int, declared: bool) -> None:
        super().__init__(f"a reply body of {size} bytes")
        self.size = size
        self.declared = declared


class Reply:
    """A whole reply: status, reason phrase, headers (names in lower case) and body."""

    __slots__ = ("body", "headers", "reason", "status")

    def __init__(self, status: int, reason: str, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body


def _default_tls() -> ssl.SSLContext:
    """Returns the TLS context of every https endpoint: the system's CAs, verified."""
    global _tls_context
    if _tls_context is None:
        import ssl  # import time: only an https endpoint

        _tls_context = ssl.create_default_context()
    return _tls_context


class Exchange(asyncio.Protocol):
    """One connection, and the reply it is reading now.

    An ``asyncio.Protocol``: the loop hands it the bytes, httptools calls its
    ``on_*`` methods, and the one coroutine waiting for the reply is woken
    when there is something for it (the headers, body bytes, the end, a
    failure). The callbacks never raise (httptools would wrap the error);
    they record it in ``error`` and wake the waiter.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.deadlines: Deadlines | None = None
        """Where the waits' deadlines are kept: its pool's, on the pool's loop."""
        self._reset(0, False)

    def _reset(self, limit: int, streamed: bool) -> None:
        self.limit = limit
        """The largest body accepted (0: any; a stream's events are capped by its reader)."""
        self.streamed = streamed
        self.received = False
        """Whether any byte of the current reply has arrived."""
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self.fed = 0
        """Bytes of the current reply given to the parser: interim replies, head, framing,
        body and trailers."""
        self.interims = 0
        """Interim (1xx) replies skipped before the current one's head."""
        self.tail = 0
        """Bytes of an uncapped body's framing and trailers read since its body last grew."""
        self.complete = False
        self.keep_alive = False
        self.error: BaseException | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        if self.error is not None:
            return
        size, in_body = self.size, self.headers_done  # to see what this read brought
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(ConnectionError(f"the reply is not valid HTTP/1.1 ({exc})"))
            return
        if self.error is None:
            # What the parser may hold beyond the body it hands on: a header, or a
            # trailer, is buffered until its line ends. One read is at most the
            # loop's read size, so the bytes held stay near these bounds.
            self.fed += len(data)
            if not self.headers_done:
                if self.fed > _MAX_HEAD:
                    self._fail(ConnectionError(self._head_too_long()))
            elif self.limit:
                if self.fed > self.limit + _MAX_HEAD:
                    self._fail(BodyTooLarge(self.fed, declared=False))
            elif in_body and self.size == size:
                # An uncapped body (a stream's) got no byte from this read, only framing
                # or a trailer: at most 64 KiB of those are taken in a row.
                self.tail += len(data)
                if self.tail > _MAX_HEAD:
                    passed = f"the reply's framing and trailers passed {_MAX_HEAD // 1024} KiB"
                    self._fail(ConnectionError(f"{passed} after the body's last byte"))
            else:
                self.tail = 0

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.complete or self.error is not None:
            self._wake()
            return
        if self.headers_done and not self._has_length():
            self.on_message_complete()  # a body that ends with the connection
            return
        if exc is None:
            cause = "the server closed the connection"
            if self.received:
                cause += " in the middle of its reply"
            self._fail(ConnectionError(cause))
        else:
            self._fail(ConnectionError(f"the connection was lost ({type(exc).__name__}: {exc})"))

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:  # a reply nobody asked for, on an idle connection: unusable now
            self._fail(ConnectionError("the server sent a reply to no request"))

    def on_status(self, reason: bytes) -> None:
        self.reason += reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        known = self.headers.get(key)
        self.headers[key] = text if known is None else f"{known}, {text}"

    def on_headers_complete(self) -> None:
        self.status = status = self.parser.get_status_code()
        if status < 200:  # an interim reply (100 Continue, 103 Early Hints): skipped when complete
            if status == 101:  # what follows it is another protocol's
                self._fail(ConnectionError(_SWITCHED))
            return
        self.headers_done = True
        if self.streamed and self.status < 300:
            self.limit = 0
        length = self.headers.get("content-length")
        if self.limit and length is not None and length.strip().isdigit():
            declared = int(length)
            if declared > self.limit:
                self._fail(BodyTooLarge(declared, declared=True))
                return
        if self.streamed:
            self._wake()

    def on_body(self, body: bytes) -> None:
        if self.error is not None:
            return
        self.size += len(body)
        if self.limit and self.size > self.limit:
            self._fail(BodyTooLarge(self.size, declared=False))
            return
        self.chunks.append(body)
        if self.streamed and not self.limit:  # a stream's events; an error body is read whole
            self.buffered += len(body)
            if self.buffered > _PAUSE_AT and not self.paused and self.transport is not None:
                self.paused = True
                self.transport.pause_reading()
            self._wake()

    def on_message_complete(self) -> None:
        if self.status < 200:
            # An interim reply ends at its head (the parser reads no body for a 1xx), and
            # the final reply follows on the connection; its bytes stay counted in `fed`,
            # so an endless series of them meets the head's bound.
            self.interims += 1
            self.status = 0
            self.reason = ""
            self.headers = {}
            return
        self.complete = True
        # Read now: once the message is complete, the parser answers for the next one.
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # -- the waiting side ----------------------------------------------------------------

    def _head_too_long(self) -> str:
        passed = f"passed {_MAX_HEAD // 1024} KiB"
        if self.interims:
            interim = f"the {self.interims} interim (1xx) replies before them"
            return f"the reply's headers and {interim} {passed}"
        return f"the reply's headers {passed}"

    def _has_length(self) -> bool:
        headers = self.headers
        return "content-length" in headers or "chunked" in headers.get("transfer-encoding", "")

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.close()
        self._wake()

    def close(self) -> None:
        """Closes the connection (a reply cut short cannot be read past)."""
        self.closed = True
        transport = self.transport
        if transport is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed already
                transport.close()

    async def wait(self, deadline: float | None) -> None:
        """Waits until the reply has news or fails; raises `TimeoutError` at ``deadline``
        (kept by the pool's `Deadlines`, which the pool gives the exchange before its
        first wait)."""
        if self.error is not None:
            raise self.error
        deadlines = self.deadlines
        assert deadlines is not None  # set by ConnectionPool._send
        waiter = self.waiter = deadlines.loop.create_future()
        if deadline is not None:
            deadlines.add(waiter, deadline)
        try:
            await waiter
        finally:
            self.waiter = None
            if deadline is not None:
                deadlines.remove(waiter)
        if self.error is not None:
            raise self.error

    def take(self) -> list[bytes]:
        """Returns the body bytes arrived since the last call; reading resumes if it paused."""
        chunks, self.chunks = self.chunks, []
        self.buffered = 0
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()
        return chunks

    async def read_body(self, deadline: float | None) -> bytes:
        """Returns the rest of the body, once the reply is complete."""
        while not self.complete:
            await self.wait(deadline)
        chunks = self.take()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def iter_body(self, deadline: float | None) -> AsyncIterator[bytes]:
        """Yields the body in the pieces it arrives in, until the reply is complete."""
        while True:
            if self.chunks:
                for chunk in self.take():
                    yield chunk
                continue  # more may have come (and the end) while the caller held a chunk
            if self.complete:
                return
            await self.wait(deadline)

    def reply(self, body: bytes) -> Reply:
        return Reply(self.status, self.reason, self.headers, body)


class ConnectionPool:
    """Sends POST requests to one URL over reused connections.

    A pool belongs to the event loop that first used it; a call from another
    loop (``run_sync`` makes one per call) drops the connections of the old
    one and starts afresh.

    Args:
        url: where every request goes (``http`` or ``https``), any query kept.
        headers: sent with every request (``Host`` and ``Content-Length`` are added).
        max_connections: the most connections open at once; None or 0 for no cap.

    Raises:
        InvalidURL: the URL is not one a request can be sent to.
        ProxyError: the environment names a proxy for it that plait cannot use.
    """

    def __init__(
        self, url: str, headers: Mapping[str, str], max_connections: int | None = None
    ) -> None:
        self._host, self._port, self._tls, authority, target = _parse(url)
        self._proxy = proxy_for("https" if self._tls else "http", self._host, self._port)
        lines = [f"POST {target} HTTP/1.1", f"Host: {authority}"]
        if self._proxy is not None and not self._tls:  # to the proxy: the absolute URL
            lines[0] = f"POST http://{authority}{target} HTTP/1.1"
            if self._proxy.authorization:
                lines.append(f"Proxy-Authorization: {self._proxy.authorization}")
        # The backend refused names and values that would break the head (a line break).
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        if not any(name.lower() == "user-agent" for name in headers):
            lines.append(f"User-Agent: Python/{sys.version_info[0]}.{sys.version_info[1]} plait")
        lines.append("Content-Length: ")
        self._head = "\r\n".join(lines).encode("utf-8")
        self._max_connections = max_connections or 0
        self._idle: list[Exchange] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0
        """The thread that last called on ``_loop``."""
        self._deadlines: Deadlines | None = None
        self._permits: asyncio.Semaphore | None = None
        self._closed = False

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        # The pool's loop, running in this thread, is the loop of this call (a thread runs
        # one loop at a time): known without asyncio.get_running_loop, which on Python
        # 3.11 makes a getpid system call (once per call: ~2 % of plait run's loop samples).
        if loop is not None and self._thread == threading.get_ident() and loop.is_running():
            return loop
        loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        if self._loop is not loop:
            for exchange in self._idle:
                exchange.close()
            self._idle = []
            self._loop = loop
            self._deadlines = Deadlines(loop)
            limit = self._max_connections
            self._permits = asyncio.Semaphore(limit) if limit else None
            self._closed = False
        return loop

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> Exchange:
        tls = _default_tls() if self._tls else None
        proxy = self._proxy
        if proxy is None:
            _, exchange = await loop.create_connection(
                Exchange,
                self._host,
                self._port,
                ssl=tls,
                server_hostname=self._host if tls else None,
            )
            return exchange
        if tls is None:  # plain http: the proxy forwards each request
            sock = await connect(loop, proxy)
        else:  # https: TLS with the host, through the proxy's tunnel
            sock = await open_tunnel(loop, proxy, self._host, self._port)
        try:
            _, exchange = await loop.create_connection(
                Exchange, sock=sock, ssl=tls, server_hostname=self._host if tls else None
            )
        except BaseException:
            sock.close()
            raise
        return exchange

    async def _send(
        self,
        body: bytes,
        deadline: float | None,
        limit: int,
        streamed: bool,
        loop: asyncio.AbstractEventLoop,
    ) -> Exchange:
        """Sends the request; returns its exchange once the reply began (or, if whole, ended)."""
        data = b"%s%d\r\n\r\n%s" % (self._head, len(body), body)
        exchange = self._take_idle()
        if exchange is None:
            if deadline is None:
                exchange = await self._connect(loop)
            else:
                async with asyncio.timeout_at(deadline):
                    exchange = await self._connect(loop)
        exchange._reset(limit, streamed)
        exchange.deadlines = self._deadlines
        try:
            assert exchange.transport is not None
            exchange.transport.write(data)
            while not (exchange.complete or (streamed and exchange.headers_done)):
                await exchange.wait(deadline)
        except BaseException:
            exchange.close()
            raise
        return exchange

    def _take_idle(self) -> Exchange | None:
        """Returns the connection used last that is still open, or None."""
        idle = self._idle
        while idle:
            exchange = idle.pop()
            transport = exchange.transport
            if not exchange.closed and transport is not None and not transport.is_closing():
                return exchange
        return None

    def release(self, exchange: Exchange) -> None:
        """Keeps ``exchange``'s connection for the next request if its reply was read to the end."""
        if (
            exchange.complete
            and not exchange.closed
            and not self._closed
            and exchange.keep_alive
            and exchange.transport is not None
            and exchange.transport.get_protocol() is exchange
        ):
            exchange.waiter = None
            exchange.chunks = []
            self._idle.append(exchange)
        else:
            exchange.close()

    async def post(self, body: bytes, timeout: float | None, limit: int) -> Reply:
        """Sends ``body``; returns the whole reply, whatever its status.

        Args:
            body: the request body (JSON).
            timeout: seconds for the whole call; None waits forever.
            limit: the largest reply body accepted.
        """
        loop = self._bind()
        deadline = None if timeout is None else loop.time() + timeout
        permits = self._permits
        if permits is not None:
            await permits.acquire()
        try:
            exchange = await self._send(body, deadline, limit, False, loop)
            try:
                reply = exchange.reply(await exchange.read_body(deadline))
            except BaseException:
                exchange.close()
                raise
            self.release(exchange)
            return reply
        finally:
            if permits is not None:
                permits.release()

    @contextlib.asynccontextmanager
    async def stream(
        self, body: bytes, timeout: float | None, limit: int
    ) -> AsyncIterator[tuple[Exchange, float | None]]:
        """Sends ``body``; yields the exchange once the reply's headers came, and its deadline.

        A successful reply's body is read with `Exchange.iter_body` (no cap:
        the stream's reader caps each event); an error reply's body, with
        `Exchange.read_body`, within ``limit``. The connection is kept only
        when the body was read to its end.
        """
        loop = self._bind()
        deadline = None if timeout is None else loop.time() + timeout
        permits = self._permits
        if permits is not None:
            await permits.acquire()
        try:
            exchange = await self._send(body, deadline, limit, True, loop)
            try:
                yield exchange, deadline
            except BaseException:
                exchange.close()
                raise
            self.release(exchange)
        finally:
            if permits is not None:
                permits.release()

    def close(self) -> None:
        """Closes the idle connections; those in use close when their replies end."""
        self._closed = True
        for exchange in self._idle:
            exchange.close()
        self._idle = []


def _parse(url: str) -> tuple[str, int, bool, str, str]:
    """Returns (host, port, is_https, the Host header, the request target) of ``url``."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise InvalidURL(f"{type(exc).__name__}: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidURL(f"the scheme is {parts.scheme!r}, not http or https")
    if not host:
        raise InvalidURL("it has no host name")
    if any(c.isspace() or ord(c) < 32 for c in host):
        raise InvalidURL(f"the host {host!r} holds a space or a control character")
    if ":" in host:  # an IPv6 address
        ascii_host = host
        shown = f"[{host}]"
    else:
        ascii_host = shown = _ascii_host(host)
    tls = parts.scheme == "https"
    default = 443 if tls else 80
    authority = shown if port is None or port == default else f"{shown}:{port}"
    target = quote(parts.path or "/", safe=_TARGET_SAFE)
    if parts.query:
        target += "?" + quote(parts.query, safe=_TARGET_SAFE)
    return ascii_host, port or default, tls, authority, target


def _ascii_host(host: str) -> str:
    """Returns ``host`` as the resolver and the ``Host`` header take it (IDNA for non-ASCII).

    An ASCII name is checked as the codec would check it (every label but a
    trailing one 1 to 63 characters long) without loading the codec, whose
    import (``stringprep``, ``unicodedata``) costs a cold process's first call
    more than the rest of this parse.
    """
    if host.isascii():
        *labels, last = host.split(".")
        if all(0 < len(label) < 64 for label in labels) and len(last) < 64:
            return host
        raise InvalidURL(f"the host name {host!r} has an empty or over-long label")
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise InvalidURL(f"host {host!r}: {type(exc).__name__}: {exc}") from exc
