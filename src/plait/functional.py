"""Functional ops: small, pure, graph-aware transforms of Values (``import plait.functional as F``).

Each op accepts raw data or `Value`s and returns a `Value`. While a trace is
recorded, calling an op records one node named ``F.<op>`` and returns a
symbolic Value; otherwise the op runs at once.

Data problems do not raise: a missing key, a division by zero or unparsable
JSON comes back as ``Value(ERROR)`` whose ``meta`` names the op and the refs of
its inputs. An error input short-circuits every op except `unwrap_or`,
`is_error` and `with_meta`, which exist to handle errors::

    >>> F.select({"a": 1}, "b").kind
    <ValueKind.ERROR: 'error'>
    >>> F.unwrap_or(F.select({"a": 1}, "b"), 0).payload
    0
"""

from __future__ import annotations

import builtins
import functools
import inspect
import re
import statistics
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from plait._context import current_run, current_trace
from plait._jsontext import loads
from plait.module import LLMInference
from plait.values import (
    Value,
    ValueKind,
    _infer_kind,
    collect_refs,
    error_value,
    first_error,
    unwrap,
)

__all__ = [
    "add",
    "chat_complete",
    "coerce",
    "concat",
    "div",
    "format",
    "is_error",
    "lower",
    "map_values",
    "max",
    "mean",
    "merge",
    "min",
    "mul",
    "parse_structured",
    "render",
    "select",
    "strip",
    "sub",
    "sum",
    "unwrap_or",
    "upper",
    "with_meta",
    "zip_values",
]

_MISSING: Any = object()


def _op(
    name: str, *, handles_errors: bool = False, prepare: Callable[..., Any] | None = None
) -> Callable[[Callable[..., Any]], Any]:
    """Makes ``impl`` a graph-aware op named ``F.<name>``.

    ``impl`` receives raw payloads (or, with ``handles_errors``, the Values
    themselves) and returns raw data or a Value. ``prepare(args, kwargs)``,
    when given, completes the arguments from the Values' meta first (it is
    the last chance to read meta: nodes record and ``impl`` gets payloads).
    """
    op_name = f"F.{name}"

    def decorate(impl: Callable[..., Any]) -> Callable[..., Value]:
        @functools.wraps(impl)
        def op(*args: Any, **kwargs: Any) -> Value:
            if prepare is not None:
                args, kwargs = prepare(args, kwargs)
            session = current_trace()
            if session is not None:
                return session.record_op(op_name, op, args, kwargs)
            if not handles_errors:
                failed = first_error((args, kwargs))
                if failed is not None:
                    return _propagate(failed, op_name)
                call_args, call_kwargs = unwrap(args), unwrap(kwargs)
            else:
                call_args, call_kwargs = args, kwargs
            try:
                result = impl(*call_args, **call_kwargs)
            except Exception as exc:  # data problems are returned, not raised
                return error_value(exc, op=op_name, sources=collect_refs(args, kwargs))
            return result if isinstance(result, Value) else Value(_infer_kind(result), result)

        op.op_name = op_name  # type: ignore[attr-defined]
        op.handles_errors = handles_errors  # type: ignore[attr-defined]
        return op

    return decorate


def _propagate(failed: Value, op_name: str) -> Value:
    """Returns the upstream error, noting that ``op_name`` was skipped because of it."""
    meta = dict(failed.meta)
    meta["skipped"] = [*meta.get("skipped", []), op_name]
    return Value(ValueKind.ERROR, failed.payload, ref=failed.ref, meta=meta)


# -------------------------------------------------------------------- LLM
def chat_complete(
    prompt: Any,
    *,
    alias: str,
    system_prompt: Any = "",
    temperature: float = 1.0,
    max_tokens: int | None = None,
    response_format: Any = None,
) -> Any:
    """The atomic LLM op: one chat completion of ``prompt`` through the resources of ``alias``.

    ``prompt`` is text, a message, a conversation or a `plait.History`, as an
    `LLMInference` takes it; the other arguments are its settings. While
    tracing it records one LLM node named ``F.chat_complete`` and returns its
    symbolic Value; inside an ``async def forward`` (or with resources from
    ``ExecutionSettings``) it returns an awaitable of ``Value(RESPONSE)`` (or
    ``Value(STRUCTURED)`` with a ``response_format``), whose meta inside a
    program holds the reply's ``model``, ``input_tokens``, ``output_tokens``,
    ``cost`` and ``usage``; from synchronous code
    with resources it returns that Value at once.

    One might expect `LLMInference` to delegate to this op; the delegation
    runs the other way — this op makes a one-off `LLMInference`
    and calls it — so both share one path through the resources (limits,
    retries, cache, structured replies), and a call made here is profiled,
    traced and trained like any module call.

    Raises:
        RuntimeError: there are no resources (no trace, no running program,
            no ``ExecutionSettings``).
    """
    llm = LLMInference(alias, system_prompt, temperature, max_tokens, response_format)
    object.__setattr__(llm, "_name", "F.chat_complete")
    executor = current_run()
    if executor is not None and current_trace() is None:  # inside an ``async def forward``
        return executor.run_llm(llm, (prompt,), {})  # the reply with its meta (model, tokens)
    result = llm(prompt)
    if current_trace() is not None:
        return result
    if inspect.isawaitable(result):
        return _response_value(result)
    return _as_response(result)


async def _response_value(pending: Any) -> Value:
    return _as_response(await pending)


def _as_response(output: Any) -> Value:
    if isinstance(output, Value):
        return output
    return Value(ValueKind.RESPONSE if isinstance(output, str) else ValueKind.STRUCTURED, output)


# ------------------------------------------------------------------- text
def _vars_from_meta(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Gives a template Value's ``meta["vars"]`` as the variables, when none are given."""
    template = args[0] if args else kwargs.get("template")
    given = len(args) > 1 or "variables" in kwargs
    if given or not isinstance(template, Value) or "vars" not in template.meta:
        return args, kwargs
    if args:  # the template alone, by position
        return (args[0], template.meta["vars"]), kwargs
    return args, {**kwargs, "variables": template.meta["vars"]}


@_op("render", prepare=_vars_from_meta)
def render(template: str, variables: Mapping[str, Any] | None = None, **kwargs: Any) -> str:
    """Fills the ``{name}`` slots of ``template`` from ``variables`` and keyword arguments.

    A template Value that carries its variables in ``meta["vars"]``
    (``Value(FSTRING, "Hi {name}", meta={"vars": {"name": "Ada"}})``) is
    rendered from them when no ``variables`` are given.
    """
    values = {**(variables or {}), **kwargs}
    return template.format_map(values)


@_op("format")
def format(template: str, *args: Any, **kwargs: Any) -> str:
    """Returns ``template.format(*args, **kwargs)``."""
    return template.format(*args, **kwargs)


@_op("concat")
def concat(*parts: Any, sep: str = "") -> str:
    """Joins the text of ``parts`` with ``sep``; a single list argument is joined element-wise."""
    if len(parts) == 1 and isinstance(parts[0], list | tuple):
        parts = tuple(parts[0])
    return sep.join(builtins.str(p) for p in parts)


@_op("strip")
def strip(text: str, chars: str | None = None) -> str:
    """Returns ``text`` without leading and trailing whitespace (or ``chars``)."""
    return _require_str(text, "strip").strip(chars)


@_op("lower")
def lower(text: str) -> str:
    """Returns ``text`` in lower case."""
    return _require_str(text, "lower").lower()


@_op("upper")
def upper(text: str) -> str:
    """Returns ``text`` in upper case."""
    return _require_str(text, "upper").upper()


def _require_str(text: Any, op: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"F.{op} needs text, got {type(text).__name__}")
    return text


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


@_op("parse_structured")
def parse_structured(text: Any, target: Any = None) -> Any:
    """Parses JSON from model text, leniently, and validates it against ``target`` if given.

    Small models wrap JSON in prose or code fences, so the first fenced block
    or the first ``{...}`` / ``[...]`` span is tried when the whole text is
    not JSON. ``target`` may be any type pydantic can validate (a model,
    ``list[str]``, a dataclass …).
    """
    data = text if not isinstance(text, str) else _loads_lenient(text)
    if target is None:
        return data
    # import time: pydantic loads on first use, not on a plain call
    from pydantic import TypeAdapter

    return TypeAdapter(target).validate_python(data)


def _loads_lenient(text: str) -> Any:
    candidates = [text.strip()]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(text)]
    for opener, closer in (("{", "}"), ("[", "]")):
        start, end = text.find(opener), text.rfind(closer)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            return loads(candidate)
        except ValueError:
            continue
    preview = text if len(text) <= 80 else text[:77] + "..."
    raise ValueError(f"no JSON object or array found in {preview!r}")


# -------------------------------------------------------------- structure
@_op("select")
def select(value: Any, key: Any, default: Any = _MISSING) -> Any:
    """Returns ``value[key]`` for mappings and sequences, or the attribute ``key`` of objects.

    A missing key returns ``default`` when given, else an error Value that
    lists the keys that exist.
    """
    try:
        if isinstance(value, Mapping):
            return value[key]
        if isinstance(value, list | tuple | str):
            return value[key]
        if isinstance(key, str) and hasattr(value, key):
            return getattr(value, key)
        raise KeyError(key)
    except (KeyError, IndexError, TypeError):
        if default is not _MISSING:
            return default
        raise KeyError(f"{key!r} not found in {_describe_keys(value)}") from None


def _describe_keys(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"mapping with keys {list(value)[:20]}"
    if isinstance(value, list | tuple | str):
        return f"{type(value).__name__} of length {len(value)}"
    fields = getattr(type(value), "model_fields", None) or getattr(value, "__dict__", {})
    return f"{type(value).__name__} with attributes {list(fields)[:20]}"


@_op("merge")
def merge(*mappings: Mapping[str, Any]) -> dict[str, Any]:
    """Returns one dict with the keys of all ``mappings``; later ones win."""
    merged: dict[str, Any] = {}
    for i, mapping in enumerate(mappings):
        if not isinstance(mapping, Mapping):
            raise TypeError(f"F.merge argument {i} is {type(mapping).__name__}, not a mapping")
        merged.update(mapping)
    return merged


_TRUE = {"true", "yes", "y", "1", "on"}
_FALSE = {"false", "no", "n", "0", "off"}


@_op("coerce")
def coerce(value: Any, target: Any) -> Any:
    """Converts ``value`` to ``target`` (int, float, str, bool, or any pydantic-validatable type).

    Text numbers and booleans are read leniently (``" 42 "`` → 42, ``"Yes"`` → True).
    """
    if target is bool and isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise ValueError(f"cannot read {value!r} as a boolean")
    if target in (int, float) and isinstance(value, str):
        return target(value.strip())
    if target in (int, float, str, bool):
        return target(value)
    # import time: pydantic loads on first use, not on a plain call
    from pydantic import TypeAdapter

    return TypeAdapter(target).validate_python(value)


# ---------------------------------------------------------------- errors
@_op("unwrap_or", handles_errors=True)
def unwrap_or(value: Any, default: Any) -> Any:
    """Returns the payload of ``value``, or ``default`` when it is an error."""
    if isinstance(value, Value):
        return unwrap(default) if value.is_error else value
    return value


@_op("is_error", handles_errors=True)
def is_error(value: Any) -> bool:
    """Returns whether ``value`` is an error Value."""
    return isinstance(value, Value) and value.is_error


@_op("with_meta", handles_errors=True)
def with_meta(value: Any, **meta: Any) -> Value:
    """Returns ``value`` with ``meta`` entries added (errors keep being errors)."""
    base = value if isinstance(value, Value) else Value(_infer_kind(value), value)
    return Value(base.kind, base.payload, ref=base.ref, meta={**base.meta, **meta})


# ------------------------------------------------------------------- math
@_op("add")
def add(a: Any, b: Any) -> Any:
    """Returns ``a + b``."""
    return a + b


@_op("sub")
def sub(a: Any, b: Any) -> Any:
    """Returns ``a - b``."""
    return a - b


@_op("mul")
def mul(a: Any, b: Any) -> Any:
    """Returns ``a * b``."""
    return a * b


@_op("div")
def div(a: Any, b: Any) -> Any:
    """Returns ``a / b``; division by zero is an error Value."""
    return a / b


def _numbers(values: Any, op: str) -> list[Any]:
    if not isinstance(values, Iterable) or isinstance(values, str | bytes):
        raise TypeError(f"F.{op} needs a list of numbers, got {type(values).__name__}")
    items = list(values)
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise TypeError(f"F.{op} item {i} is {type(item).__name__}, not a number")
    return items


@_op("sum")
def sum(values: Iterable[Any], start: Any = 0) -> Any:
    """Returns the sum of ``values``."""
    return builtins.sum(_numbers(values, "sum"), start)


@_op("min")
def min(values: Iterable[Any]) -> Any:
    """Returns the smallest of ``values``; an empty list is an error Value."""
    items = _numbers(values, "min")
    if not items:
        raise ValueError("F.min of an empty list")
    return builtins.min(items)


@_op("max")
def max(values: Iterable[Any]) -> Any:
    """Returns the largest of ``values``; an empty list is an error Value."""
    items = _numbers(values, "max")
    if not items:
        raise ValueError("F.max of an empty list")
    return builtins.max(items)


@_op("mean")
def mean(values: Iterable[Any]) -> float:
    """Returns the arithmetic mean of ``values``; an empty list is an error Value."""
    items = _numbers(values, "mean")
    if not items:
        raise ValueError("F.mean of an empty list")
    return statistics.fmean(items)


# ------------------------------------------------------------ collections
@_op("map_values")
def map_values(fn: Callable[[Any], Any], values: Any) -> Any:
    """Applies ``fn`` to each item of a list (or each value of a dict), keeping the shape."""
    if isinstance(values, Mapping):
        return {key: fn(item) for key, item in values.items()}
    if isinstance(values, list | tuple):
        return [fn(item) for item in values]
    raise TypeError(f"F.map_values needs a list or dict, got {type(values).__name__}")


@_op("zip_values")
def zip_values(*sequences: Any) -> list[tuple[Any, ...]]:
    """Returns tuples of corresponding items; sequences of different lengths are an error."""
    lengths = [len(s) for s in sequences]
    if len(set(lengths)) > 1:
        raise ValueError(f"F.zip_values got sequences of different lengths {lengths}")
    return list(zip(*sequences, strict=True))
