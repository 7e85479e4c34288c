"""Python values as JSON data: one rule for every place plait stores or shows a value.

pydantic's serializer turns models, dataclasses, dates, paths and the like into
JSON data; anything it does not know becomes ``fallback(value)`` (its text,
unless a caller asks for ``repr``). A `Value` or `ValueRef` is written field by
field, like the dataclass each once was (they are plain classes so that
``import plait`` does not load `dataclasses`). pydantic_core is loaded on the first value
written, not by ``import plait`` nor by a run that writes nothing, so the lower
layers can import this module at their top.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plait.values import Value, ValueRef

__all__ = ["as_json_data", "compact_json"]


def as_json_data(value: Any, fallback: Callable[[Any], Any] = str, **options: Any) -> Any:
    """Returns ``value`` as JSON data (``options``: pydantic_core's, e.g. ``context=``)."""
    from pydantic_core import to_jsonable_python  # import time: pydantic_core on first use

    return to_jsonable_python(value, fallback=_fields_or(fallback), **options)


def compact_json(value: Any) -> str:
    """Returns ``value`` as compact JSON text (no spaces), unknown values as their text."""
    from pydantic_core import to_json  # import time: pydantic_core on first use

    return to_json(value, fallback=_fields_or(str)).decode()


def _fields_or(fallback: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Returns ``fallback`` that first writes a `Value` or `ValueRef` as its fields."""

    def written(value: Any) -> Any:
        if isinstance(value, Value):
            return {
                "kind": value.kind,
                "payload": value.payload,
                "ref": value.ref,
                "meta": value.meta,
            }
        if isinstance(value, ValueRef):
            return {"ref": value.ref}
        return fallback(value)

    return written
