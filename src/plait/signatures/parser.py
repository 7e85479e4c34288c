"""The parser of string signatures: ``"context, question -> answer: str, score: float"``.

Grammar (whitespace is free between tokens)::

    signature := fields "->" fields
    fields    := field ("," field)*
    field     := NAME (":" type)?            an untyped field is ``str``
    type      := atom ("|" atom)*
    atom      := "str" | "int" | "float" | "bool" | "None" | a name given in ``types``
               | "list" ("[" type "]")?  | "dict" ("[" type "," type "]")?
               | "Optional" "[" type "]" | "Literal" "[" literal ("," literal)* "]"
               | "enum" "(" literal ("," literal)* ")"
    literal   := 'text' | "text" | number | True | False | None

A class of your own (a pydantic model, an enum, a dataclass) is a type too
when it is named in ``types``: ``parse_signature("text -> order: Order",
types={"Order": Order})``; it may stand wherever an atom does (``list[Order]``,
``Order | None``). Names are given, never looked up in the caller's globals,
so what a string means never depends on where it is written.

JSON-schema-like type words are synonyms:
``string`` is ``str``, ``integer`` ``int``, ``number`` ``float``, ``boolean``
``bool``, and ``enum('a', 'b')`` (or ``enum['a', 'b']``) is ``Literal['a', 'b']``.

It works in two passes: a scan that finds the arrow, the commas and colons
outside brackets and quotes (so ``Literal['a, b']`` is one field), then a
small recursive-descent parser per type. Whatever the input string, the only
exception it raises is `SignatureSyntaxError`, which carries the position
and shows the text with a caret under it; a property test holds it to that.
"""

from __future__ import annotations

import keyword
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from plait.errors import PlaitError

__all__ = ["SUPPORTED_TYPES", "SignatureSyntaxError", "parse_signature"]

SUPPORTED_TYPES = (
    "str, int, float, bool, list[T], dict[K, V], Literal['a', 'b'], Optional[T], T | None"
)

_MAX_DEPTH = 12
_SCALARS: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    # JSON-schema-like words for the same types
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
}
_CLOSING = {"[": "]", "(": ")"}
_WORDS = frozenset(
    {*_SCALARS, "list", "dict", "Optional", "Literal", "enum", "None", "True", "False"}
)
"""The names the grammar gives a meaning; a type of your own cannot take one of them."""


class SignatureSyntaxError(PlaitError, ValueError):
    """A string signature is malformed.

    Attributes:
        reason: what is wrong, in a few words.
        text: the whole signature text.
        position: 0-based index into ``text`` where the problem is.
    """

    def __init__(self, reason: str, text: str, position: int) -> None:
        self.reason = reason
        self.text = text
        self.position = position
        super().__init__(_render(reason, text, position))


def _render(reason: str, text: str, position: int) -> str:
    start = text.rfind("\n", 0, position) + 1
    end = text.find("\n", position)
    line = text[start : len(text) if end < 0 else end]
    column = position - start
    if len(line) > 80:  # show a window around the caret
        first = max(0, min(column - 40, len(line) - 80))
        line, column = line[first : first + 80], column - first
    shown = "".join(c if c.isprintable() else " " for c in line)
    return f"{reason} (at position {position})\n    {shown}\n    {' ' * column}^"


# ------------------------------------------------------------------ scan
@dataclass(slots=True)
class _Scan:
    arrows: list[int]
    commas: list[int]
    colons: list[int]


def _fail(reason: str, text: str, position: int) -> NoReturn:
    raise SignatureSyntaxError(reason, text, position)


def _string_end(text: str, start: int) -> int:
    """Returns the index after the string literal opening at ``start``."""
    quote = text[start]
    i = start + 1
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == quote:
            return i + 1
        i += 1
    _fail("this string is never closed", text, start)


def _scan(text: str) -> _Scan:
    """Finds the arrows, commas and colons that are outside brackets and quotes."""
    found = _Scan([], [], [])
    open_brackets: list[int] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char in "'\"":
            i = _string_end(text, i)
            continue
        if char in _CLOSING:
            open_brackets.append(i)
        elif char in ")]":
            if not open_brackets or _CLOSING[text[open_brackets[-1]]] != char:
                opening = "[" if char == "]" else "("
                _fail(f"this {char!r} has no matching {opening!r}", text, i)
            open_brackets.pop()
        elif not open_brackets:
            if text.startswith("->", i):
                found.arrows.append(i)
                i += 2
                continue
            if char == ",":
                found.commas.append(i)
            elif char == ":":
                found.colons.append(i)
        i += 1
    if open_brackets:
        _fail(f"this {text[open_brackets[-1]]!r} is never closed", text, open_brackets[-1])
    return found


# ----------------------------------------------------------------- fields
def parse_signature(
    text: str, types: Mapping[str, type] | None = None
) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """Returns ``(inputs, outputs)``, each a list of ``(name, annotation)`` in order.

    Args:
        text: ``"inputs -> outputs"``.
        types: classes of your own by the name the text gives them, e.g.
            ``{"Order": Order}`` for ``"text -> order: Order"``.

    Raises:
        SignatureSyntaxError: the text is malformed (its message shows where).
        TypeError: ``text`` is not a string, or a value of ``types`` is not a class.
        ValueError: a name in ``types`` is not an identifier, or is a type word
            of the grammar (``str``, ``list`` …).
    """
    if not isinstance(text, str):
        raise TypeError(f"a signature string is needed, got {type(text).__name__}")
    own = _own_types(types)
    if not text.strip():
        _fail("empty signature; expected 'inputs -> outputs', e.g. 'question -> answer'", text, 0)
    scan = _scan(text)
    if not scan.arrows:
        _fail("missing '->' between the inputs and the outputs", text, len(text))
    if len(scan.arrows) > 1:
        _fail("a signature has exactly one '->'; this is a second one", text, scan.arrows[1])
    arrow = scan.arrows[0]
    seen: dict[str, int] = {}
    inputs = _side(text, scan, 0, arrow, "input", seen, own)
    outputs = _side(text, scan, arrow + 2, len(text), "output", seen, own)
    return inputs, outputs


def _own_types(types: Mapping[str, type] | None) -> dict[str, type]:
    """Returns ``types`` checked: identifiers that are no type word, each naming a class."""
    own = dict(types or {})
    for name, annotation in own.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(
                f"types: {name!r} is not a name a signature can use; use an identifier"
            )
        if name in _WORDS:
            raise ValueError(
                f"types: {name!r} is a type word of string signatures; name your class otherwise"
            )
        if not isinstance(annotation, type):
            raise TypeError(
                f"types[{name!r}] must be a class (a pydantic model, an enum, a dataclass), "
                f"got {type(annotation).__name__} {annotation!r:.60}"
            )
    return own


def _side(
    text: str,
    scan: _Scan,
    start: int,
    end: int,
    kind: str,
    seen: dict[str, int],
    own: dict[str, type],
) -> list[tuple[str, Any]]:
    if not text[start:end].strip():
        where = "before" if kind == "input" else "after"
        at = start if kind == "input" else end
        _fail(f"no {kind} fields {where} '->'", text, min(at, len(text)))
    commas = [c for c in scan.commas if start <= c < end]
    bounds = [start, *(c + 1 for c in commas)], [*commas, end]
    fields = []
    for seg_start, seg_end in zip(*bounds, strict=True):
        if not text[seg_start:seg_end].strip():
            at = seg_start - 1 if seg_start > start else seg_end
            _fail(f"empty {kind} field: a comma with no field next to it", text, at)
        fields.append(_field(text, scan, seg_start, seg_end, seen, own))
    return fields


def _field(
    text: str, scan: _Scan, start: int, end: int, seen: dict[str, int], own: dict[str, type]
) -> tuple[str, Any]:
    colon = next((c for c in scan.colons if start <= c < end), None)
    name_end = end if colon is None else colon
    raw = text[start:name_end]
    name = raw.strip()
    at = start + (len(raw) - len(raw.lstrip()))
    if not name:
        _fail("missing field name before ':'", text, colon if colon is not None else start)
    words = name.split()
    if len(words) > 1:
        second = at + name.index(words[1], len(words[0]))
        _fail(f"expected ',' or ':' after the field name {words[0]!r}", text, second)
    _check_name(text, name, at, seen)
    if colon is None:
        return name, str
    if not text[colon + 1 : end].strip():
        _fail(f"expected a type after ':' for field {name!r}", text, colon)
    return name, _TypeParser(text, colon + 1, end, own).parse()


def _check_name(text: str, name: str, at: int, seen: dict[str, int]) -> None:
    if not name.isidentifier():
        _fail(
            f"{name!r} is not a valid field name: use letters, digits and '_', "
            "not starting with a digit",
            text,
            at,
        )
    if keyword.iskeyword(name):
        _fail(f"{name!r} is a Python keyword and cannot be a field name", text, at)
    if name.startswith("_"):
        _fail(f"field names may not start with '_' (got {name!r})", text, at)
    if name in seen:
        _fail(f"duplicate field {name!r} (first at position {seen[name]})", text, at)
    seen[name] = at


# ------------------------------------------------------------------ types
_TOKEN = re.compile(
    r"""\s*(?:
      (?P<name>[^\W\d]\w*)
    | (?P<number>[-+]?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)
    | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    | (?P<punct>[\[\](),|])
    )""",
    re.VERBOSE | re.DOTALL,
)
_SPACE = re.compile(r"\s*")


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # name, number, string, punct, end
    text: str
    position: int


def _tokens(text: str, start: int, end: int) -> list[_Token]:
    out: list[_Token] = []
    i = start
    while True:
        space = _SPACE.match(text, i, end)
        i = space.end() if space else i
        if i >= end:
            out.append(_Token("end", "", end))
            return out
        match = _TOKEN.match(text, i, end)
        if match is None or match.lastgroup is None:
            _fail(f"unexpected {text[i]!r} in a type; types are: {SUPPORTED_TYPES}", text, i)
        kind = match.lastgroup
        out.append(_Token(kind, match.group(kind), match.start(kind)))
        i = match.end()


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"'}


def _unquote(literal: str) -> str:
    body = literal[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append(_ESCAPES.get(nxt, "\\" + nxt))
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


class _TypeParser:
    """Recursive descent over the tokens of one field's type."""

    def __init__(self, text: str, start: int, end: int, own: dict[str, type]) -> None:
        self.text = text
        self.tokens = _tokens(text, start, end)
        self.index = 0
        self.own = own

    def parse(self) -> Any:
        annotation = self._union(0)
        token = self._peek()
        if token.kind != "end":
            self._fail(f"unexpected {token.text!r} after the type", token)
        return annotation

    # ------------------------------------------------------------ helpers
    def _peek(self) -> _Token:
        return self.tokens[self.index]

    def _next(self) -> _Token:
        token = self.tokens[self.index]
        if token.kind != "end":
            self.index += 1
        return token

    def _fail(self, reason: str, token: _Token) -> NoReturn:
        _fail(reason, self.text, token.position)

    def _expect(self, punct: str, what: str) -> _Token:
        token = self._next()
        if token.text != punct or token.kind != "punct":
            self._fail(f"expected {punct!r} {what}, got {_describe(token)}", token)
        return token

    def _is(self, punct: str) -> bool:
        token = self._peek()
        return token.kind == "punct" and token.text == punct

    # ------------------------------------------------------------ grammar
    def _union(self, depth: int) -> Any:
        members = [self._atom(depth)]
        while self._is("|"):
            self._next()
            members.append(self._atom(depth))
        if len(members) == 1:
            return members[0]
        return typing.Union[tuple(members)]  # noqa: UP007 - members are built at run time

    def _atom(self, depth: int) -> Any:
        token = self._next()
        if depth > _MAX_DEPTH:
            self._fail("type nested too deeply", token)
        if token.kind != "name":
            self._fail(
                f"expected a type, got {_describe(token)}; types are: {SUPPORTED_TYPES}", token
            )
        name = token.text
        if name == "None":
            return type(None)
        if name == "Literal":
            return self._literal(token)
        if name == "enum":
            return self._enum(token)
        if name in _SCALARS or name in self.own:
            if self._is("["):
                self._fail(f"{name} takes no type arguments", self._peek())
            return _SCALARS[name] if name in _SCALARS else self.own[name]
        if name not in ("list", "dict", "Optional"):
            self._fail(f"unknown type {name!r}; types are: {SUPPORTED_TYPES}{_hint(name)}", token)
        args = self._arguments(depth) if self._is("[") else []
        return self._generic(name, args, token)

    def _arguments(self, depth: int) -> list[Any]:
        self._expect("[", "to open the type arguments")
        args = [self._union(depth + 1)]
        while self._is(","):
            self._next()
            args.append(self._union(depth + 1))
        self._expect("]", "to close the type arguments")
        return args

    def _generic(self, name: str, args: list[Any], token: _Token) -> Any:
        if name == "list":
            if len(args) > 1:
                self._fail(f"list takes one type argument (list[T]), got {len(args)}", token)
            return types.GenericAlias(list, args[0]) if args else list
        if name == "dict":
            if len(args) not in (0, 2):
                self._fail(f"dict takes two type arguments (dict[K, V]), got {len(args)}", token)
            return types.GenericAlias(dict, (args[0], args[1])) if args else dict
        if len(args) != 1:
            self._fail("Optional takes one type argument: Optional[T]", token)
        return typing.Optional[args[0]]  # noqa: UP045 - built at run time

    def _literal(self, token: _Token) -> Any:
        if not self._is("["):
            self._fail("Literal needs its values: Literal['a', 'b']", token)
        self._next()
        values = [self._literal_value()]
        while self._is(","):
            self._next()
            values.append(self._literal_value())
        self._expect("]", "to close Literal[...]")
        return Literal[tuple(values)]

    def _enum(self, token: _Token) -> Any:
        """Returns ``enum('a', 'b')`` (or ``enum['a', 'b']``) as ``Literal['a', 'b']``."""
        opening = self._peek()
        if opening.kind != "punct" or opening.text not in _CLOSING:
            self._fail("enum needs its values: enum('a', 'b')", token)
        self._next()
        values = [self._literal_value()]
        while self._is(","):
            self._next()
            values.append(self._literal_value())
        self._expect(_CLOSING[opening.text], "to close enum(...)")
        return Literal[tuple(values)]

    def _literal_value(self) -> Any:
        token = self._next()
        if token.kind == "string":
            return _unquote(token.text)
        if token.kind == "number":
            try:
                if any(c in token.text for c in ".eE"):
                    return float(token.text)
                return int(token.text)
            except ValueError:  # more digits than int() accepts
                self._fail("this number is too long", token)
        if token.kind == "name" and token.text in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[token.text]
        self._fail(
            f"expected a quoted string, a number, True, False or None, got {_describe(token)}",
            token,
        )


def _hint(name: str) -> str:
    """Returns how to name a class of your own, when ``name`` looks like a class."""
    if not name[0].isupper():
        return ""  # most likely a misspelt type word
    return (
        "; for a class of your own (a pydantic model, an enum), pass "
        f"types={{{name!r}: {name}}} to Signature.from_string"
    )


def _describe(token: _Token) -> str:
    return "the end of the field" if token.kind == "end" else repr(token.text)
