"""The two ways `OpenAICompatBackend` reaches a server: plait's own HTTP client, or the SDK.

Both take a chat-completions body (a dict), send it, and hand back the
decoded JSON of the reply's own bytes: one value for a completion, an async
iterator of values for a stream (whether they have the right shape is for
`_wire` to check). Both read within the endpoint's caps
(``max_response_bytes`` per body, ``max_event_bytes`` per event).
Both map every failure onto plait's errors the same way (`_errors.py`): each
call runs inside one `with` block (`_ForeignErrors`) that puts plait's error in
place of the library's own, so a failure reads the same whether it stops a
whole reply or a stream. Neither retries (the resource layer owns retries;
SPEC §4.4).

`HttpTransport` is the default because it is cheap: keep-alive connections
parsed by httptools (`_http`), the request's head built once per endpoint,
orjson for both directions, so a call costs little more than its socket. The
SDK costs several times more CPU per call (SPEC §4.4); it is here for users
who need its authentication features. Both honour the environment's proxy
variables (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``; `_proxy` for ours).

Neither httptools nor openai is imported until a transport is first used, so
``import plait`` stays fast.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import orjson

from plait.backends._bounded import read_chunks, too_large
from plait.backends._errors import error_from_status
from plait.backends._shapes import preview
from plait.backends._urls import join_path, redact_url, scrub_cause, scrub_text
from plait.backends.openai._sse import DONE, iter_sse_data
from plait.backends.openai._wire import decode_event
from plait.errors import BackendConnectionError, BackendError, BackendTimeout

if TYPE_CHECKING:
    from plait.backends.openai._http import ConnectionPool, Reply

__all__ = ["HttpTransport", "SdkTransport", "Transport"]


def describe_endpoint(base_url: str, model: str) -> str:
    """Returns how errors name an endpoint: URL (credentials masked) and model, never the key."""
    return f"OpenAI-compatible endpoint {redact_url(base_url)} (model {model!r})"


def _timeout_error(where: str, timeout: float | None, exc: BaseException) -> BackendTimeout:
    limit = f"within {timeout:g} s" if timeout is not None else "before the transport timed out"
    return BackendTimeout(
        f"{where} did not answer {limit}; raise the endpoint's timeout if the model is slow"
    )


def _connection_error(where: str, exc: BaseException, url: str) -> BackendConnectionError:
    return BackendConnectionError(
        f"{where}: connection failed or dropped ({_described(exc, url)})",
        # a refused connection, or a proxy that let nothing through, sent nothing
        unsent=isinstance(exc, ConnectionRefusedError) or getattr(exc, "unsent", False),
    )


def _invalid_url(where: str, problem: str) -> BackendError:
    # Not retryable: the same URL fails the same way, and retrying it as a
    # connection error only hid the typo behind four attempts.
    return BackendError(
        f"{where}: invalid request URL ({problem}); expected a base_url like "
        "'https://host[:port]/v1' (http or https, a host name, no spaces)"
    )


def _described(exc: BaseException, url: str) -> str:
    """Returns a foreign exception's type and text, ``url``'s credentials masked."""
    return f"{type(exc).__name__}: {scrub_text(str(exc), url) or 'no detail'}"


def _decode_body(raw: bytes, status: int, where: str) -> Any:
    """Returns the decoded JSON of a successful answer's body."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        shown = preview(raw)
        raise BackendError(
            f"{where} answered HTTP {status} with a body that is not JSON: {shown}",
            status=status,
            body=raw.decode("utf-8", "replace"),
            detail=shown,
        ) from exc


async def _until_done(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Yields the events before ``[DONE]``, then reads the body to its end.

    Reading on after ``[DONE]`` (the server ends the body at once) lets the
    connection go back to the pool instead of being closed half-read.
    """
    done = False
    async for data in events:
        if data == DONE:
            done = True
        elif not done:
            yield data


class _ForeignErrors:
    """A `with` block that raises plait's error in place of a transport library's own.

    Both calls of a transport (``post`` and ``stream``) enter it, so the
    mapping is written once: an exception the transport's `_plait_error`
    recognises leaves the block as that plait error, chained to the original
    with the URL's credentials masked; any other (plait's own errors,
    cancellation, a closed generator) passes through unchanged. A plain class
    rather than a generator-based context manager: it is entered on every call.
    """

    __slots__ = ("_timeout", "_transport", "_where")

    def __init__(self, transport: Transport, where: str, timeout: float | None) -> None:
        self._transport = transport
        self._where = where
        self._timeout = timeout

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not isinstance(exc, Exception):  # no error, or cancellation / generator close
            return
        transport = self._transport
        mapped = transport._plait_error(exc, self._where, self._timeout)
        if mapped is None:
            return
        raise mapped from scrub_cause(exc, transport._error_url)


class Transport:
    """What the backend needs from a transport; both implementations follow it.

    Args:
        max_response_bytes: the largest reply body read (error bodies included).
        max_event_bytes: the most data one event of a stream may hold.
        error_url: the URL whose credentials are masked in chained exceptions.
    """

    def __init__(self, max_response_bytes: int, max_event_bytes: int, error_url: str) -> None:
        self._max_body = max_response_bytes
        self._max_event = max_event_bytes
        self._error_url = error_url

    def _plait_error(
        self, exc: Exception, where: str, timeout: float | None
    ) -> BackendError | None:
        """Returns the plait error for the library's exception ``exc``, or None if it is not one."""
        raise NotImplementedError

    def _foreign_errors(self, where: str, timeout: float | None) -> _ForeignErrors:
        """Returns the block a call runs in, so the library's failures leave it as plait's."""
        return _ForeignErrors(self, where, timeout)

    async def post(self, body: dict[str, Any], timeout: float | None, where: str) -> Any:
        """Sends a non-streamed request; returns the decoded JSON reply."""
        raise NotImplementedError

    def stream(self, body: dict[str, Any], timeout: float | None, where: str) -> AsyncIterator[Any]:
        """Sends a streamed request; yields each decoded chunk until ``[DONE]``."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Closes the connections this transport holds."""
        raise NotImplementedError


class HttpTransport(Transport):
    """Chat completions over plait's own HTTP/1.1 client (`_http`), the default.

    One `ConnectionPool` per endpoint: keep-alive connections, the request
    line and headers built once, replies parsed by httptools, orjson both
    ways. Its CPU per call is about a third of aiohttp's, which this
    transport used before (``benchmarks/scheduler_bench.py``). A redirect is
    not followed: it fails, not retried, naming where it points, so the fix
    (the right ``base_url``) is one edit.

    ``base_url`` must hold no user info (the backend turns it into a header
    first); a query in it (``?api-version=...``) is kept after the path.
    """

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        timeout: float | None,
        max_connections: int | None,
        max_response_bytes: int,
        max_event_bytes: int,
    ) -> None:
        endpoint = join_path(base_url, "/chat/completions")
        super().__init__(max_response_bytes, max_event_bytes, error_url=endpoint)
        self._endpoint = endpoint
        self._headers = dict(headers)
        self._timeout = timeout
        self._max_connections = max_connections
        self._pool: ConnectionPool | None = None

    def _open(self, where: str) -> ConnectionPool:
        pool = self._pool
        if pool is not None:
            return pool
        try:
            # import time: _http loads httptools, only once a call is made
            from plait.backends.openai import _http
        except ImportError as exc:
            raise ImportError(
                f"{where}: the http transport needs httptools, a dependency of plait, and "
                f"importing it failed ({type(exc).__name__}: {exc}); reinstall it with: "
                "pip install --force-reinstall httptools (or set transport='sdk')"
            ) from exc
        try:
            pool = _http.ConnectionPool(self._endpoint, self._headers, self._max_connections)
        except _http.InvalidURL as exc:
            problem = scrub_text(str(exc), self._endpoint)
            raise _invalid_url(where, problem) from scrub_cause(exc, self._endpoint)
        except _http.ProxyError as exc:  # a proxy variable plait cannot use: not retried
            raise BackendError(f"{where}: {exc}") from None
        self._pool = pool
        return pool

    def _plait_error(
        self, exc: Exception, where: str, timeout: float | None
    ) -> BackendError | None:
        if isinstance(exc, TimeoutError):
            return _timeout_error(where, timeout, exc)
        if isinstance(exc, OSError):  # a dropped connection, a failed lookup, TLS
            return _connection_error(where, exc, self._endpoint)
        # import time: `_open` loads _http on a first call
        from plait.backends.openai._http import BodyTooLarge

        if isinstance(exc, BodyTooLarge):
            what = "its declared length" if exc.declared else "read so far"
            return too_large(
                where, f"a reply body ({what})", exc.size, "max_response_bytes", self._max_body
            )
        return None

    def _status_error(self, reply: Reply, where: str) -> BackendError:
        status = reply.status
        if status < 400:
            location = reply.headers.get("location")
            shown = redact_url(location) if location else "no Location given"
            phrase = f" {reply.reason}" if reply.reason else ""
            return BackendError(
                f"{where} answered HTTP {status}{phrase}, a redirect to {shown}; plait "
                "does not follow redirects of its requests: set base_url to the address the "
                "server points to",
                status=status,
                retryable=False,
            )
        return error_from_status(
            status, reply.body, reply.headers, where=where, reason=reply.reason, url=self._endpoint
        )

    async def post(self, body: dict[str, Any], timeout: float | None, where: str) -> Any:
        limit = self._timeout if timeout is None else timeout
        pool = self._pool or self._open(where)
        with self._foreign_errors(where, limit):
            reply = await pool.post(orjson.dumps(body), limit, self._max_body)
        if reply.status >= 300:
            raise self._status_error(reply, where)
        return _decode_body(reply.body, reply.status, where)

    async def stream(
        self, body: dict[str, Any], timeout: float | None, where: str
    ) -> AsyncIterator[Any]:
        limit = self._timeout if timeout is None else timeout
        pool = self._pool or self._open(where)
        with self._foreign_errors(where, limit):
            sent = pool.stream(orjson.dumps(body), limit, self._max_body)
            async with sent as (exchange, deadline):
                if exchange.status < 300:
                    chunks = exchange.iter_body(deadline)
                    events = iter_sse_data(chunks, self._max_event, where)
                    async for data in _until_done(events):
                        yield decode_event(data, where)
                    return
                raw = await exchange.read_body(deadline)
        raise self._status_error(exchange.reply(raw), where)

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


class SdkTransport(Transport):
    """Chat completions through the official ``openai`` SDK, with its retries off.

    The SDK sends the request and reports HTTP failures; the reply is read
    from its raw body (``with_raw_response``) and decoded here, event by event
    for a stream, so the backend parses the very bytes `HttpTransport` would have
    handed it, and a malformed reply fails the same way on both transports
    instead of inside the SDK's models.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        headers: Mapping[str, str],
        timeout: float | None,
        max_response_bytes: int,
        max_event_bytes: int,
    ) -> None:
        super().__init__(max_response_bytes, max_event_bytes, error_url=base_url)
        # The SDK appends the path to base_url as text, so a query there would end
        # up inside the path; it sends default_query with every request instead.
        self._base_url, _, query = base_url.partition("#")[0].partition("?")
        self._query = dict(parse_qsl(query, keep_blank_values=True))
        self._api_key = api_key
        # The SDK sets its own Content-Type, and Authorization from api_key; without
        # a key, an Authorization the backend built (Basic, from user info) is kept.
        dropped = ("authorization", "content-type") if api_key else ("content-type",)
        self._headers = {k: v for k, v in headers.items() if k.lower() not in dropped}
        self._timeout = timeout
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._errors: _SdkErrors | None = None

    def _open(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is not None and self._loop is loop:
            return self._client
        try:
            import openai  # optional extra (plait[openai])
        except ImportError as exc:
            raise ImportError(
                "OpenAICompatBackend(transport='sdk') needs the openai package; "
                "install it with: pip install 'plait[openai]' (or use the default transport='http')"
            ) from exc
        self._client = openai.AsyncOpenAI(
            # A local server needs no key, but the SDK refuses to start without one.
            api_key=self._api_key or "no-key",
            base_url=self._base_url,
            default_query=self._query or None,
            timeout=self._timeout,
            max_retries=0,  # the resource layer is the only retry owner (SPEC §4.4)
            default_headers=self._headers,
        )
        self._loop = loop
        self._errors = _SdkErrors(openai)
        return self._client

    def _plait_error(
        self, exc: Exception, where: str, timeout: float | None
    ) -> BackendError | None:
        errors = self._errors
        return None if errors is None else errors.map(exc, where, timeout, self._error_url)

    async def post(self, body: dict[str, Any], timeout: float | None, where: str) -> Any:
        client = self._open()
        extra = {} if timeout is None else {"timeout": timeout}
        limit = self._timeout if timeout is None else timeout
        streamed = client.chat.completions.with_streaming_response
        with self._foreign_errors(where, limit):
            # Streamed, so that the body is read here, within the cap.
            async with streamed.create(**body, **extra) as response:
                raw = await read_chunks(response.iter_bytes(), self._max_body, where)
        return _decode_body(raw, response.status_code, where)

    async def stream(
        self, body: dict[str, Any], timeout: float | None, where: str
    ) -> AsyncIterator[Any]:
        client = self._open()
        extra = {} if timeout is None else {"timeout": timeout}
        limit = self._timeout if timeout is None else timeout
        with self._foreign_errors(where, limit):
            response = await client.chat.completions.with_raw_response.create(**body, **extra)
            http = response.http_response
            try:
                events = iter_sse_data(http.aiter_bytes(), self._max_event, where)
                async for data in _until_done(events):
                    yield decode_event(data, where)
            finally:
                await http.aclose()

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.close()


class _SdkErrors:
    """Sorts the SDK's exceptions (and its HTTP library's) into plait's.

    openai 1.x sits on httpx and later versions on httpx2; errors raised while
    a stream is being read come straight from that library, unwrapped, so
    both are recognised when loaded.
    """

    def __init__(self, openai: Any) -> None:
        self._openai = openai
        libraries = [sys.modules[name] for name in ("httpx", "httpx2") if name in sys.modules]
        self._timeouts: tuple[type[BaseException], ...] = (
            openai.APITimeoutError,
            TimeoutError,
            *(lib.TimeoutException for lib in libraries),
        )
        self._connections: tuple[type[BaseException], ...] = (
            openai.APIConnectionError,
            *(lib.TransportError for lib in libraries),
        )

    def map(
        self, exc: Exception, where: str, timeout: float | None, url: str
    ) -> BackendError | None:
        """Returns the plait error for ``exc``, or None when ``exc`` is not the SDK's.

        ``url`` is the base URL: its credentials are kept out of copied texts.
        """
        openai = self._openai
        if isinstance(exc, openai.APIStatusError):
            response = exc.response
            try:
                raw: Any = response.content
            except Exception:  # a streamed response whose body was never read
                raw = orjson.dumps(exc.body) if exc.body is not None else None
            return error_from_status(
                exc.status_code,
                raw,
                response.headers,
                where=where,
                reason=getattr(response, "reason_phrase", None),
                url=url,
            )
        if isinstance(exc, self._timeouts):
            return _timeout_error(where, timeout, exc)
        if isinstance(exc, self._connections):
            return _connection_error(where, exc, url)
        if isinstance(exc, openai.APIError):  # an error event inside a stream
            detail = scrub_text(str(exc), url)
            return BackendError(f"{where}: {detail}", retryable=True, body=exc.body, detail=detail)
        return None
