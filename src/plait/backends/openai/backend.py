"""`OpenAICompatBackend`: any server that speaks OpenAI's chat-completions protocol.

OpenAI itself, Azure OpenAI, vLLM, Ollama, llama.cpp's server, OpenRouter …
all take the same ``POST {base_url}/chat/completions``, with small
differences of dialect (see `_wire`). This backend turns a neutral
`Request` into that body, sends it over a transport, and turns the reply
back into a `Response` or a stream of `StreamChunk`.

Structured output is where servers differ most, so the dialect is chosen per
endpoint (SPEC §8):

* ``dialect="openai"`` or a base URL on ``api.openai.com`` / ``*.azure.com``:
  ``response_format`` of type ``json_schema``, ``max_completion_tokens``.
* ``dialect="llama_cpp"``: ``{"type": "json_object", "schema": ...}``,
  ``max_tokens``.
* ``dialect=None`` for any other server: ``json_schema`` and ``max_tokens``
  first. If the server rejects that with an error whose message mentions
  ``response_format``, the same call is sent once more as ``llama_cpp``, and
  the endpoint keeps ``llama_cpp`` from then on. Once a ``json_schema``
  request has succeeded the choice is settled and never revisited.

  The rejection may come as 400 or 422, or, from llama_cpp.server 0.3.36, as
  a 500 whose message is the pydantic validation error ("'loc': ('body',
  'response_format', 'type') ... Input should be 'text' or 'json_object'");
  verified against that server by tests/backends/test_openai_llama_server.py.

The backend never retries a failure: it raises a `BackendError` carrying the
status, ``retryable`` and ``retry_after``, and the resource layer decides.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

from plait.backends._bounded import DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_RESPONSE_BYTES
from plait.backends._urls import basic_authorization, redact_url, split_credentials
from plait.backends.base import Backend
from plait.backends.openai._transports import (
    HttpTransport,
    SdkTransport,
    Transport,
    describe_endpoint,
)
from plait.backends.openai._wire import (
    GENERIC,
    LLAMA_CPP,
    OPENAI,
    StreamAssembler,
    WireDialect,
    build_body,
    parse_completion,
)
from plait.backends.openai.spec import (
    CREDENTIAL_HEADERS,
    DEFAULT_KEY_ENV,
    DEFAULT_URL,
    SPEC,
    is_openai_host,
    missing_key,
)
from plait.backends.types import Request, Response, StreamChunk
from plait.errors import BackendConnectionError, BackendError, ConfigError

__all__ = ["OpenAICompatBackend"]

logger = logging.getLogger("plait.backends")

Dialect = Literal["openai", "llama_cpp"]
TransportName = Literal["http", "sdk"]

_DIALECTS: dict[str, WireDialect] = {"openai": OPENAI, "llama_cpp": LLAMA_CPP}
_TRANSPORTS = ("http", "sdk")
_OLD_TRANSPORTS: dict[str, str] = {"aiohttp": "http"}
"""Transports renamed: a config written for the old name is told the new one."""
# How servers refuse a response_format they do not know: 400 (OpenAI-style),
# 422 (FastAPI validation), 500 (llama_cpp.server wraps its validation error).
_REJECTION_STATUSES = frozenset({400, 422, 500})


class OpenAICompatBackend(Backend):
    """Calls one OpenAI-compatible chat-completions endpoint.

    Example::

        backend = OpenAICompatBackend("gpt-4o-mini")          # OPENAI_API_KEY from the env
        local = OpenAICompatBackend("smollm2", base_url="http://127.0.0.1:8000/v1")
        reply = await local.complete(Request(messages=(Message("user", "Hi"),)))
        print(reply.text, reply.usage.output_tokens)
        await local.aclose()

    One backend holds one connection pool, so create one per endpoint and
    share it between concurrent calls; close it with `aclose`.

    Args:
        model: the model name sent with every request (a `Request.model`
            overrides it per call).
        base_url: the API root, up to and including ``/v1``. A query in it
            (``?api-version=...``) is kept after the path; ``user:password@``
            in it is sent as HTTP Basic authentication and then wins over the
            key of ``api_key_env``. Reprs and errors show it with credentials
            masked.
        api_key: the key; when None it is read from ``api_key_env``. A server
            that needs no key (llama.cpp, Ollama) gets no Authorization header.
        api_key_env: the environment variable to read the key from.
        timeout: seconds for a whole call (a `Request.timeout` overrides it);
            None waits forever.
        transport: ``"http"`` (plait's own lean HTTP/1.1 client, the default)
            or ``"sdk"`` (the official ``openai`` package, installed with
            ``plait[openai]``, for its proxy and authentication features).
        headers: extra HTTP headers for every request (e.g. Azure's
            ``api-key``, OpenRouter's ``HTTP-Referer``).
        max_connections: cap on open connections (``http`` transport); None
            leaves concurrency entirely to the resource layer's limits.
        dialect: ``"openai"``, ``"llama_cpp"`` or None to choose from the URL
            and learn from the server (see the module docstring).
        max_response_bytes: the largest reply body read (64 MiB); a larger
            one is refused with a `BackendError` once that much has come.
        max_event_bytes: the most data one event of a stream may hold (16 MiB).

    Raises:
        ConfigError: an unknown ``transport`` or ``dialect``, an empty model,
            a ``user:password@`` in ``base_url`` together with ``api_key`` or
            an ``Authorization`` header (a request carries one of them), or
            OpenAI's or Azure's host with no key at all (`missing_credential`).
    """

    provider = "openai"

    def __init__(
        self,
        model: str,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        api_key_env: str | None = DEFAULT_KEY_ENV,
        timeout: float | None = 60.0,
        transport: TransportName = "http",
        headers: Mapping[str, str] | None = None,
        max_connections: int | None = None,
        dialect: Dialect | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        if not model:
            raise ConfigError("OpenAICompatBackend needs a model name; got an empty one")
        if transport not in _TRANSPORTS:
            new_name = _OLD_TRANSPORTS.get(transport)
            renamed = f" ({transport!r} is now {new_name!r})" if new_name else ""
            raise ConfigError(
                f"OpenAICompatBackend: unknown transport {transport!r}{renamed}; "
                "use 'http' or 'sdk'"
            )
        if dialect is not None and dialect not in _DIALECTS:
            raise ConfigError(
                f"OpenAICompatBackend: unknown dialect {dialect!r}; "
                "use 'openai', 'llama_cpp' or None (detect)"
            )
        for name, value in (headers or {}).items():
            if not name or ":" in name or any(c in name + value for c in "\r\n\0"):
                raise ConfigError(
                    f"OpenAICompatBackend: header {name!r} has a malformed name or a line "
                    "break in its value; an HTTP header is one line 'Name: value'"
                )
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.transport_name: TransportName = transport
        url, url_login = split_credentials(self.base_url)
        credential_headers = {name.lower() for name in headers or {}} & CREDENTIAL_HEADERS
        if url_login is not None and (api_key is not None or "authorization" in credential_headers):
            raise ConfigError(
                f"OpenAICompatBackend({redact_url(self.base_url)!r}): base_url holds "
                "user:password@ and an api_key or Authorization header is given too; a request "
                "carries one Authorization, so remove one of them"
            )
        missing = missing_key(self.base_url, api_key, api_key_env, headers)
        if missing is not None:
            raise ConfigError(f"{describe_endpoint(self.base_url, model)} {missing}")
        # Credentials written into this endpoint's URL win over the key of a
        # variable that every endpoint shares (api_key_env).
        key = api_key or None
        if key is None and url_login is None:
            key = os.environ.get(api_key_env or "") or None
        if dialect is not None:
            self._wire, self._dialect_settled = _DIALECTS[dialect], True
        elif is_openai_host(self.base_url):
            self._wire, self._dialect_settled = OPENAI, True
        else:
            self._wire, self._dialect_settled = GENERIC, False
        wire_headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if key:
            wire_headers["Authorization"] = f"Bearer {key}"
        elif url_login is not None:
            wire_headers["Authorization"] = basic_authorization(*url_login)
        wire_headers.update(headers or {})
        self._transport: Transport
        if transport == "http":
            self._transport = HttpTransport(
                url, wire_headers, timeout, max_connections, max_response_bytes, max_event_bytes
            )
        else:
            self._transport = SdkTransport(
                url, key, wire_headers, timeout, max_response_bytes, max_event_bytes
            )

    @property
    def dialect(self) -> str:
        """The dialect requests are sent in now: ``openai``, ``generic`` or ``llama_cpp``."""
        return self._wire.name

    def __repr__(self) -> str:
        return (
            f"OpenAICompatBackend(model={self.model!r}, base_url={redact_url(self.base_url)!r}, "
            f"transport={self.transport_name!r}, dialect={self.dialect!r})"
        )

    @classmethod
    def missing_credential(cls, **settings: Any) -> str | None:
        """Returns the API key OpenAI's or Azure's host needs and was not given, or None.

        Any other ``base_url`` (a server of your own) needs none here; see
        `Backend.missing_credential`.
        """
        return SPEC.missing_credential(**settings)

    async def complete(self, request: Request) -> Response:
        """Makes one chat-completions call and returns the whole reply.

        Raises:
            RateLimitError: HTTP 429, with ``retry_after`` when the server sent one.
            BackendTimeout: no full answer within the timeout.
            BackendConnectionError: the connection was refused, reset or dropped.
            BackendError: any other failure; ``retryable`` for 408 and 5xx.
        """
        wire = self._wire
        where = describe_endpoint(self.base_url, request.model or self.model)
        body = build_body(request, self.model, wire, stream=False)
        try:
            data = await self._transport.post(body, request.timeout, where)
        except BackendError as exc:
            fallback = self._fallback_dialect(request, wire, exc)
            if fallback is None:
                raise
            body = build_body(request, self.model, fallback, stream=False)
            data = await self._transport.post(body, request.timeout, where)
        else:
            self._settle(request, wire)
        return parse_completion(data, where)

    async def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        """Makes one streamed call; yields text as it arrives, then one final chunk.

        The final chunk carries the whole tool calls (fragments are joined
        here), the finish reason, and usage when the server reports it.
        Failures raise as in `complete`; a stream that ends before the
        server said why it stopped raises `BackendConnectionError`.
        """
        wire = self._wire
        where = describe_endpoint(self.base_url, request.model or self.model)
        started = False
        try:
            async for chunk in self._stream_once(request, wire, where):
                started = True
                yield chunk
            return
        except BackendError as exc:
            fallback = None if started else self._fallback_dialect(request, wire, exc)
            if fallback is None:
                raise
        async for chunk in self._stream_once(request, fallback, where):
            yield chunk

    async def _stream_once(
        self, request: Request, wire: WireDialect, where: str
    ) -> AsyncIterator[StreamChunk]:
        body = build_body(request, self.model, wire, stream=True)
        assembler = StreamAssembler()
        settled = False
        async for raw in self._transport.stream(body, request.timeout, where):
            if not settled:  # the server accepted the request and is answering
                self._settle(request, wire)
                settled = True
            text = assembler.feed(raw, where)
            if text:
                yield StreamChunk(text=text)
        if not assembler.has_finished:
            raise BackendConnectionError(
                f"{where}: the stream ended before the server sent a finish reason"
            )
        yield assembler.final_chunk()

    async def aclose(self) -> None:
        """Closes the connection pool; a later call opens a new one."""
        await self._transport.aclose()

    def _settle(self, request: Request, wire: WireDialect) -> None:
        """Records that the server accepted ``wire``'s structured-output form."""
        if not self._dialect_settled and request.response_schema is not None and wire.json_schema:
            self._dialect_settled = True

    def _fallback_dialect(
        self, request: Request, wire: WireDialect, exc: BackendError
    ) -> WireDialect | None:
        """Returns the dialect to retry a rejected structured-output call in, or None.

        Only an endpoint whose dialect was not given or confirmed falls back,
        only from ``json_schema``, and only on a 400, 422 or 500 whose message
        names ``response_format``: any other failure is the caller's to see.
        Override this to teach the backend another server's dialect.
        """
        if (
            request.response_schema is None
            or not wire.json_schema
            or exc.status not in _REJECTION_STATUSES
            or "response_format" not in f"{exc} {exc.body!r}"
        ):
            return None
        if self._dialect_settled:
            # A call that was in flight while another one learned the dialect
            # retries in what was learned; a settled json_schema endpoint does not.
            return None if self._wire.json_schema else self._wire
        logger.info(
            "%s rejected response_format type json_schema; using llama_cpp's "
            "json_object+schema for this endpoint from now on",
            redact_url(self.base_url),
        )
        self._wire, self._dialect_settled = LLAMA_CPP, True
        return LLAMA_CPP
