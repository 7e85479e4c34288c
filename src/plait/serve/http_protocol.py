"""`BoundedHttp`: uvicorn's httptools protocol, with a bound on each request's head and on
the time a client takes to send a request; `http_protocol` makes it from `ServeOptions`.

uvicorn bounds neither with httptools, the parser it picks when installed (a plait
dependency): the parser keeps a header line growing for as long as the client sends it
(one connection sent 88 MiB of one header line unanswered; the server grew 125 MB), and a
connection that sends part of a request, or nothing, stays open for as long as the client
likes (uvicorn's ``timeout_keep_alive`` runs only between requests). h11's
``h11_max_incomplete_event_size`` bounds the head but not the time. So `plait.serve.serve`
runs uvicorn with this protocol:

- a head (request line and headers) over ``max_head_bytes`` is answered 431 before the
  parser is given more of it; the bytes of a head are counted as they arrive, so at most
  one read (256 KiB with uvloop) past the bound reaches the parser when a head follows
  the end of a request in the same read;
- a head must arrive within ``head_timeout`` of the connection's opening (or, on a
  connection kept alive, of the head's first byte), and a body within ``body_timeout`` of
  its head; past either, 408 (a connection that sent nothing is closed without an answer);
- a refused connection is shut for writing after the answer, and what the client still
  sends is read and dropped for up to a second before it is closed, so a client still
  sending reads the answer rather than a reset.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

if TYPE_CHECKING:
    from plait.serve.options import ServeOptions

__all__ = ["BoundedHttp", "HeadWithBody", "http_protocol"]

_LINGER = 1.0
"""Seconds a refused connection drops what its client still sends before it is closed."""

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def http_protocol(options: ServeOptions) -> Any:
    """Returns the protocol factory uvicorn runs the server with (its ``http=``): `BoundedHttp`
    with the options' ``max_head_bytes``, ``head_timeout`` and ``body_timeout``.

    Example::

        uvicorn.run(asgi, host="127.0.0.1", http=http_protocol(asgi.state.options))
    """
    return functools.partial(
        BoundedHttp,
        max_head_bytes=options.max_head_bytes,
        head_timeout=options.head_timeout,
        body_timeout=options.body_timeout,
    )


class BoundedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol, answering 431 to a request head over ``max_head_bytes``
    and 408 to a request not sent within its time (see the module's text).

    Args:
        config, server_state, app_state: uvicorn's, as it passes them to every protocol.
        max_head_bytes: the largest request head.
        head_timeout: seconds a head may take to arrive.
        body_timeout: seconds a body may take to arrive once its head is in.
    """

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        max_head_bytes: int,
        head_timeout: float,
        body_timeout: float,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.max_head_bytes = max_head_bytes
        self.head_timeout = head_timeout
        self.body_timeout = body_timeout
        self._in_head = True
        """Whether the bytes arriving now are a request's head (or the wait for one)."""
        self._head_started = False
        """Whether the parser has begun a request whose head is not in."""
        self._in_body = False
        """Whether a request's head is in and its body is not."""
        self._head_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # what a refused client still sends is dropped unread
        if not self._in_head or self._head_bytes + len(data) <= self.max_head_bytes:
            if self._in_head:
                self._head_bytes += len(data)  # the parser's callbacks reset it at a head's end
            super().data_received(data)
        else:
            self._feed_head(data)
        if self._timer is None and not self._refused and not self.transport.is_closing():
            # armed only for a request left unfinished by this read, so a request that
            # arrives whole (most do) costs no timer
            if self._in_head and (self._head_bytes or self._head_started):
                self._arm(self.head_timeout)
            elif self._in_body and not self.pipeline:  # a queued request's body waits its turn
                self._arm(self.body_timeout)

    def _feed_head(self, data: bytes) -> None:
        """Feeds ``data`` to the parser no further into a head than ``max_head_bytes``; past
        that, 431. What follows a head's end in ``data`` is fed as usual."""
        while data and not self._refused and not self.transport.is_closing():
            if not self._in_head:
                super().data_received(data)
                return
            room = self.max_head_bytes - self._head_bytes
            piece, data = data[:room], data[room:]
            self._head_bytes += len(piece)
            if piece:
                super().data_received(piece)
            if self._in_head and self._head_bytes >= self.max_head_bytes and data:
                self._refuse(
                    431,
                    "head_too_large",
                    f"the request head (request line and headers) is larger than "
                    f"{self.max_head_bytes} bytes, this server's limit; send shorter headers",
                )

    # The parser's callbacks where a request starts, its head ends, and it ends.

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_started = True  # (its bytes may be uncounted: after a request, same read)

    def on_headers_complete(self) -> None:
        cycle = self.cycle
        super().on_headers_complete()
        if self.cycle is not cycle:  # a request to answer (not an upgrade)
            self.cycle.transport = HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]
        self._head_started = False
        self._in_head = False
        self._in_body = True
        self._disarm()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()
        self._in_head = True
        self._in_body = False
        self._head_bytes = 0

    # Timers and refusals.

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            return
        if self._in_head and not (self._head_bytes or self._head_started):
            self.transport.close()  # it never started a request: nothing to answer
            return
        if self._in_head and self.cycle is not None and not self.cycle.response_complete:
            self._arm(self.head_timeout)  # the request before it is being answered: wait
            return
        if not self._in_head and self.cycle.response_started:
            self.transport.close()  # answered before its body came (413, 415): just close
            return
        part = "head" if self._in_head else "body"
        seconds = self.head_timeout if self._in_head else self.body_timeout
        self._refuse(
            408,
            "request_timeout",
            f"the request's {part} did not arrive within {seconds:g} s, this server's limit; "
            "send each request whole and promptly",
        )

    def _refuse(self, status: int, kind: str, message: str) -> None:
        """Answers ``status`` with plait's JSON error, ends the request the app may be
        reading (it sees the client leave), and closes the connection after the linger; while
        the answer to a request before it is being sent, only closes the connection."""
        self._refused = True
        self._disarm()
        cycle = self.cycle
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            self.transport.close()  # an answer to a request before it is under way
            return
        body = orjson.dumps({"error": {"type": kind, "message": message, "request_id": ""}})
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
            status,
            _REASONS[status],
            len(body),
        )
        self.transport.write(head + b"connection: close\r\n\r\n" + body)
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        self._timer = self.loop.call_later(_LINGER, self.transport.close)


class HeadWithBody:
    """The transport one answer is written through (uvicorn's request cycle writes to it):
    the answer's first write, its status line and headers, waits for the next, its body, and
    both go out in one write, so a JSON answer costs the server one system call and the
    client one packet instead of two. A head whose body does not follow within the same turn
    of the event loop (an event stream waiting for its first event, a HEAD request's) is
    written at the end of that turn. Everything else is the connection's transport's.
    """

    __slots__ = ("_first", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._first = True

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.writelines((held, data))
        elif self._first:
            self._first = False
            self._held = bytes(data)
            self._loop.call_soon(self._write_held)
        else:
            self._transport.write(data)

    def _write_held(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._write_held()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
