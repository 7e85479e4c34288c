"""JSON text from outside (a model's reply, a file), read with one rule for deep nesting.

Python's JSON parser recurses once per level, so a line of ten thousand ``[``
ends in a bare ``RecursionError`` (an error no reader expects), and a few
hundred levels parse but break the first recursive walk after them. `loads`
finds nesting past its bound before parsing, and reports it as `TooDeep`, a
`json.JSONDecodeError` carrying the line and column: the `ValueError` every
reader already handles for text that is not JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_DEPTH", "TooDeep", "loads"]

MAX_DEPTH = 100
"""Most arrays and objects JSON from a file may nest inside each other; real data
nests a few levels, and tracing refuses inputs nested deeper than this anyway."""


class TooDeep(json.JSONDecodeError):
    """JSON text nests deeper than the bound; ``lineno`` and ``colno`` point at the first
    bracket past it."""


# A whole string, so that brackets inside it are skipped (an unclosed one runs to the end).
_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"?'
_STRING_OR_BRACKET = re.compile(_STRING + r"|[\[\]{}]", re.DOTALL)
_STRING_OR_NOT_BRACKET = re.compile(_STRING + r'|[^\[\]{}"]+', re.DOTALL)
_INNERMOST_PAIR = re.compile(r"\[\]|\{\}")

# One parser per strictness, made once: ``json.loads(text, strict=...)`` builds a new one
# on every call, which costs more than parsing a short line.
_STRICT = json.JSONDecoder()
_LAX = json.JSONDecoder(strict=False)


def loads(text: str | bytes, max_depth: int = MAX_DEPTH, *, strict: bool = True) -> Any:
    """Returns the value of JSON ``text`` that nests at most ``max_depth`` levels.

    NaN and infinities are read as Python reads them (floats).

    Args:
        max_depth: the most levels of lists and objects inside each other.
        strict: False accepts raw control characters inside strings (small
            models write raw newlines in their JSON).

    Raises:
        TooDeep: the text nests deeper than ``max_depth``.
        ValueError: the text is not JSON (`json.JSONDecodeError`), is bytes
            that are not UTF-8, or holds an integer of more digits than
            Python converts.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    if _may_nest_deeper(text, max_depth):
        too_deep = _first_bracket_past(text, max_depth)
        if too_deep is not None:
            raise TooDeep(
                f"nested too deeply: lists or objects nested more than {max_depth} levels deep",
                text,
                too_deep,
            )
    try:
        if text.startswith("\ufeff"):  # as json.loads says it
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        return (_STRICT if strict else _LAX).decode(text)
    except RecursionError:  # only when max_depth is above what the parser can recurse
        raise TooDeep("nested too deeply to read", text, 0) from None


def _may_nest_deeper(text: str, max_depth: int) -> bool:
    """Whether ``text`` may nest deeper than ``max_depth``, found with C-speed passes only.

    With strings and everything but brackets taken out, each pass removes the
    innermost level (every adjacent pair); brackets left after ``max_depth``
    passes nest deeper, or do not pair up (then the JSON parser says where).
    """
    if text.count("[") + text.count("{") <= max_depth:  # most text stops here
        return False
    brackets = _STRING_OR_NOT_BRACKET.sub("", text)
    for _ in range(max_depth):
        inner = _INNERMOST_PAIR.sub("", brackets)
        if inner == brackets:
            return bool(inner)
        brackets = inner
    return bool(brackets)


def _first_bracket_past(text: str, max_depth: int) -> int | None:
    """Returns the offset of the first ``[`` or ``{`` nested past ``max_depth``, if any."""
    depth = 0
    for token in _STRING_OR_BRACKET.finditer(text):
        bracket = token.group()
        if bracket in ("[", "{"):
            depth += 1
            if depth > max_depth:
                return token.start()
        elif bracket in ("]", "}"):
            depth -= 1
    return None
