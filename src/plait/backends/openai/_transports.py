"""The two ways `OpenAICompatBackend` reaches a server: raw aiohttp, or the official SDK.

Both take a chat-completions body (a dict), send it, and hand back the
decoded JSON of the reply's own bytes: one value for a completion, an async
iterator of values for a stream (whether they have the right shape is for
`_wire` to check). Both read within the endpoint's caps
(`_bounded`: ``max_response_bytes`` per body, ``max_event_bytes`` per event).
Both map every failure onto plait's errors the same way (`_errors.py`): each
call runs inside one `with` block (`_ForeignErrors`) that puts plait's error in
place of the library's own, so a failure reads the same whether it stops a
whole reply or a stream. Neither retries (the resource layer owns retries;
SPEC §4.4).

aiohttp is the default because it is cheap: one ``ClientSession`` and one
``TCPConnector`` per endpoint, orjson for both directions, no cookie jar, a
pre-parsed URL and cached timeout objects, so a call costs about what aiohttp
itself costs. The SDK costs several times more CPU per call (SPEC §4.4); it
is here for users who need its authentication or proxy features.

Neither aiohttp nor openai is imported until a transport is first used, so
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

from plait.backends._bounded import read_body, read_chunks, too_large
from plait.backends._errors import error_from_status
from plait.backends._imports import import_in_background, is_imported
from plait.backends._shapes import preview
from plait.backends._urls import join_path, redact_url, scrub_cause, scrub_text
from plait.backends.openai._first_requests import FirstRequests
from plait.backends.openai._sse import DONE, iter_sse_data
from plait.backends.openai._wire import decode_event
from plait.errors import BackendConnectionError, BackendError, BackendTimeout

if TYPE_CHECKING:
    import aiohttp

__all__ = ["AiohttpTransport", "SdkTransport", "Transport"]

_NOT_SENT: Any = object()
"""What `AiohttpTransport._before_aiohttp` returns when aiohttp is to send the request."""


def describe_endpoint(base_url: str, model: str) -> str:
    """Returns how errors name an endpoint: URL (credentials masked) and model, never the key."""
    return f"OpenAI-compatible endpoint {redact_url(base_url)} (model {model!r})"


def _timeout_error(where: str, timeout: float | None, exc: BaseException) -> BackendTimeout:
    limit = f"within {timeout:g} s" if timeout is not None else "before the transport timed out"
    return BackendTimeout(
        f"{where} did not answer {limit}; raise the endpoint's timeout if the model is slow"
    )


def _connection_error(where: str, exc: BaseException, url: str) -> BackendConnectionError:
    return BackendConnectionError(f"{where}: connection failed or dropped ({_described(exc, url)})")


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


class AiohttpTransport(Transport):
    """Chat completions over one lazily created aiohttp session.

    The session belongs to the event loop that first used it. When a later
    call runs in another loop (``run_sync`` creates one per call), a fresh
    session is made for it; the old one cannot be closed from a foreign loop
    and is left to the garbage collector.

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
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._url: Any = None
        self._timeouts: dict[float | None, aiohttp.ClientTimeout] = {}
        self._client_error: type[BaseException] = Exception
        self._invalid_url_errors: tuple[type[BaseException], ...] = ()
        self._first_requests: FirstRequests | None = None

    def _open(self, where: str) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._session
        if session is not None and self._loop is loop and not session.closed:
            return session
        try:
            import aiohttp
        except ImportError as exc:
            raise ImportError(
                f"{where}: the aiohttp transport needs aiohttp, a dependency of plait, and "
                f"importing it failed ({type(exc).__name__}: {exc}); reinstall it with: "
                "pip install --force-reinstall aiohttp (or set transport='sdk')"
            ) from exc

        self._url = self._parse_url(where)
        # limit=0: no connection cap here. The resource layer's max_concurrent
        # is the one concurrency limit; a second, hidden cap of 100 (aiohttp's
        # default) would queue calls that the scheduler believes are running.
        connector = aiohttp.TCPConnector(limit=self._max_connections or 0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._loop = loop
        self._client_error = aiohttp.ClientError
        # A redirect to ftp:// raises NonHttpUrlClientError (aiohttp >= 3.10),
        # which is not an InvalidURL.
        non_http = getattr(aiohttp, "NonHttpUrlClientError", aiohttp.InvalidURL)
        self._invalid_url_errors = (aiohttp.InvalidURL, non_http)
        self._timeouts = {}
        return self._session

    def _parse_url(self, where: str) -> Any:
        """Returns the parsed endpoint URL; a malformed one fails before any connection."""
        import yarl

        try:
            url = yarl.URL(self._endpoint)
        except ValueError as exc:
            problem = _described(exc, self._endpoint)
            raise _invalid_url(where, problem) from scrub_cause(exc, self._endpoint)
        if url.scheme not in ("http", "https"):
            raise _invalid_url(where, f"the scheme is {url.scheme!r}, not http or https")
        if not url.raw_host:
            raise _invalid_url(where, "it has no host name")
        try:
            # The resolver encodes the host this way, and raises a bare
            # UnicodeError (a ValueError aiohttp does not wrap) for "a..b".
            url.raw_host.encode("idna")
        except UnicodeError as exc:
            problem = f"host {url.raw_host!r}: {_described(exc, self._endpoint)}"
            raise _invalid_url(where, problem) from scrub_cause(exc, self._endpoint)
        return url

    def _timeout_for(self, timeout: float | None) -> aiohttp.ClientTimeout:
        cached = self._timeouts.get(timeout)
        if cached is None:
            import aiohttp

            cached = self._timeouts[timeout] = aiohttp.ClientTimeout(total=timeout)
        return cached

    def _plait_error(
        self, exc: Exception, where: str, timeout: float | None
    ) -> BackendError | None:
        if isinstance(exc, TimeoutError):  # first: aiohttp's timeouts are ClientErrors too
            return _timeout_error(where, timeout, exc)
        if not isinstance(exc, self._client_error):
            return None
        if isinstance(exc, self._invalid_url_errors):
            return _invalid_url(where, _described(exc, self._endpoint))
        return _connection_error(where, exc, self._endpoint)

    def _send(
        self, session: aiohttp.ClientSession, body: dict[str, Any], limit: float | None
    ) -> Any:
        return session.post(self._url, data=orjson.dumps(body), timeout=self._timeout_for(limit))

    def _status_error(
        self, response: aiohttp.ClientResponse, raw: bytes, where: str
    ) -> BackendError:
        return error_from_status(
            response.status,
            raw,
            response.headers,
            where=where,
            reason=response.reason,
            url=self._endpoint,
        )

    async def post(self, body: dict[str, Any], timeout: float | None, where: str) -> Any:
        limit = self._timeout if timeout is None else timeout
        if self._session is None and not is_imported("aiohttp"):
            reply = await self._before_aiohttp(body, limit, where)
            if reply is not _NOT_SENT:
                return reply
        session = self._open(where)
        with self._foreign_errors(where, limit):
            async with self._send(session, body, limit) as response:
                raw = await read_body(response, self._max_body, where)
                if response.status >= 400:
                    raise self._status_error(response, raw, where)
        return _decode_body(raw, response.status, where)

    async def _before_aiohttp(self, body: dict[str, Any], limit: float | None, where: str) -> Any:
        """Sends a request before aiohttp is imported (`_first_requests`), or waits for aiohttp.

        Returns the decoded reply, or `_NOT_SENT` when the request is for
        aiohttp to send: aiohttp is imported by then, or its import failed
        (`_open` then raises why), or the server redirected it.
        """
        importing = import_in_background(["aiohttp"])
        if importing is None or importing.done or "aiohttp" not in importing.modules:
            return _NOT_SENT  # imported meanwhile, failed (said by _open), or not ours to wait for
        first = self._first_requests
        if first is None:
            first = self._first_requests = FirstRequests(
                self._endpoint, self._headers, self._max_body
            )
        if not first.can_send():
            await importing.wait()
            return _NOT_SENT
        decoded = await self._post_first(first, body, limit, where)
        if decoded is _NOT_SENT:
            await importing.wait()
        return decoded

    async def _post_first(
        self, first: FirstRequests, body: dict[str, Any], limit: float | None, where: str
    ) -> Any:
        """Sends a request with ``http.client`` and reads its reply as `post` reads aiohttp's.

        The same errors, caps and decoding; a redirect returns `_NOT_SENT`
        (aiohttp follows it).
        """
        try:
            reply = await first.post(orjson.dumps(body), limit)
        except TimeoutError as exc:
            raise _timeout_error(where, limit, exc) from scrub_cause(exc, self._endpoint)
        except OSError as exc:
            cause = scrub_cause(exc, self._endpoint)
            raise _connection_error(where, exc, self._endpoint) from cause
        if 300 <= reply.status < 400:  # aiohttp follows redirects: resend it there
            return _NOT_SENT
        if reply.declared_length is not None and reply.declared_length > self._max_body:
            raise too_large(
                where,
                "a reply body (its declared length)",
                reply.declared_length,
                "max_response_bytes",
                self._max_body,
            )
        if len(reply.body) > self._max_body:
            raise too_large(
                where,
                "a reply body (read so far)",
                len(reply.body),
                "max_response_bytes",
                self._max_body,
            )
        if reply.status >= 400:
            raise error_from_status(
                reply.status,
                reply.body,
                reply.headers,
                where=where,
                reason=reply.reason,
                url=self._endpoint,
            )
        return _decode_body(reply.body, reply.status, where)

    async def stream(
        self, body: dict[str, Any], timeout: float | None, where: str
    ) -> AsyncIterator[Any]:
        limit = self._timeout if timeout is None else timeout
        if self._session is None and not is_imported("aiohttp"):
            importing = import_in_background(["aiohttp"])
            if importing is not None and "aiohttp" in importing.modules:
                await importing.wait()  # not on the loop's thread: an import would block it
        session = self._open(where)
        with self._foreign_errors(where, limit):
            async with self._send(session, body, limit) as response:
                if response.status >= 400:
                    raw = await read_body(response, self._max_body, where)
                    raise self._status_error(response, raw, where)
                events = iter_sse_data(response.content.iter_any(), self._max_event, where)
                async for data in _until_done(events):
                    yield decode_event(data, where)

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed and self._loop is asyncio.get_running_loop():
            await session.close()


class SdkTransport(Transport):
    """Chat completions through the official ``openai`` SDK, with its retries off.

    The SDK sends the request and reports HTTP failures; the reply is read
    from its raw body (``with_raw_response``) and decoded here, event by event
    for a stream, so the backend parses the very bytes aiohttp would have
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
            import openai
        except ImportError as exc:
            raise ImportError(
                "OpenAICompatBackend(transport='sdk') needs the openai package; "
                "install it with: pip install 'plait[openai]' (or use transport='aiohttp')"
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
