"""A transport's first requests while aiohttp is still being imported: ``http.client`` on a thread.

In a cold process aiohttp takes longer to import than a model takes to
answer a short call, and nothing of it is needed until the first request is
sent. So while a background thread imports it (`plait.backends._imports`),
`AiohttpTransport.post` sends its first non-streamed requests with the
standard library's ``http.client``, each on a thread of its own that waits
for the socket with the GIL released: the import goes on during the wait for
the reply instead of before the request. Once aiohttp is imported, every
request goes through the aiohttp session as before.

Only what is the same either way is sent this way: a plain ``POST`` of the
same body and headers to an http(s) URL with an ASCII host name, one
connection per request (closed after it), TLS verified with the default
context (as aiohttp's), no proxy (aiohttp's session ignores the environment's
too). At most `MAX_IN_FLIGHT` requests of one transport go this way at once;
the others, and streams, wait for aiohttp. A redirect is not followed here:
the caller resends the request over aiohttp, which follows it. The caller maps
the errors, as for aiohttp: `TimeoutError` for a timeout, `OSError` for any
failure to connect, send or read (``http.client``'s own errors arrive as
`ConnectionError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import ssl

__all__ = ["MAX_IN_FLIGHT", "FirstRequests", "Reply"]

MAX_IN_FLIGHT = 4
"""Requests of one transport sent with ``http.client`` at once; more wait for aiohttp."""

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Reply:
    """What a request sent with ``http.client`` got back."""

    status: int
    reason: str
    headers: Mapping[str, str]
    """Names in lower case (what `parse_retry_after` looks up)."""
    body: bytes
    """At most ``max_body + 1`` bytes: one more than that means the body was too large."""
    declared_length: int | None
    """The ``Content-Length`` the server declared (the body is not read when it is over the cap)."""


class FirstRequests:
    """Sends one transport's requests with ``http.client`` while aiohttp is being imported.

    Args:
        url: the endpoint's URL (``.../chat/completions``, any query kept).
        headers: the headers of every request.
        max_body: the largest reply body read.
    """

    def __init__(self, url: str, headers: Mapping[str, str], max_body: int) -> None:
        self._headers = dict(headers)
        if not any(name.lower() == "user-agent" for name in self._headers):
            version = ".".join(map(str, sys.version_info[:2]))
            self._headers["User-Agent"] = f"Python/{version} plait"
        self._max_body = max_body
        self._tls: ssl.SSLContext | None = None
        self._tls_lock = threading.Lock()
        self.in_flight = 0
        self.usable = False
        """Whether this URL may be sent to this way at all."""
        self._https = False
        self._host = ""
        self._port: int | None = None
        self._target = ""
        try:
            parts = urlsplit(url)
            host, port = parts.hostname, parts.port
        except ValueError:  # the aiohttp path reports a malformed URL
            return
        if parts.scheme not in ("http", "https") or not host or not host.isascii():
            return
        if parts.username is not None or parts.password is not None:
            return
        self.usable = True
        self._https = parts.scheme == "https"
        self._host, self._port = host, port
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def can_send(self) -> bool:
        """Whether a request may be sent this way now (the URL allows it and a place is free)."""
        return self.usable and self.in_flight < MAX_IN_FLIGHT

    async def post(self, data: bytes, timeout: float | None) -> Reply:
        """Sends ``data`` as the body of a POST; returns the reply, whatever its status.

        Raises:
            TimeoutError: no whole reply within ``timeout`` seconds.
            OSError: the connection failed or dropped, or the reply was not HTTP.
        """
        self.in_flight += 1
        try:
            if timeout is None:
                return await _in_thread(lambda: self._send(data, None))
            async with asyncio.timeout(timeout):
                return await _in_thread(lambda: self._send(data, timeout))
        finally:
            self.in_flight -= 1

    def _send(self, data: bytes, timeout: float | None) -> Reply:
        """Sends one request and reads its reply, blocking (on its own thread)."""
        import http.client

        connection: http.client.HTTPConnection
        if self._https:
            connection = http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=self._tls_context()
            )
        else:
            connection = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        try:
            connection.request("POST", self._target, body=data, headers=self._headers)
            response = connection.getresponse()
            declared = _declared_length(response.getheader("Content-Length"))
            over = declared is not None and declared > self._max_body
            body = b"" if over else response.read(self._max_body + 1)
            headers = {name.lower(): value for name, value in response.getheaders()}
            return Reply(response.status, response.reason, headers, body, declared)
        except http.client.HTTPException as exc:  # not an OSError: the reply was not HTTP
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            connection.close()

    def _tls_context(self) -> ssl.SSLContext:
        with self._tls_lock:
            if self._tls is None:
                import ssl

                self._tls = ssl.create_default_context()
            return self._tls


def _declared_length(value: str | None) -> int | None:
    if value is None or not value.strip().isdigit():
        return None
    return int(value)


async def _in_thread(call: Callable[[], _T]) -> _T:
    """Runs ``call`` on a daemon thread of its own; awaits its result without blocking the loop.

    Not the loop's default executor: its few threads are shared with name
    resolution, and exiting Python waits for them, while a request given no
    timeout may never end.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()

    def run() -> None:
        try:
            result: Any = call()
        except BaseException as exc:
            settle = _failer(future, exc)
        else:
            settle = _setter(future, result)
        with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile
            loop.call_soon_threadsafe(settle)

    threading.Thread(target=run, name="plait-first-request", daemon=True).start()
    return await future


def _setter(future: asyncio.Future[Any], result: Any) -> Callable[[], None]:
    def settle() -> None:
        if not future.done():  # a cancelled caller no longer waits
            future.set_result(result)

    return settle


def _failer(future: asyncio.Future[Any], exc: BaseException) -> Callable[[], None]:
    def settle() -> None:
        if not future.done():
            future.set_exception(exc)

    return settle
