"""JSON text from outside (a model's reply, a file), read with one rule for deep nesting.

The json module recurses once per level and raises `RecursionError` past the
interpreter's limit (about a thousand levels): an error no reader expects,
which escaped as a bare Python exception. `loads` turns it into the
`ValueError` every reader already handles for text that is not JSON.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["loads"]


def loads(text: str | bytes, *, strict: bool = True) -> Any:
    """Returns the JSON value of ``text``, like `json.loads`.

    Args:
        strict: False accepts raw control characters inside strings (small
            models write raw newlines in their JSON).

    Raises:
        ValueError: ``text`` is not JSON (`json.JSONDecodeError`), holds an
            integer of more digits than Python converts, or is nested too
            deeply to read.
    """
    try:
        return json.loads(text, strict=strict)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply to read") from None
