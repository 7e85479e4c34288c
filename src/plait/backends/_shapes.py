"""Checks on the shape of a provider's reply, shared by every provider's reader.

A reply can be valid JSON and still not be a reply: a proxy answers 200
with an error object, a server reports usage as text, a field is missing or
holds a list. Each reader checks every field it uses with `expect` and
raises `MalformedReply` naming the field by its path
(``choices[0].message.content``); the backend adds where the reply came
from and its start (`preview`) and raises a `BackendError`. Not retryable:
the same request gets the same answer.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["MalformedReply", "expect", "kind_of", "optional_text", "preview", "token_count"]


class MalformedReply(Exception):
    """Names the field of a reply that has the wrong shape (the backend adds where)."""


_JSON_KINDS = {
    dict: "an object",
    list: "a list",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    type(None): "null",
}


def kind_of(value: Any) -> str:
    """Returns what ``value`` is in JSON's words ("a string", "null"), else its type's name."""
    return _JSON_KINDS.get(type(value), type(value).__name__)


def expect(value: Any, kind: type, path: str) -> Any:
    """Returns ``value`` if it is a ``kind`` (a bool is no int); raises `MalformedReply`."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedReply(f"{path} is {kind_of(value)}, expected {_JSON_KINDS[kind]}")
    return value


def optional_text(value: Any, path: str) -> str | None:
    """Returns ``value`` if it is a string or null; raises `MalformedReply`."""
    return None if value is None else expect(value, str, path)


def token_count(value: Any, path: str) -> int:
    """Returns a usage count: an integer >= 0, or 0 when absent.

    ``"ten"`` tokens is a garbled reply, not zero tokens: recording 0 would let
    budgets and token limits be overrun without a word.
    """
    if value is None:
        return 0
    count: int = expect(value, int, path)
    if count < 0:
        raise MalformedReply(f"{path} is {count}, expected an integer >= 0")
    return count


_PREVIEW_CHARS = 300


def preview(data: Any) -> str:
    """Returns the start of a reply (decoded JSON, text, bytes or an SDK object): <= 300 chars."""
    if isinstance(data, bytes):
        text = data.decode("utf-8", "replace")
    elif isinstance(data, str):
        text = data
    else:
        try:
            text = orjson.dumps(data).decode()
        except TypeError:  # integers beyond 64 bits, SDK objects
            text = repr(data)
    return text if len(text) <= _PREVIEW_CHARS else text[:_PREVIEW_CHARS] + "…"
