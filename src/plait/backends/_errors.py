"""Maps provider HTTP failures onto plait's `BackendError` family.

Every HTTP-speaking backend (and every transport of one backend) funnels its
failures through here, so a 429 from plait's HTTP client and a 429 from the official SDK
become the same `RateLimitError` with the same ``retry_after``. The resource
layer decides whether to retry from ``retryable`` and ``retry_after`` alone;
it never looks at provider exception types.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import orjson

from plait.backends._urls import scrub_text
from plait.errors import BackendError, RateLimitError

__all__ = ["decode_error_body", "error_from_status", "is_retryable_status", "parse_retry_after"]

# 408 (the server gave up waiting for us) and 5xx are transient; 429 is
# transient by definition. Everything else in 4xx is a bug in the request or
# the credentials, and retrying it only burns quota.
_RETRYABLE_4XX = frozenset({408, 429})

_MAX_MESSAGE_CHARS = 500

# The fix for the statuses whose cause is almost always the caller's setup.
_HINTS = {
    401: "check the API key (api_key= or the variable named by api_key_env)",
    403: "the key is valid but may not use this model or endpoint",
    404: "check base_url (it usually ends in /v1) and the model name",
}


def is_retryable_status(status: int) -> bool:
    """Returns whether a failure with this HTTP status may succeed if tried again."""
    return status in _RETRYABLE_4XX or status >= 500


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Returns the seconds a provider asked us to wait, or None when it did not say.

    Understands ``retry-after-ms`` (OpenAI's millisecond header, preferred
    because it is more precise), and ``Retry-After`` as delta-seconds or as
    an HTTP date (RFC 9110 §10.2.3). A date in the past, or a negative
    number, means "now" (0.0). An infinite or overflowing number (``inf``,
    ``1e400``) is returned as ``math.inf``, so the caller sees a wait longer
    than any cap it applies instead of a crash or a wrapped-around value.
    Unparseable values and NaN are ignored rather than raised: a bad header
    must not turn a retryable 429 into a crash.

    Args:
        headers: response headers, looked up by lower-case names: a
            case-insensitive mapping (httpx's, aiohttp's) or a dict with
            lower-case keys (the http transport's).
        now: the current UNIX time, for tests; defaults to ``time.time()``.
    """
    millis = _number(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is not None:
        return seconds
    from email.utils import parsedate_to_datetime  # import time: only a Retry-After given as a date

    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    current = time.time() if now is None else now
    return max(when.timestamp() - current, 0.0)


def _number(text: str | None) -> float | None:
    """Returns a header's number of seconds clamped to [0, inf], or None if it is not one."""
    if text is None:
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    if math.isnan(number):
        return None
    return max(number, 0.0)


def decode_error_body(raw: bytes | str | None) -> tuple[Any, str]:
    """Returns the decoded error body and the human message inside it.

    OpenAI-compatible servers disagree on the shape: OpenAI and vLLM send
    ``{"error": {"message": ...}}``, FastAPI-based servers (llama.cpp's
    Python server) send ``{"detail": [...]}``, others send plain text. The
    body is returned decoded when it is JSON and as text otherwise.
    """
    if raw is None or raw in (b"", ""):
        return None, ""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return text, text.strip()[:_MAX_MESSAGE_CHARS]
    try:
        message = _message_of(body)
    except TypeError:  # orjson writes 255 levels at most (it reads 1024): show the text
        message = text.strip()
    return body, message[:_MAX_MESSAGE_CHARS]


def _message_of(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        for key in ("message", "detail"):
            if body.get(key):
                detail = body[key]
                return detail if isinstance(detail, str) else orjson.dumps(detail).decode()
    return orjson.dumps(body).decode() if not isinstance(body, str) else body


def error_from_status(
    status: int,
    raw_body: bytes | str | None,
    headers: Mapping[str, str],
    *,
    where: str,
    reason: str | None = None,
    url: str | None = None,
) -> BackendError:
    """Builds the `BackendError` for a non-2xx HTTP answer (the caller raises it).

    Args:
        status: the HTTP status code.
        raw_body: the undecoded response body.
        headers: the response headers (as for `parse_retry_after`).
        where: names the endpoint and model, e.g. ``"openai-compatible
            endpoint http://127.0.0.1:8000/v1 (model 'gpt-4o-mini')"``.
        reason: the HTTP reason phrase, if the transport has it.
        url: the URL the request went to; a server that echoes it (or the
            key inside it) in its message has the credentials masked.
    """
    body, message = decode_error_body(raw_body)
    message = scrub_text(message, url)
    phrase = f" {reason}" if reason else ""
    text = f"{where} answered HTTP {status}{phrase}"
    if message:
        text += f": {message}"
    if status in _HINTS:
        text += f" ({_HINTS[status]})"
    retry_after = parse_retry_after(headers)
    detail = message or None
    if status == 429:
        return RateLimitError(
            text, status=status, retry_after=retry_after, body=body, detail=detail
        )
    return BackendError(
        text,
        status=status,
        retryable=is_retryable_status(status),
        retry_after=retry_after,
        body=body,
        detail=detail,
    )
