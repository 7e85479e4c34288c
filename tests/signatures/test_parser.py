"""The string-signature parser: types, errors with positions, and never any other exception."""

import enum
import re
from typing import Literal, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from plait.backends.types import Response
from plait.errors import PlaitError
from plait.signatures import JSONAdapter, Signature, SignatureSyntaxError, parse_signature


@pytest.mark.parametrize(
    ("text", "annotation"),
    [
        ("a: str", str),
        ("a: int", int),
        ("a:float", float),
        ("a :  bool", bool),
        ("a: list[str]", list[str]),
        ("a: list", list),
        ("a: dict[str, int]", dict[str, int]),
        ("a: dict[str, list[int]]", dict[str, list[int]]),
        ("a: Literal['x', \"y\"]", Literal["x", "y"]),
        ("a: Literal[1, 2.5, True, None]", Literal[1, 2.5, True, None]),
        ("a: Literal['a, b', 'c -> d']", Literal["a, b", "c -> d"]),
        ("a: Literal['it\\'s']", Literal["it's"]),
        ("a: Optional[int]", Optional[int]),  # noqa: UP045
        ("a: int | None", int | None),
        ("a: list[Literal['x']] | None", list[Literal["x"]] | None),
    ],
)
def test_output_types(text, annotation):
    _, outputs = parse_signature(f"q -> {text}")
    assert outputs == [("a", annotation)]


def test_fields_keep_their_order_and_whitespace_is_free():
    inputs, outputs = parse_signature("  context ,question->answer:str,\n\tconfidence : float ")
    assert inputs == [("context", str), ("question", str)]
    assert outputs == [("answer", str), ("confidence", float)]


@pytest.mark.parametrize(
    ("text", "message", "position"),
    [
        ("", "empty signature", 0),
        ("question answer -> x", "expected ',' or ':' after the field name 'question'", 9),
        ("question", "missing '->'", 8),
        ("a -> b -> c", "exactly one '->'", 7),
        ("-> answer", "no input fields before '->'", 0),
        ("question ->", "no output fields after '->'", 11),
        ("a,, b -> c", "empty input field", 1),
        ("a -> b,", "empty output field", 6),
        ("a -> a", "duplicate field 'a'", 5),
        ("a, b -> c, b", "duplicate field 'b'", 11),
        ("my-field -> x", "'my-field' is not a valid field name", 0),
        ("a -> 2x", "'2x' is not a valid field name", 5),
        ("a -> for", "'for' is a Python keyword", 5),
        ("a -> _x", "may not start with '_'", 5),
        ("a -> : int", "missing field name before ':'", 5),
        ("a -> b:", "expected a type after ':'", 6),
        ("a -> b: strng", "unknown type 'strng'", 8),
        ("a -> b: list[str", "'[' is never closed", 12),
        ("a -> b: str]", "']' has no matching '['", 11),
        ("a -> b: Literal['x", "string is never closed", 16),
        ("a -> b: Literal[]", "expected a quoted string", 16),
        ("a -> b: Literal", "Literal needs its values", 8),
        ("a -> b: Literal[x]", "expected a quoted string", 16),
        ("a -> b: str[int]", "str takes no type arguments", 11),
        ("a -> b: list[str, int]", "list takes one type argument", 8),
        ("a -> b: dict[str]", "dict takes two type arguments", 8),
        ("a -> b: Optional", "Optional takes one type argument", 8),
        ("a -> b: int int", "unexpected 'int' after the type", 12),
        ("a -> b: int @", "unexpected '@'", 12),
        ("a -> b: list[]", "expected a type, got ']'", 13),
    ],
)
def test_errors_name_the_problem_and_its_position(text, message, position):
    with pytest.raises(SignatureSyntaxError) as info:
        parse_signature(text)
    error = info.value
    assert message in str(error)
    assert error.position == position, str(error)
    assert error.text == text


def test_the_message_shows_the_text_with_a_caret():
    with pytest.raises(SignatureSyntaxError) as info:
        Signature.from_string("question -> answer: strng")
    assert str(info.value) == (
        "unknown type 'strng'; types are: str, int, float, bool, list[T], dict[K, V], "
        "Literal['a', 'b'], Optional[T], T | None (at position 20)\n"
        "    question -> answer: strng\n"
        "                        ^"
    )


def test_error_is_a_plait_error_and_a_value_error():
    with pytest.raises(PlaitError):
        parse_signature("nope")
    with pytest.raises(ValueError):
        parse_signature("nope")


def test_a_non_string_is_a_type_error():
    with pytest.raises(TypeError, match="signature string"):
        parse_signature(42)  # type: ignore[arg-type]


def test_deep_nesting_and_huge_numbers_are_syntax_errors():
    with pytest.raises(SignatureSyntaxError, match="nested too deeply"):
        parse_signature("a -> b: " + "list[" * 40 + "str" + "]" * 40)
    with pytest.raises(SignatureSyntaxError, match="too long"):
        parse_signature("a -> b: Literal[" + "9" * 5000 + "]")


# ---------------------------------------------------------------- property
def _parses_or_syntax_error(text: str) -> None:
    try:
        parse_signature(text)
    except SignatureSyntaxError as exc:
        assert 0 <= exc.position <= len(text)
        assert exc.text == text
        str(exc)  # renders


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_random_text_only_ever_raises_signature_syntax_error(text):
    _parses_or_syntax_error(text)


NAMES = st.sampled_from(["a", "question", "x1", "_p", "1a", "for", "my-f", "ä", "", " "])
SCALARS = st.sampled_from(["str", "int", "float", "bool", "None", "strng", "Literal", "list", ""])
LITERALS = st.sampled_from(["'a'", '"b"', "1", "-2.5e3", "True", "None", "'", "x", "9" * 30])
PUNCT = st.sampled_from(["", ",", "[", "]", "|", ":", "->", " ", "'", '"', "\\"])


@st.composite
def types(draw, depth=0):
    kind = draw(st.integers(0, 4 if depth < 3 else 0))
    if kind == 0:
        return draw(SCALARS)
    if kind == 1:
        return f"list[{draw(types(depth + 1))}]"
    if kind == 2:
        return f"dict[{draw(types(depth + 1))}, {draw(types(depth + 1))}]"
    if kind == 3:
        values = draw(st.lists(LITERALS, min_size=0, max_size=3))
        return f"Literal[{', '.join(values)}]"
    return f"{draw(types(depth + 1))} | {draw(types(depth + 1))}"


@st.composite
def fields(draw):
    name = draw(NAMES)
    return f"{name}: {draw(types())}" if draw(st.booleans()) else name


@st.composite
def near_valid(draw):
    left = draw(st.lists(fields(), min_size=0, max_size=3))
    right = draw(st.lists(fields(), min_size=0, max_size=3))
    text = f"{', '.join(left)} -> {', '.join(right)}"
    for _ in range(draw(st.integers(0, 3))):  # mutate: insert or delete a character
        at = draw(st.integers(0, len(text)))
        if draw(st.booleans()):
            text = text[:at] + draw(PUNCT) + text[at:]
        else:
            text = text[:at] + text[at + 1 :]
    return text


@settings(max_examples=600, deadline=None)
@given(near_valid())
def test_near_valid_text_only_ever_raises_signature_syntax_error(text):
    _parses_or_syntax_error(text)


@settings(max_examples=200, deadline=None)
@given(near_valid())
def test_whatever_parses_builds_a_signature(text):
    try:
        parse_signature(text)
    except SignatureSyntaxError:
        return
    sig = Signature.from_string(text)
    assert sig.signature_text().count("->") == 1


def test_dsprrr_type_words_are_synonyms():
    _, outputs = parse_signature(
        "text -> s: string, n: integer, x: number, ok: boolean, tags: list[string], "
        "label: enum('a', 'b, c'), other: enum[1, 2]"
    )
    assert [annotation for _, annotation in outputs] == [
        str, int, float, bool, list[str], Literal["a", "b, c"], Literal[1, 2]
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message", "position"),
    [
        ("a -> b: enum", "enum needs its values", 8),
        ("a -> b: enum(", "this '(' is never closed", 12),
        ("a -> b: enum('x']", "this ']' has no matching '['", 16),
        ("a -> b)", "this ')' has no matching '('", 6),
    ],
)
def test_enum_errors_name_the_problem_and_its_position(text, message, position):
    with pytest.raises(SignatureSyntaxError) as info:
        parse_signature(text)
    assert message in str(info.value) and info.value.position == position


# ---------------------------------------------------------------- your own types
class Order(BaseModel):
    customer: str
    items: int


class Urgency(enum.Enum):
    LOW = "low"
    HIGH = "high"


def test_a_pydantic_model_or_enum_is_named_through_types():
    sig = Signature.from_string(
        "text -> order: Order, orders: list[Order] | None, urgency: Urgency",
        types={"Order": Order, "Urgency": Urgency},
    )

    annotations = {name: spec.annotation for name, spec in sig.output_fields.items()}
    assert annotations == {"order": Order, "orders": list[Order] | None, "urgency": Urgency}
    reply = Response(text='{"order": {"customer": "ann", "items": 2}, "orders": null, '
                          '"urgency": "high"}')  # fmt: skip
    parsed = JSONAdapter().parse(sig, reply)
    assert parsed["order"] == Order(customer="ann", items=2)
    assert parsed["urgency"] is Urgency.HIGH


def test_an_unknown_class_name_says_how_to_name_it():
    with pytest.raises(SignatureSyntaxError) as info:
        Signature.from_string("text -> order: Order")
    assert str(info.value).startswith(
        "unknown type 'Order'; types are: str, int, float, bool, list[T], dict[K, V], "
        "Literal['a', 'b'], Optional[T], T | None; for a class of your own (a pydantic "
        "model, an enum), pass types={'Order': Order} to Signature.from_string (at position 15)"
    )


@pytest.mark.parametrize(
    ("types", "error", "message"),
    [
        ({"Order": "Order"}, TypeError, "types['Order'] must be a class"),
        ({"str": Order}, ValueError, "types: 'str' is a type word of string signatures"),
        ({"my order": Order}, ValueError, "types: 'my order' is not a name"),
    ],
)
def test_a_wrong_types_argument_names_the_entry(types, error, message):
    with pytest.raises(error, match=re.escape(message)):
        Signature.from_string("text -> order: Order", types=types)


def test_your_own_type_takes_no_type_arguments():
    with pytest.raises(SignatureSyntaxError, match="Order takes no type arguments"):
        parse_signature("a -> b: Order[int]", types={"Order": Order})
