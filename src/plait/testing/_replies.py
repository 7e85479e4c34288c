"""What the scripted server says: replies, stream events and error bodies.

Pure functions from a request body (and the responder's answer) to the JSON
an OpenAI-compatible server would send, kept apart from the HTTP handling so
each shape is easy to read against OpenAI's API reference.

Token counts are whitespace word counts: crude, but deterministic and easy
to predict in a test (``"echo: hello world"`` is 3 completion tokens).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = [
    "Flood",
    "RawReply",
    "Reply",
    "Responder",
    "build_reply",
    "completion_payload",
    "count_words",
    "default_responder",
    "error_payload",
    "stream_events",
]

Responder = Callable[
    [dict[str, Any]],
    "str | dict[str, Any] | RawReply | Flood | Awaitable[str | dict[str, Any] | RawReply | Flood]",
]
"""Turns a request body into a reply: text, a dict with ``content``, ``tool_calls``
(``[{"name", "arguments"}]``), ``finish_reason``, ``usage``, a `RawReply` or a `Flood`."""

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


@dataclass(frozen=True, slots=True)
class RawReply:
    """An answer put on the wire exactly as given: for replies no sane server sends.

    Text and dict answers are normalised into a well-formed completion; a
    responder returns a `RawReply` instead to test how a client copes with a
    malformed one (a ``message`` that is a string, usage of ``"ten"`` tokens,
    bytes that are not UTF-8). The server adds nothing but HTTP framing.

    Example::

        ScriptedServer(responder=lambda body: RawReply(b'{"choices": "none"}'))
        ScriptedServer(responder=lambda body: RawReply(stream_events=[b"[1, 2]"]))
    """

    body: bytes = b""
    """The body answering a non-streamed request, or a streamed one when
    ``stream_events`` is None (then it may be a whole SSE text)."""
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    """Response headers, sent as given (``body`` only)."""
    stream_events: Sequence[bytes] | None = None
    """For a streamed request: the data of each SSE event, each sent as one
    ``data: <bytes>`` event, then ``data: [DONE]``; status 200."""


@dataclass(frozen=True, slots=True)
class Flood:
    """An answer too large to hold: ``unit`` sent over and over, made as it is written.

    The body is ``head``, then ``unit`` ``repeat`` times (forever when None,
    until the client hangs up), then ``tail``; the server writes it in blocks
    of about 64 KiB, so it costs the server no memory whatever its size. With
    ``declare_length`` (and a ``repeat``) the full size is sent as
    Content-Length; otherwise the body is chunked and its size unknown ahead.

    Example::

        Flood(b" " * 65536, repeat=1024)                   # a 64 MiB body
        Flood(b"data: xxxx\n", content_type="text/event-stream")  # one endless SSE event
    """

    unit: bytes
    head: bytes = b""
    tail: bytes = b""
    repeat: int | None = None
    declare_length: bool = False
    content_type: str = "application/json"
    status: int = 200

    def __post_init__(self) -> None:
        if not self.unit:
            raise ValueError("Flood needs a non-empty unit")
        if self.declare_length and self.repeat is None:
            raise ValueError(
                "Flood(declare_length=True) needs a repeat: an endless body has no length"
            )

    @property
    def size(self) -> int | None:
        """Bytes of the whole body; None when it never ends."""
        if self.repeat is None:
            return None
        return len(self.head) + len(self.unit) * self.repeat + len(self.tail)

    def blocks(self) -> Iterator[bytes]:
        """Yields the body in pieces of about 64 KiB (one block object, written again and again)."""
        if self.head:
            yield self.head
        per_block = max(1, _FLOOD_BLOCK // len(self.unit))
        block = self.unit * per_block
        left = self.repeat
        while left is None or left > 0:
            if left is not None and left < per_block:
                yield self.unit * left
                break
            yield block
            if left is not None:
                left -= per_block
        if self.tail:
            yield self.tail


_FLOOD_BLOCK = 64 * 1024


@dataclass(slots=True)
class Reply:
    """One normalised assistant answer, before it is put on the wire."""

    content: str
    tool_calls: list[dict[str, str]]
    """Each ``{"id", "name", "arguments"}``; arguments as JSON text."""
    finish_reason: str
    usage: dict[str, int]
    """``prompt_tokens``, ``completion_tokens``, ``total_tokens``."""


def count_words(text: str) -> int:
    """Returns the scripted server's token count of ``text``: its whitespace words."""
    return len(text.split())


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multi-part content: keep the text parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def default_responder(body: dict[str, Any]) -> str:
    """Returns ``"echo: <content of the last user message>"``."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return "echo: " + _text_of(message.get("content"))
    return "echo: "


def build_reply(
    answer: str | dict[str, Any],
    body: dict[str, Any],
    *,
    call_id_prefix: str,
    token_limit_fields: tuple[str, ...],
) -> Reply:
    """Normalises a responder's answer into a `Reply` for ``body``.

    When the answer does not set ``finish_reason`` and has no tool calls, a
    token limit in the body (one of ``token_limit_fields``) is honoured the
    way a model would: the text is cut to that many words and the finish
    reason is ``length``.

    Raises:
        TypeError: the answer is neither a str nor a dict.
    """
    if isinstance(answer, str):
        answer = {"content": answer}
    if not isinstance(answer, dict):
        raise TypeError(
            f"scripted server responder returned {type(answer).__name__}; "
            "expected str or dict with content/tool_calls/finish_reason/usage"
        )
    content = _text_of(answer.get("content"))
    calls = [
        {
            "id": str(call.get("id") or f"{call_id_prefix}_{i}"),
            "name": str(call["name"]),
            "arguments": _arguments_text(call.get("arguments", {})),
        }
        for i, call in enumerate(answer.get("tool_calls") or [])
    ]
    finish = answer.get("finish_reason")
    if finish is None:
        finish = "tool_calls" if calls else "stop"
        limit = next((body[f] for f in token_limit_fields if body.get(f)), None)
        if not calls and isinstance(limit, int) and count_words(content) > limit:
            content = " ".join(content.split()[:limit])
            finish = "length"
    prompt = sum(
        count_words(_text_of(m.get("content")))
        for m in body.get("messages") or []
        if isinstance(m, dict)
    )
    completion = count_words(content) + sum(count_words(c["arguments"]) for c in calls)
    given = answer.get("usage") or {}
    prompt = int(given.get("prompt_tokens", prompt))
    completion = int(given.get("completion_tokens", completion))
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    return Reply(content=content, tool_calls=calls, finish_reason=str(finish), usage=usage)


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()


def completion_payload(
    reply: Reply, *, model: str, request_id: str, created: int
) -> dict[str, Any]:
    """Returns the ``chat.completion`` object for a non-streamed answer."""
    message: dict[str, Any] = {
        "role": "assistant",
        # OpenAI sends null content when the model only calls tools.
        "content": reply.content if (reply.content or not reply.tool_calls) else None,
    }
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in reply.tool_calls
        ]
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
        "usage": reply.usage,
    }


def _split(text: str, pieces: int) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // max(1, pieces)))  # ceiling division
    return [text[i : i + size] for i in range(0, len(text), size)]


def stream_events(
    reply: Reply,
    *,
    model: str,
    request_id: str,
    created: int,
    pieces: int,
    include_usage: bool,
) -> list[dict[str, Any]]:
    """Returns the ``chat.completion.chunk`` events of a streamed answer, in order.

    The content is cut into ``pieces`` parts (mid-word, as tokens would be);
    each tool call comes as a header fragment (id and name) followed by its
    arguments in ``pieces`` parts, so a client must join fragments by
    ``index``. As OpenAI does, usage comes in a last event with no choices,
    only when ``include_usage`` was asked for.
    """

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    events = [chunk({"role": "assistant", "content": ""})]
    events.extend(chunk({"content": piece}) for piece in _split(reply.content, pieces))
    for index, call in enumerate(reply.tool_calls):
        head = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["name"], "arguments": ""},
        }
        events.append(chunk({"tool_calls": [head]}))
        for piece in _split(call["arguments"], pieces):
            fragment = {"index": index, "function": {"arguments": piece}}
            events.append(chunk({"tool_calls": [fragment]}))
    events.append(chunk({}, reply.finish_reason))
    if include_usage:
        events.append(
            {
                "id": request_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": reply.usage,
            }
        )
    return events


def error_payload(status: int, message: str, *, code: str | None = None) -> dict[str, Any]:
    """Returns an OpenAI-shaped error body: ``{"error": {"message", "type", ...}}``."""
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "server_error" if status >= 500 else "api_error"),
            "param": None,
            "code": code,
        }
    }
