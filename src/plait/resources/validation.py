"""The checkers of `ResourceConfig`'s settings: one small function per kind of value.

Each checker takes a value as written (in Python or read from a file) and
returns ``(error, clean)``: an error text to follow "key 'x'" ("must be a
positive integer, got -1 (int)") and None, or None and the value to store
(numbers as floats, mappings frozen, a `Price` for a price). Keeping them
apart from the configuration leaves `plait.resources.config` to say which keys
each provider takes and how problems are reported.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from plait.backends._urls import redact_url, scrub_text
from plait.resources.usage import Price

__all__ = [
    "Checker",
    "base_url",
    "cache",
    "dialect",
    "flag",
    "headers",
    "non_negative_int",
    "non_negative_number",
    "options",
    "path",
    "positive_int",
    "positive_number",
    "price",
    "secret",
    "suggestion",
    "text",
    "transport",
]

Checker = Callable[[Any], tuple[str | None, Any]]


def _finite(value: Any) -> float | None:
    """Returns ``value`` as a float if it is a finite real number (not a bool), else None.

    inf and nan are refused everywhere: ``timeout: inf`` would wait forever
    (write null for that), an infinite rpm or price makes every later sum inf
    or nan, and an int too large for a float is no more usable.
    """
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def suggestion(word: str, choices: Collection[str]) -> str:
    """Returns "; did you mean 'x'?" for the choice closest to a mistyped ``word``, or ""."""
    import difflib  # import time: only needed to explain an error

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _got(value: Any) -> str:
    return f"got {value!r} ({type(value).__name__})"


def positive_int(value: Any) -> tuple[str | None, Any]:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return None, value
    return f"must be a positive integer, {_got(value)}", None


def non_negative_int(value: Any) -> tuple[str | None, Any]:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return None, value
    return f"must be an integer >= 0, {_got(value)}", None


def positive_number(value: Any) -> tuple[str | None, Any]:
    number = _finite(value)
    if number is not None and number > 0:
        return None, number
    return f"must be a finite number > 0, {_got(value)}", None


def non_negative_number(value: Any) -> tuple[str | None, Any]:
    number = _finite(value)
    if number is not None and number >= 0:
        return None, number
    return f"must be a finite number >= 0, {_got(value)}", None


def text(value: Any) -> tuple[str | None, Any]:
    if isinstance(value, str) and value:
        return None, value
    return f"must be a non-empty string, {_got(value)}", None


def secret(value: Any) -> tuple[str | None, Any]:
    if isinstance(value, str) and value:
        return None, value
    # The type only: a key of the wrong type is still a key.
    return f"must be a non-empty string, got {type(value).__name__}", None


def path(value: Any) -> tuple[str | None, Any]:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    return text(value)


def flag(value: Any) -> tuple[str | None, Any]:
    if isinstance(value, bool):
        return None, value
    return f"must be true or false, {_got(value)}", None


def transport(value: Any) -> tuple[str | None, Any]:
    if value in ("http", "sdk"):
        return None, value
    if value == "aiohttp":
        return "names 'aiohttp', which is now 'http' (plait's own HTTP client, the default)", None
    return f"must be 'http' or 'sdk', {_got(value)}", None


def dialect(value: Any) -> tuple[str | None, Any]:
    if value in ("openai", "llama_cpp"):
        return None, value
    return f"must be 'openai' or 'llama_cpp' (omit it to detect), {_got(value)}", None


_CACHE_KEYS = ("memory_entries", "path")


def cache(value: Any) -> tuple[str | None, Any]:
    expected = (
        'must be true, false or a path to the cache file, or {"path": ..., '
        '"memory_entries": <int >= 0>} (both optional)'
    )
    if isinstance(value, bool):
        return None, value
    if isinstance(value, str | os.PathLike) and os.fspath(value):
        return None, os.fspath(value)
    if not isinstance(value, Mapping):
        return f"{expected}, {_got(value)}", None
    unknown = sorted(str(k) for k in value if k not in _CACHE_KEYS)
    if unknown:
        return f"{expected}; unknown key(s) {', '.join(map(repr, unknown))}", None
    # Both keys always present (None: the default), so an empty mapping is still truthy: on.
    clean: dict[str, Any] = {"path": None, "memory_entries": None}
    if value.get("path") is not None:
        error, clean["path"] = path(value["path"])
        if error is not None:
            return f"{expected}; 'path' {error}", None
    if value.get("memory_entries") is not None:
        error, clean["memory_entries"] = non_negative_int(value["memory_entries"])
        if error is not None:
            return f"{expected}; 'memory_entries' {error}", None
    return None, MappingProxyType(clean)


def headers(value: Any) -> tuple[str | None, Any]:
    if isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return None, MappingProxyType(dict(value))
    return "must be a mapping of header names to string values", None


def base_url(value: Any) -> tuple[str | None, Any]:
    expected = "must be an http(s) URL like 'https://api.openai.com/v1'"
    if not isinstance(value, str) or not value:
        return f"{expected}, {_got(value)}", None
    problem = _url_problem(value)
    if problem is not None:
        return f"{expected}, got {redact_url(value)!r}: {problem}", None
    return None, value


def _url_problem(url: str) -> str | None:
    """Returns what keeps ``url`` from being an http(s) API root, or None if nothing does."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return "it contains a space or control character (a stray newline from a file?)"
    if "://" not in url:
        return "it has no scheme; start it with 'https://' (or 'http://' for a local server)"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        return f"it does not parse ({scrub_text(str(exc), url)})"
    if parts.scheme.lower() not in ("http", "https"):
        return f"the scheme is {parts.scheme!r}; plait speaks http and https only"
    if not parts.hostname:
        return "it has no host name"
    if not _encodes_as_idna(parts.hostname):
        return f"the host name {parts.hostname!r} has an empty or over-long label"
    return None


def _encodes_as_idna(hostname: str) -> bool:
    """Whether ``hostname.encode("idna")`` succeeds (what the resolver does with it).

    An ASCII name is checked here as the codec checks it (every label but a
    trailing one 1 to 63 characters long), since loading the codec (with
    ``stringprep`` and ``unicodedata``) costs a cold process more than the
    rest of the check; any other name goes to the codec.
    """
    if hostname.isascii():
        *labels, last = hostname.split(".")
        return all(0 < len(label) < 64 for label in labels) and len(last) < 64
    try:
        hostname.encode("idna")
    except UnicodeError:
        return False
    return True


def options(value: Any) -> tuple[str | None, Any]:
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return None, MappingProxyType(dict(value))
    return "must be a mapping of keyword arguments (string keys)", None


def price(value: Any) -> tuple[str | None, Any]:
    expected = 'must be {"input": <$ per Mtok>, "output": <$ per Mtok>}'
    if isinstance(value, Price):
        value = {"input": value.input, "output": value.output}
    if not isinstance(value, Mapping) or set(value) != {"input", "output"}:
        return f"{expected}, {_got(value)}", None
    given, taken = _finite(value["input"]), _finite(value["output"])
    if given is None or taken is None or given < 0 or taken < 0:
        return f"{expected} with finite numbers >= 0, {_got(value)}", None
    return None, Price(given, taken)
