"""Structured outputs: from a Python type to a JSON schema and back to a typed object.

Providers want an *object* at the root of a response schema (OpenAI's strict
mode requires it, and llama.cpp grammars are most reliable with it), so a
type that is not an object — ``list[str]``, ``Literal["a", "b"]``, ``int`` —
is wrapped as ``{"value": <type>}`` on the wire and unwrapped after parsing.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from plait.backends.types import ResponseSchema
from plait.errors import StructuredOutputError

__all__ = ["OutputType", "output_type_for"]

_WRAP_KEY = "value"


@dataclass(frozen=True)
class OutputType:
    """How to ask for and read one response type."""

    target: Any
    schema: ResponseSchema
    wrapped: bool
    """Whether the type sits under ``{"value": ...}`` on the wire."""

    @property
    def name(self) -> str:
        return _type_name(self.target)

    def parse(self, text: str) -> Any:
        """Returns the typed object in ``text``; raises StructuredOutputError saying why not."""
        from pydantic import ValidationError

        try:
            data = json.loads(_strip_fences(text))
        except ValueError as exc:
            raise StructuredOutputError(
                f"reply is not valid JSON for {self.name}: {exc}", raw=text, target=self.name
            ) from None
        if self.wrapped and (not isinstance(data, dict) or _WRAP_KEY not in data):
            # Lenient: a model may answer the bare value instead of the wrapper.
            data = {_WRAP_KEY: data}
        try:
            parsed = _adapter(self._validated_type()).validate_python(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise StructuredOutputError(
                f"reply does not match {self.name}: {problems}", raw=text, target=self.name
            ) from None
        return getattr(parsed, _WRAP_KEY) if self.wrapped else parsed

    def _validated_type(self) -> Any:
        return _wrapper(self.target) if self.wrapped else self.target


def _strip_fences(text: str) -> str:
    match = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    return match.group(1) if match else text.strip()


def _type_name(target: Any) -> str:
    return getattr(target, "__name__", None) or repr(target)


@functools.cache
def _adapter(target: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(target)


@functools.cache
def _wrapper(target: Any) -> Any:
    from pydantic import create_model

    return create_model("Wrapped", **{_WRAP_KEY: (target, ...)})


@functools.cache
def output_type_for(target: Any) -> OutputType:
    """Returns the schema and parser for ``target`` (cached per type).

    Raises:
        TypeError: ``target`` is not something pydantic can describe as JSON.
    """
    try:
        schema = _adapter(target).json_schema()
    except Exception as exc:
        raise TypeError(
            f"response_format {_type_name(target)} cannot be described as a JSON schema: {exc}"
        ) from None
    wrapped = schema.get("type") != "object"
    if wrapped:
        schema = _adapter(_wrapper(target)).json_schema()
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", _type_name(target))[:64] or "response"
    return OutputType(target, ResponseSchema(name=name, schema=schema), wrapped)
