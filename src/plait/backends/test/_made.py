"""A valid value made from a JSON schema: what the test provider answers a typed call with.

The value is the simplest one the schema allows, the same every time, so a
test's expectations do not move: an enum or a ``Literal`` gives its first
value, a number its lower bound (else 0), a string ``"test"`` (stretched or
cut to its length bounds, or a sample of its ``format``), a list one item (or
as many as ``minItems`` asks), an object every property it lists. Nested
models are followed through ``$ref``; past a few levels an optional field is
left null and a list empty, so a recursive model ends. A string's ``pattern``
and a number's ``multipleOf`` are not followed: a field with one needs its
replies given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["made_value"]

TEXT = "test"
"""A string field's value when its schema asks for nothing more."""

_FORMATS = {
    "date": "2026-01-01",
    "date-time": "2026-01-01T00:00:00Z",
    "time": "00:00:00",
    "email": "test@example.com",
    "uri": "https://example.com",
    "uuid": "00000000-0000-4000-8000-000000000000",
}
_SHALLOW = 6
"""Below this depth a null or an empty list is chosen wherever the schema allows one."""
_DEEPEST = 64


def made_value(schema: Mapping[str, Any]) -> Any:
    """Returns a value valid under ``schema`` (a JSON schema, its ``$defs`` inside it).

    Raises:
        ValueError: the schema nests deeper than 64 levels with no way out
            (a model that requires itself), or holds a ``$ref`` it does not define.
    """
    return _made(schema, schema, 0)


def _made(node: Any, root: Mapping[str, Any], depth: int) -> Any:
    if not isinstance(node, Mapping):  # ``true``/``{}``: anything goes
        return TEXT
    if depth > _DEEPEST:
        raise ValueError(f"the test provider cannot make a value: the schema nests past {_DEEPEST}")
    if "$ref" in node:
        return _made(_resolve(node["$ref"], root), root, depth + 1)
    if "const" in node:
        return node["const"]
    if node.get("enum"):
        return node["enum"][0]
    for key in ("anyOf", "oneOf"):
        if node.get(key):
            return _made(_branch(node[key], depth), root, depth + 1)
    if node.get("allOf"):
        merged: dict[str, Any] = {}
        for part in node["allOf"]:
            merged.update(_resolve(part["$ref"], root) if "$ref" in part else part)
        return _made(merged, root, depth + 1)
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if not kinds or (depth >= _SHALLOW and "null" in kind):
            return None
        kind = kinds[0]
    if kind is None:
        kind = "object" if "properties" in node else "array" if "items" in node else None
    return _MAKERS.get(kind, _anything)(node, root, depth)


def _branch(branches: list[Any], depth: int) -> Any:
    """The first branch that is not null; the null one when deep (so recursion ends)."""
    nulls = [b for b in branches if isinstance(b, Mapping) and b.get("type") == "null"]
    others = [b for b in branches if b not in nulls]
    if nulls and (depth >= _SHALLOW or not others):
        return nulls[0]
    return others[0]


def _resolve(ref: Any, root: Mapping[str, Any]) -> Any:
    node: Any = root
    if isinstance(ref, str) and ref.startswith("#"):
        for part in ref.lstrip("#").strip("/").split("/"):
            node = node.get(part) if isinstance(node, Mapping) and part else node
            if node is None:
                break
        else:
            return node
    raise ValueError(f"the test provider cannot make a value: the schema's $ref {ref!r} is unknown")


def _object(node: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> dict[str, Any]:
    properties = node.get("properties") or {}
    return {name: _made(sub, root, depth + 1) for name, sub in properties.items()}


def _array(node: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> list[Any]:
    prefix = node.get("prefixItems")
    if prefix:
        return [_made(sub, root, depth + 1) for sub in prefix]
    low = int(node.get("minItems", 0))
    count = max(low, 0 if depth >= _SHALLOW else 1)
    count = min(count, int(node.get("maxItems", count)))
    return [_made(node.get("items", {}), root, depth + 1) for _ in range(count)]


def _string(node: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> str:
    text = _FORMATS.get(str(node.get("format")), TEXT)
    low, high = int(node.get("minLength", 0)), node.get("maxLength")
    text = text.ljust(low, "t")
    return text if high is None else text[: int(high)]


def _number(node: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> float | int:
    whole = node.get("type") == "integer"
    step = 1 if whole else 0.5
    value: float = 0
    if "minimum" in node:
        value = node["minimum"]
    elif "exclusiveMinimum" in node:
        value = node["exclusiveMinimum"] + step
    if "maximum" in node and value > node["maximum"]:
        value = node["maximum"]
    elif "exclusiveMaximum" in node and value >= node["exclusiveMaximum"]:
        value = node["exclusiveMaximum"] - step
    return int(value) if whole else float(value)


def _anything(node: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> Any:
    return TEXT


_MAKERS: dict[Any, Any] = {
    "object": _object,
    "array": _array,
    "string": _string,
    "integer": _number,
    "number": _number,
    "boolean": lambda node, root, depth: True,
    "null": lambda node, root, depth: None,
}
