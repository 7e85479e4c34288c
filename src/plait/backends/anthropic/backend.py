"""The Anthropic backend: Claude models through the official ``anthropic`` SDK.

The SDK is imported on first use, never by ``import plait``. It runs with
``max_retries=0``: the resource layer owns retries, and sees every failure as
a `BackendError` with its status, ``retryable`` and ``retry_after`` (from
``retry-after-ms`` or ``retry-after``). Request and reply translation lives in
`plait.backends.anthropic._wire`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson

from plait.backends._errors import error_from_status
from plait.backends._shapes import MalformedReply, preview
from plait.backends._urls import redact_url, scrub_cause, scrub_text
from plait.backends.anthropic._wire import (
    StreamAssembler,
    WireError,
    WirePlan,
    build_body,
    read_message,
)
from plait.backends.anthropic.spec import SPEC
from plait.backends.base import Backend
from plait.backends.types import Request, Response, StreamChunk
from plait.errors import (
    BackendConnectionError,
    BackendError,
    BackendTimeout,
    ConfigError,
    RateLimitError,
)

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic

__all__ = ["AnthropicBackend"]

# Errors that arrive as an SSE ``error`` event inside a 200 stream carry only a type;
# these are the statuses the same errors have as HTTP answers (Anthropic's error docs).
_STATUS_OF_ERROR_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


class AnthropicBackend(Backend):
    """Talks to Anthropic's Messages API (or a server that speaks it).

    Example::

        backend = AnthropicBackend("claude-sonnet-4-5")       # key from ANTHROPIC_API_KEY
        reply = await backend.complete(Request(messages=(Message("user", "Hi"),)))

    Structured output (``Request.response_schema``) forces a tool whose input
    schema is the response schema; the reply's ``text`` is that tool's input
    as JSON, and the tool does not appear in ``tool_calls``.

    Args:
        model: the model id used when a request names none.
        api_key: the key; None reads the variable named by ``api_key_env``.
        api_key_env: environment variable holding the key.
        base_url: another endpoint (a proxy, or a test server); None is Anthropic's.
        timeout: seconds per call, unless the request sets its own.
        max_tokens_default: ``max_tokens`` for requests that set none (the API requires it).

    Raises:
        ConfigError: no key was given and the variable is unset or empty.
    """

    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: str = "ANTHROPIC_API_KEY",
        base_url: str | None = None,
        timeout: float = 60.0,
        max_tokens_default: int = 1024,
    ) -> None:
        missing = self.missing_credential(api_key=api_key, api_key_env=api_key_env)
        if missing is not None:
            raise ConfigError(f"AnthropicBackend(model={model!r}) {missing}")
        key = api_key or os.environ[api_key_env]
        self.model = model
        self.base_url = base_url
        self.timeout = timeout
        self.max_tokens_default = max_tokens_default
        self._api_key = key
        self._client: AsyncAnthropic | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def missing_credential(cls, **settings: Any) -> str | None:
        """Returns the API key the Messages API needs and was not given, or None.

        Every endpoint needs one, a proxy's too (the SDK sends it on every call);
        see `Backend.missing_credential`.
        """
        return SPEC.missing_credential(**settings)

    def __repr__(self) -> str:
        shown = None if self.base_url is None else redact_url(self.base_url)
        return f"AnthropicBackend(model={self.model!r}, base_url={shown!r})"

    async def complete(self, request: Request) -> Response:
        """Sends one Messages API call and returns the whole reply.

        Raises:
            RateLimitError: HTTP 429, with ``retry_after`` when the server sent one.
            BackendTimeout: no answer within the timeout.
            BackendConnectionError: the connection failed.
            BackendError: any other failure; ``retryable`` for 5xx and 529. Also a
                reply that is not JSON, or not a message (it names the field and
                shows the start of the reply); not retryable.
        """
        body, plan = self._body(request)
        client = self._get_client()
        sdk = _sdk()
        where = self._where(body["model"])
        try:
            message = await client.messages.create(**body, timeout=self._timeout(request))
        except sdk.AnthropicError as exc:
            raise self._map_error(exc, body["model"], request) from scrub_cause(exc, self.base_url)
        except _GARBLED as exc:
            raise BackendError(
                f"{where} answered HTTP 200 with a body that is not JSON ({_garbled(exc)})",
                status=200,
            ) from exc
        try:
            return read_message(message, plan)
        except MalformedReply as exc:
            raise BackendError(
                f"{where} answered HTTP 200 with a malformed reply ({exc}): {preview(message)}",
                status=200,
            ) from None

    async def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        """Streams one call; text as it arrives, tool calls whole, usage on the last chunk.

        Raises:
            BackendError: as `complete`; an event that is not JSON is retryable
                (garbled bytes come from a damaged transfer), one of the wrong
                shape is not.
        """
        body, plan = self._body(request)
        client = self._get_client()
        sdk = _sdk()
        where = self._where(body["model"])
        assembler = StreamAssembler(plan)
        try:
            events = await client.messages.create(
                **body, stream=True, timeout=self._timeout(request)
            )
            try:
                async for event in events:
                    chunk = _feed(assembler, event, where)
                    if chunk is not None:
                        yield chunk
            finally:
                await events.close()
        except sdk.AnthropicError as exc:
            raise self._map_error(exc, body["model"], request) from scrub_cause(exc, self.base_url)
        except _GARBLED as exc:
            raise BackendError(
                f"{where} streamed an event that is not UTF-8 JSON ({_garbled(exc)})",
                status=200,
                retryable=True,
            ) from exc
        yield assembler.finish()

    async def aclose(self) -> None:
        """Closes the SDK client's connections."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def _body(self, request: Request) -> tuple[dict[str, Any], WirePlan]:
        try:
            return build_body(request, model=self.model, max_tokens_default=self.max_tokens_default)
        except WireError as exc:
            raise BackendError(f"{self!r}: {exc}") from exc

    def _timeout(self, request: Request) -> float:
        return request.timeout if request.timeout is not None else self.timeout

    def _get_client(self) -> AsyncAnthropic:
        """Returns the SDK client, made anew on another event loop.

        Its connection pool belongs to the loop it first ran on, and blocking
        callers (``run_sync``) start a fresh loop per call.
        """
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = _sdk().AsyncAnthropic(
                api_key=self._api_key,
                base_url=self.base_url,
                timeout=self.timeout,
                max_retries=0,
            )
            self._client_loop = loop
        return self._client

    def _where(self, model: str) -> str:
        """Returns how errors name this endpoint: its URL (credentials masked) and the model."""
        shown = "api.anthropic.com" if self.base_url is None else redact_url(self.base_url)
        return f"Anthropic endpoint {shown} (model {model!r})"

    def _map_error(self, exc: Exception, model: str, request: Request) -> BackendError:
        """Wraps an SDK exception in plait's error family (the caller chains it).

        The URL in the message has its credentials masked, and so has the SDK's
        own text wherever it is copied in.
        """
        sdk = _sdk()
        url = self.base_url
        where = self._where(model)
        detail = scrub_text(str(exc), url)
        if isinstance(exc, sdk.APITimeoutError):
            return BackendTimeout(f"{where} did not answer within {self._timeout(request)} s")
        if isinstance(exc, sdk.APIConnectionError):
            return BackendConnectionError(f"{where}: connection failed ({detail})")
        if not isinstance(exc, sdk.APIStatusError):
            return BackendError(f"{where}: {type(exc).__name__}: {detail}")
        status = exc.status_code
        if status < 400:  # an ``error`` event inside a streamed 200 answer
            status = _STATUS_OF_ERROR_TYPE.get(str(getattr(exc, "type", None)), 500)
        headers = exc.response.headers
        error = error_from_status(status, _body_text(exc.body), headers, where=where, url=url)
        # Anthropic tells clients whether a retry can help; its own SDK obeys this header.
        advice = headers.get("x-should-retry")
        if advice in ("true", "false") and not isinstance(error, RateLimitError):
            error.retryable = advice == "true"
        return error


# The SDK decodes reply bodies and stream events with the json module and lets
# its errors through: ValueError for text that is not JSON, not UTF-8, or holds a
# number of more digits than Python converts; RecursionError for deep nesting.
# Nothing else in the call raises them: the request body is built and checked first.
_GARBLED = (ValueError, RecursionError)


def _garbled(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    return f"{type(exc).__name__}: {exc}"


def _body_text(body: Any) -> str | bytes | None:
    """Returns the error body the SDK decoded as the text `error_from_status` reads."""
    if body is None or isinstance(body, str | bytes):
        return body
    try:
        return orjson.dumps(body)
    except TypeError:  # orjson writes 255 levels at most; the SDK's json read more
        return str(body)


def _feed(assembler: StreamAssembler, event: Any, where: str) -> StreamChunk | None:
    """Feeds one event to ``assembler``; an event of the wrong shape becomes a `BackendError`."""
    try:
        return assembler.feed(event)
    except MalformedReply as exc:
        raise BackendError(
            f"{where} streamed a malformed event ({exc}): {preview(event)}", status=200
        ) from None


def _sdk() -> Any:
    try:
        import anthropic  # optional extra (plait[anthropic])
    except ImportError as exc:
        raise ConfigError(
            "AnthropicBackend needs the anthropic SDK; install it with "
            "`pip install 'plait[anthropic]'`"
        ) from exc
    return anthropic
