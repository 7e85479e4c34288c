"""Values: the data that flows between the nodes of a plait program.

A `Value` is a payload with provenance: ``ref`` names the graph node (or
parameter, ``param:<dotted.name>``) that produced it and ``meta`` carries
facts such as token usage, cache hits or tape ids. Errors are data too: a
failed functional op yields ``Value(ERROR)`` with the op and its sources in
``meta`` instead of raising, so a pipeline can inspect or replace it.

While a program is traced, modules return *symbolic* values whose payload is
unknown. Python cannot be allowed to decide anything on them, so ``bool()``,
``len()``, ``in``, ``int()``, ``==``, iteration and ``dict()`` raise `TracingError`.
Formatting is allowed: a symbolic value formats to a placeholder token that
the tracer later replaces by the real text, which is how f-strings,
``str.format``, ``+``, ``"".join`` and ``json.dumps`` over traced outputs work
(``json.dumps`` escapes the token; the tracer recognises the escaped form and
renders the real value as JSON). The token is built to be visibly damaged by
any other escaping or transforming function (``repr`` of a string holding
one, ``html.escape``, ``urllib.parse.quote``, ``textwrap``, ``.upper()``), so
the tracer refuses such text instead of sending a mangled token to a model::

    >>> v = Value(ValueKind.TEXT, "hello")
    >>> f"{v}!"
    'hello!'
"""

from __future__ import annotations

import os
import re
import sys
import types
from collections.abc import Iterator
from enum import StrEnum
from typing import Any, NoReturn

from plait._context import current_trace
from plait.errors import TracingError

__all__ = [
    "SYMBOLIC",
    "TracedValue",
    "Value",
    "ValueKind",
    "ValueRef",
    "collect_refs",
    "error_value",
    "first_error",
    "is_symbolic",
    "placeholder",
    "symbolic",
    "unwrap",
    "valueify",
]


class ValueKind(StrEnum):
    """What a payload is, so downstream code can format and check it."""

    TEXT = "text"
    FSTRING = "fstring"
    RESPONSE = "response"
    STRUCTURED = "structured"
    INT = "int"
    FLOAT = "float"
    ERROR = "error"
    TOOL_RESULT = "tool_result"
    BINARY = "binary"
    OTHER = "other"


class _Symbolic:
    """Payload of a traced value: known only once the graph runs."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<symbolic>"


SYMBOLIC = _Symbolic()
"""The single payload object of every symbolic (traced) value."""


def _new_nonce() -> tuple[str, str]:
    """Returns this process's random marker: 4 letters of alternating case, and 12 digits."""
    raw = os.urandom(16)
    letters = "".join(chr((ord("a") if i % 2 == 0 else ord("A")) + raw[i] % 26) for i in range(4))
    return letters, str(int.from_bytes(raw[4:], "big") % 10**12).zfill(12)


# A placeholder token must survive the string building plait supports (f-strings,
# `+`, join, format) and be visibly damaged by anything else, so that no
# escaped or transformed token is ever sent to a model as if it were text:
# - private-use characters open and close it: no user or model types them;
# - its mixed-case letters change under .upper(), .lower(), .title(), .swapcase();
# - its digits survive every case change and escaping, so the tracer can still
#   tell that what it finds is what is left of a token (cheap to search for);
# - "\x1f" is escaped by JSON (as \u001f) and by repr() (as \x1f), "&" by
#   html.escape, "\t" by textwrap and split().
_LETTERS, TOKEN_DIGITS = _new_nonce()
_FRAGILE = "\x1f&\t"
_TOKEN_OPEN = f"\ue000{_LETTERS}{TOKEN_DIGITS}{_FRAGILE}"
_TOKEN_CLOSE = "\ue001"
TOKEN_REGEX = re.escape(_TOKEN_OPEN) + r"([svr])\|([^\ue001|]*)\|([^\ue001]*)" + _TOKEN_CLOSE
"""Matches a placeholder token; groups: mode (``v`` the value itself, ``s`` str, ``r``
repr), format spec, ref. Compiled by the tracer, its one reader (`plait.tracing.tracer`),
so that ``import plait`` compiles no pattern."""
_JSON_FRAGILE = "\\u001f&\\t"
"""`_FRAGILE` as ``json.dumps`` writes it (with or without ``ensure_ascii``)."""
JSON_TOKEN_REGEX = (
    r"(\\ue000|\ue000)"
    + re.escape(f"{_LETTERS}{TOKEN_DIGITS}{_JSON_FRAGILE}")
    + r"([svr])\|(.*?)(?:\\ue001|\ue001)"
)
"""Matches a token as ``json.dumps`` writes it inside a JSON string, with ``ensure_ascii``
(group 1 is ``\\ue000``) or without (group 1 is the character); groups 2 and 3: the mode,
and ``spec|ref`` JSON-escaped. Compiled by the tracer, as `TOKEN_REGEX`."""


def placeholder(ref: str, mode: str = "s", spec: str = "") -> str:
    """Returns the token that stands for the text of ``ref`` inside a traced string."""
    return f"{_TOKEN_OPEN}{mode}|{spec}|{ref}{_TOKEN_CLOSE}"


class ValueRef:
    """A reference to a graph node's result inside a recorded node's arguments.

    Execution replaces each ``ValueRef`` by the payload the referenced node
    produced; keeping it a distinct type avoids confusing node ids with string
    literals that happen to look like them. Immutable, equal and hashed by
    ``ref``. (Written out rather than a dataclass: ``dataclasses`` loads
    `inspect`, a fifth of ``import plait``.)
    """

    __slots__ = ("ref",)
    __match_args__ = ("ref",)
    ref: str

    def __init__(self, ref: str) -> None:
        object.__setattr__(self, "ref", ref)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        _refuse_change(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        _refuse_change(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self.ref == other.ref
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.ref,))

    def __repr__(self) -> str:
        return f"{type(self).__qualname__}(ref={self.ref!r})"

    def __reduce__(self) -> tuple[type[ValueRef], tuple[str]]:
        # Pickles and copies are rebuilt through ``__init__``, past the refusing ``__setattr__``.
        return type(self), (self.ref,)


def _refuse_change(message: str) -> NoReturn:
    """Raises what changing a frozen dataclass raises (``FrozenInstanceError``)."""
    import dataclasses  # import time: only a refused change needs it

    raise dataclasses.FrozenInstanceError(message)


class Value:
    """A payload plus its provenance.

    Attributes:
        kind: what the payload is (see `ValueKind`).
        payload: the data itself; `SYMBOLIC` while tracing.
        ref: id of the node (or ``param:<name>``) that produced it, if any.
        meta: facts about the payload (alias, usage, cache hit, ``_tape_ids`` …);
            a new dict when not given.

    Indexing goes through ``F.select`` so that, while tracing, ``value["k"]``
    records a node instead of failing. The class itself takes a type argument
    for annotations that say what a Value holds: ``-> Value[str]``, ``list[Value[T]]``.
    (A plain class, not a dataclass: ``dataclasses`` loads `inspect`, a fifth of
    ``import plait``.)
    """

    __match_args__ = ("kind", "payload", "ref", "meta")
    kind: ValueKind
    payload: Any
    ref: str | None
    meta: dict[str, Any]

    def __init__(
        self,
        kind: ValueKind,
        payload: Any,
        ref: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.kind = kind
        self.payload = payload
        self.ref = ref
        self.meta = {} if meta is None else meta

    # ``Value[str]`` annotates "a Value whose payload is a str"; like ``list[str]``
    # it is not checked at run time.
    def __class_getitem__(cls, item: Any) -> types.GenericAlias:
        return types.GenericAlias(cls, item)

    # ----------------------------------------------------------------- access
    @property
    def is_symbolic(self) -> bool:
        """Whether this value is a placeholder recorded by the tracer."""
        return self.payload is SYMBOLIC

    @property
    def is_error(self) -> bool:
        """Whether this value carries an error instead of data."""
        return self.kind is ValueKind.ERROR

    def __getitem__(self, key: Any) -> Value:
        return _functional().select(self, key)

    def __getattr__(self, name: str) -> Value:
        # Reached only when normal lookup fails: `reply.answer` on a traced or
        # structured value selects the field (one F.select node while tracing).
        payload = self.__dict__.get("payload")
        kind = self.__dict__.get("kind")
        if name.startswith("_") or not (payload is SYMBOLIC or kind is ValueKind.STRUCTURED):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return _functional().select(self, name)

    def get(self, key: Any, default: Any = None) -> Value:
        """Returns ``self[key]``, or ``default`` (as a Value) when the key is missing."""
        return _functional().select(self, key, default=default)

    # --------------------------------------------------------------- training
    async def backward(self, grad: Any = None, **options: Any) -> Any:
        """Sends feedback backward from this training-mode output (``await loss.backward()``).

        Also callable as ``await Value.backward(outputs, grad=feedback)`` for
        several outputs at once. See ``plait.optimization.training.backward``.
        """
        # late-bound upward call (ARCHITECTURE.md): the learning layer
        from plait.optimization.training.backward import backward

        return await backward(self, grad, **options)

    def detach_tape(self) -> None:
        """Releases the forward records of this output early (backward is then impossible)."""
        from plait.execution.tape import release_tape  # late-bound upward call (ARCHITECTURE.md)

        for tape_id in self.meta.pop("_tape_ids", []):
            release_tape(tape_id)

    # ------------------------------------------------------------- formatting
    def __str__(self) -> str:
        if self.payload is SYMBOLIC:
            return placeholder(self._token_ref())
        return str(self.payload)

    def __format__(self, spec: str) -> str:
        if self.payload is SYMBOLIC:
            return placeholder(self._token_ref(), "s", spec)
        return format(self.payload, spec)

    def __repr__(self) -> str:
        if self.payload is SYMBOLIC:
            # str(dict_of_traced_values) calls repr(); the token resolves to
            # repr(payload) at run time so traced and eager text are identical.
            return placeholder(self._token_ref(), "r")
        return f"Value({self.kind.value}, {self.payload!r}, ref={self.ref!r})"

    def _token_ref(self) -> str:
        if self.ref is None:
            raise ValueError("a symbolic Value without a ref cannot be formatted")
        return self.ref

    def __add__(self, other: Any) -> Any:
        if isinstance(other, str) and not isinstance(other, Value):
            return format(self) + other
        return _functional().add(self, other)

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, str) and not isinstance(other, Value):
            return other + format(self)
        return _functional().add(other, self)

    # ---------------------------------------------- decisions on unknown data
    def _refuse(self, action: str) -> None:
        if self.payload is SYMBOLIC:
            session = current_trace()
            if session is not None:
                session.fail(self, action)
            raise TracingError(f"a traced value ({self.ref}) was used in {action} outside a trace")

    def __bool__(self) -> bool:
        self._refuse("an `if`/`while` condition or `bool()`")
        return bool(self.payload)

    def __len__(self) -> int:
        self._refuse("`len()`")
        return len(self.payload)

    def __iter__(self) -> Iterator[Any]:
        self._refuse("iteration (a `for` loop or unpacking)")
        return iter(self.payload)

    def __contains__(self, item: Any) -> bool:
        self._refuse("an `in` test")
        return item in self.payload

    def __int__(self) -> int:
        self._refuse("`int()`")
        return int(self.payload)

    def __float__(self) -> float:
        self._refuse("`float()`")
        return float(self.payload)

    def __index__(self) -> int:
        self._refuse("an index or slice")
        return self.payload.__index__()

    def __eq__(self, other: object) -> bool:
        self._refuse("an `==` comparison")
        if isinstance(other, Value):
            other._refuse("an `==` comparison")
            return (self.kind, self.payload, self.ref) == (other.kind, other.payload, other.ref)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        # Equality is by content, so Values are unhashable; a traced one must
        # still refuse with a TracingError (`reply in {"yes", "no"}` hashes first).
        self._refuse("a dict key, a set, or an `in` test on a dict or set")
        raise TypeError("unhashable type: 'Value'")


class TracedValue(Value, str):
    """A symbolic Value that is also a ``str`` whose text is its placeholder token.

    Being a ``str`` lets the traced value pass through APIs that accept only
    real strings, ``"".join([a, b])`` above all; the tracer later turns the
    tokens into a `Template`. Everything that would *decide* on the unknown
    text or fields (comparisons, ``len``, ``in``, string methods like ``.upper()``,
    mapping methods like ``.keys()``, which ``dict()`` calls) raises `TracingError`
    instead of silently working on the token.
    """

    # Always set: the constructor refuses a traced value without its node's ref.
    ref: str

    # Indexing selects from the unknown payload (an F.select node, a Value), never
    # a character of the placeholder token: str's contract is broken on purpose.
    __getitem__ = Value.__getitem__  # type: ignore[assignment]

    def __new__(
        cls, kind: ValueKind, payload: Any = SYMBOLIC, ref: str | None = None, meta: Any = None
    ) -> TracedValue:
        if ref is None:
            raise ValueError("a traced value needs the ref of the node that produces it")
        # Mode "v": where the value itself (not text made from it) lands in
        # `json.dumps`, its JSON replaces the whole string, so a dict stays an object.
        return str.__new__(cls, placeholder(ref, "v"))

    def __init__(
        self, kind: Any, payload: Any = SYMBOLIC, ref: str | None = None, meta: Any = None
    ) -> None:
        Value.__init__(self, kind, payload, ref, {} if meta is None else meta)

    def __str__(self) -> str:
        # ``str(reply)`` is text, like in eager code (a dict payload becomes its
        # str() inside ``json.dumps``, not an object): the ``s`` token.
        return _TextToken(self._token_ref(), "s")

    def __repr__(self) -> str:
        return _TextToken(self._token_ref(), "r")

    def __lt__(self, other: object) -> bool:
        self._refuse("a `<` comparison")
        return NotImplemented

    def __le__(self, other: object) -> bool:
        self._refuse("a `<=` comparison")
        return NotImplemented

    def __gt__(self, other: object) -> bool:
        self._refuse("a `>` comparison")
        return NotImplemented

    def __ge__(self, other: object) -> bool:
        self._refuse("a `>=` comparison")
        return NotImplemented


class _TextToken(str):
    """``str()`` or ``repr()`` of a traced value: its ``s`` or ``r`` token.

    ``f"{v!s:>30}"`` and ``f"{v!r:>30}"`` format what str() and repr() return;
    this keeps the format spec in the token instead of padding the token's text.
    """

    __slots__ = ("mode", "ref")
    mode: str
    ref: str

    def __new__(cls, ref: str, mode: str) -> _TextToken:
        token = str.__new__(cls, placeholder(ref, mode))
        token.ref = ref
        token.mode = mode
        return token

    def __format__(self, spec: str) -> str:
        return placeholder(self.ref, self.mode, spec) if spec else str.__str__(self)


class _FieldOrMethod(TracedValue):
    """``reply.title`` on a traced value: the field ``title``, unless it is called.

    A traced value is a ``str``, so names like ``title``, ``count`` or ``index``
    would otherwise resolve to string methods; ``keys``, ``items``, ``values``
    and ``to_dict`` are what a `Prediction` (or any mapping) is read with, and
    ``dict(reply)`` calls ``reply.keys()``. Reading one selects the field (an
    ``F.select`` node, like any other attribute); calling it is a method on unknown
    text or fields, which is refused.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self.__dict__.get("_method_name", "?")
        # Refused on behalf of the value whose method it is, so the error names
        # that value's node, not the F.select that reading the name recorded.
        owner = symbolic(self.kind, self.__dict__.get("_owner_ref", self.ref))
        owner._refuse(_refused_call(name))


_MAPPING_METHODS = ("items", "keys", "to_dict", "values")
"""The methods a mapping's fields are read with; while tracing the fields are unknown."""


def _refused_call(name: str) -> str:
    """Returns what calling method ``name`` of a traced value does, and what to write instead."""
    if name not in _MAPPING_METHODS:
        hint = f" (use F.{name})" if name in {"strip", "lower", "upper"} else ""
        return f"the string method `.{name}()`{hint}"
    what = (
        "`dict()` or the mapping method `.keys()`"
        if name == "keys"
        else f"the mapping method `.{name}()`"
    )
    return (
        f"{what} (the fields are known only at run time: return the value itself, whose "
        'fields stay fields, or pick them by name: {"answer": value.answer})'
    )


def _field_or_method(name: str) -> property:
    def select(self: TracedValue) -> Any:
        selected = _functional().select(self, name)
        if not isinstance(selected, TracedValue):  # defensive: selection outside a trace
            return selected
        field = _FieldOrMethod(selected.kind, SYMBOLIC, ref=selected.ref)
        field.__dict__["_method_name"] = name
        field.__dict__["_owner_ref"] = self.ref
        return field

    return property(select, doc=f"The field {name!r} of the traced value (not the method).")


for _name in (*dir(str), *_MAPPING_METHODS):
    if not _name.startswith("_") and _name not in vars(Value):
        setattr(TracedValue, _name, _field_or_method(_name))
del _name


def symbolic(kind: ValueKind, ref: str) -> TracedValue:
    """Returns the traced value produced by node (or input, or parameter) ``ref``."""
    return TracedValue(kind, SYMBOLIC, ref=ref)


def is_symbolic(x: Any) -> bool:
    """Whether ``x`` is a symbolic (traced) value."""
    return isinstance(x, Value) and x.payload is SYMBOLIC


def error_value(
    error: BaseException | str, *, op: str | None = None, sources: list[str] | None = None
) -> Value:
    """Returns ``Value(ERROR)`` carrying ``error`` and where it came from.

    Args:
        error: the exception, or a message (wrapped in ``ValueError``).
        op: name of the operation that failed (``F.select``).
        sources: refs of the inputs the operation read.
    """
    exc = ValueError(error) if isinstance(error, str) else error
    meta: dict[str, Any] = {"error_type": type(exc).__name__, "message": str(exc)}
    if op is not None:
        meta["op"] = op
    if sources:
        meta["sources"] = list(sources)
    if exc.__traceback__ is not None:
        import traceback  # import time: (and textwrap) only once something failed

        meta["traceback"] = "".join(traceback.format_exception(exc))
    return Value(ValueKind.ERROR, exc, meta=meta)


def first_error(x: Any) -> Value | None:
    """Returns the first error Value inside ``x`` (a Value or nested containers), or None."""
    if isinstance(x, Value):
        if x.kind is ValueKind.ERROR:
            return x
        x = x.payload
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, list | tuple):
        for item in x:
            found = first_error(item)
            if found is not None:
                return found
    return None


def _infer_kind(x: Any) -> ValueKind:
    if isinstance(x, str):
        return ValueKind.TEXT
    if isinstance(x, bool) or x is None:
        return ValueKind.OTHER
    if isinstance(x, int):
        return ValueKind.INT
    if isinstance(x, float):
        return ValueKind.FLOAT
    if isinstance(x, BaseException):
        return ValueKind.ERROR
    if isinstance(x, bytes | bytearray | memoryview):
        return ValueKind.BINARY
    if isinstance(x, dict | list | tuple) or _is_model_instance(x):
        return ValueKind.STRUCTURED
    return ValueKind.OTHER


def _is_model_instance(x: Any) -> bool:
    """Whether ``x`` is a pydantic model or dataclass instance (structured data)."""
    # A dataclass exists only once `dataclasses` is loaded, which ``import plait`` does not do.
    dataclasses = sys.modules.get("dataclasses")
    if dataclasses is not None and dataclasses.is_dataclass(x) and not isinstance(x, type):
        return True
    return hasattr(type(x), "model_fields") and hasattr(x, "model_dump")


def _lift_parameter(param: Any, kind: ValueKind | None) -> Value:
    session = current_trace()
    # Inside a trace, names are relative to the traced program (the graph's
    # parameter table); outside, the dotted path from the root of the tree.
    ref = session.param_ref(param) if session is not None else f"param:{param.path}"
    if kind is None:
        kind = ValueKind.TEXT if isinstance(param.value, str) else ValueKind.STRUCTURED
    meta = {"param_name": ref[6:], "param_id": id(param)}
    if session is not None:
        traced = symbolic(kind, ref)
        traced.meta.update(meta)
        return traced
    return Value(kind, param.value, ref=ref, meta=meta)


def valueify(x: Any, *, kind: ValueKind | None = None) -> Any:
    """Wraps raw data into Values; a list or tuple is a batch, each element wrapped.

    Lists and tuples keep their shape and each element becomes a Value. A
    dict is one record: a ``Value(STRUCTURED)`` holding it, so that
    ``valueify({"user": {"name": "Ada"}})["user"]["name"]`` selects through
    ``F.select`` (one node per ``[]`` while tracing), so a nested record reads naturally.
    Pass ``kind`` to wrap anything, a list too, as one Value of that kind. A
    `Parameter` is lifted to a Value whose ref is ``param:<dotted.name>``
    (of kind ``kind`` when given). Values pass through unchanged (``kind``
    re-labels them).
    """
    if isinstance(x, Value):
        return x if kind is None or kind is x.kind else type(x)(kind, x.payload, x.ref, x.meta)
    if getattr(x, "_is_plait_parameter", False):
        return _lift_parameter(x, kind)
    if kind is not None:
        if isinstance(x, BaseException) or kind is ValueKind.ERROR:
            return error_value(x if isinstance(x, BaseException) else str(x))
        return Value(kind, x)
    if isinstance(x, list):
        return [valueify(item) for item in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(valueify(item) for item in x)
    if isinstance(x, BaseException):
        return error_value(x)
    return Value(_infer_kind(x), x)


def unwrap(x: Any) -> Any:
    """Returns raw payloads: a Value's payload, containers mapped element-wise."""
    if isinstance(x, Value):
        return unwrap(x.payload) if isinstance(x.payload, list | tuple | dict) else x.payload
    if isinstance(x, list):
        return [unwrap(item) for item in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(unwrap(item) for item in x)
    if isinstance(x, dict):
        return {key: unwrap(item) for key, item in x.items()}
    return x


def collect_refs(*args: Any, **kwargs: Any) -> list[str]:
    """Returns the refs of Values and ValueRefs in nested args, in first-seen order, once each."""
    seen: dict[str, None] = {}
    _collect(args, seen)
    _collect(kwargs, seen)
    return list(seen)


def _collect(x: Any, seen: dict[str, None]) -> None:
    if isinstance(x, Value):
        if x.ref is not None:
            seen.setdefault(x.ref, None)
        if isinstance(x.payload, list | tuple | dict):
            _collect(x.payload, seen)
    elif isinstance(x, ValueRef):
        seen.setdefault(x.ref, None)
    elif isinstance(x, list | tuple):
        for item in x:
            _collect(item, seen)
    elif isinstance(x, dict):
        for item in x.values():
            _collect(item, seen)


def _functional() -> types.ModuleType:
    """`plait.functional`, whose ops (`select`, `add`) `value[...]`, `.field` and `+` record."""
    from plait import functional  # late-bound upward call (ARCHITECTURE.md): ops sit above values

    return functional
