"""Tests of plait.values: Value, ValueKind, ValueRef, valueify, unwrap, collect_refs, errors."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import pydantic
import pytest

from plait import LLMInference, Module, Parameter, TracingError
from plait.tracing import Tracer
from plait.tracing.tracer import TOKEN_PATTERN
from plait.values import (
    SYMBOLIC,
    Value,
    ValueKind,
    ValueRef,
    collect_refs,
    error_value,
    is_symbolic,
    placeholder,
    unwrap,
    valueify,
)


class Person(pydantic.BaseModel):
    name: str
    age: int


@dataclasses.dataclass
class Point:
    x: int
    y: int


# ------------------------------------------------------------------ ValueKind
def test_value_kind_has_the_ten_kinds_of_the_seed() -> None:
    assert {k.name: k.value for k in ValueKind} == {
        "TEXT": "text",
        "FSTRING": "fstring",
        "RESPONSE": "response",
        "STRUCTURED": "structured",
        "INT": "int",
        "FLOAT": "float",
        "ERROR": "error",
        "TOOL_RESULT": "tool_result",
        "BINARY": "binary",
        "OTHER": "other",
    }


def test_value_kind_is_a_string() -> None:
    assert ValueKind.TEXT == "text"
    assert f"{ValueKind.STRUCTURED}" == "structured"


# ------------------------------------------------------------------- valueify
@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ("hello", ValueKind.TEXT),
        ("", ValueKind.TEXT),
        (3, ValueKind.INT),
        (-0, ValueKind.INT),
        (2.5, ValueKind.FLOAT),
        (b"\x00\x01", ValueKind.BINARY),
        (bytearray(b"ab"), ValueKind.BINARY),
        (True, ValueKind.OTHER),
        (False, ValueKind.OTHER),
        (None, ValueKind.OTHER),
        (Person(name="Ada", age=36), ValueKind.STRUCTURED),
        (Point(1, 2), ValueKind.STRUCTURED),
        (object(), ValueKind.OTHER),
    ],
    ids=lambda x: type(x).__name__ if not isinstance(x, ValueKind) else x.value,
)
def test_valueify_infers_kind_from_the_payload(raw: object, kind: ValueKind) -> None:
    value = valueify(raw)
    assert isinstance(value, Value)
    assert value.kind is kind
    assert value.payload is raw
    assert value.ref is None
    assert value.meta == {}


def test_valueify_does_not_treat_a_dataclass_type_as_structured_data() -> None:
    assert valueify(Point).kind is ValueKind.OTHER
    assert valueify(Person).kind is ValueKind.OTHER


def test_valueify_turns_a_raised_exception_into_an_error_with_its_traceback() -> None:
    try:
        raise KeyError("missing")
    except KeyError as exc:
        caught = exc
    value = valueify(caught)
    assert value.kind is ValueKind.ERROR
    assert value.is_error
    assert value.payload is caught
    assert value.meta["error_type"] == "KeyError"
    assert value.meta["message"] == "'missing'"
    assert "Traceback (most recent call last)" in value.meta["traceback"]
    assert "KeyError: 'missing'" in value.meta["traceback"]


def test_valueify_of_an_exception_never_raised_has_no_traceback() -> None:
    value = valueify(ValueError("bad"))
    assert value.kind is ValueKind.ERROR
    assert value.meta["message"] == "bad"
    assert "traceback" not in value.meta


def test_valueify_wraps_batches_element_wise_and_a_dict_as_one_record() -> None:
    wrapped = valueify(["x", 1, (2.0, None), {"c": b"z"}])
    assert isinstance(wrapped, list)
    assert [v.kind for v in wrapped[:2]] == [ValueKind.TEXT, ValueKind.INT]
    assert isinstance(wrapped[2], tuple)
    assert [v.kind for v in wrapped[2]] == [ValueKind.FLOAT, ValueKind.OTHER]
    assert (wrapped[3].kind, wrapped[3].payload) == (ValueKind.STRUCTURED, {"c": b"z"})
    assert unwrap(wrapped) == ["x", 1, (2.0, None), {"c": b"z"}]
    record = {"a": ["x", 1], "b": {"c": b"z"}}
    value = valueify(record)
    assert value.kind is ValueKind.STRUCTURED and value.payload is record
    assert value["b"]["c"].kind is ValueKind.BINARY and unwrap(value) == record


def test_valueify_wraps_a_namedtuple_whole_as_one_record() -> None:
    Pair = namedtuple("Pair", "left right")
    value = valueify(Pair("l", "r"))
    assert isinstance(value, Value)
    assert value.kind is ValueKind.STRUCTURED
    assert value.payload == Pair("l", "r")


@pytest.mark.parametrize("raw", [{"user": {"name": "Ada"}}, ["a", "b"], ("a", 1)])
def test_valueify_kind_override_wraps_the_whole_container(raw: object) -> None:
    value = valueify(raw, kind=ValueKind.STRUCTURED)
    assert isinstance(value, Value)
    assert value.kind is ValueKind.STRUCTURED
    assert value.payload is raw


def test_valueify_kind_override_labels_a_template() -> None:
    value = valueify("Summarize: {text}", kind=ValueKind.FSTRING)
    assert value.kind is ValueKind.FSTRING
    assert value.payload == "Summarize: {text}"


def test_valueify_error_kind_override_makes_an_error_value() -> None:
    value = valueify("it broke", kind=ValueKind.ERROR)
    assert value.kind is ValueKind.ERROR
    assert isinstance(value.payload, ValueError)
    assert value.meta["message"] == "it broke"


def test_valueify_passes_values_through_and_relabels_on_override() -> None:
    original = Value(ValueKind.TEXT, '{"a": 1}', ref="n1", meta={"alias": "fast"})
    assert valueify(original) is original
    assert valueify(original, kind=ValueKind.TEXT) is original
    relabelled = valueify(original, kind=ValueKind.STRUCTURED)
    assert relabelled is not original
    assert relabelled.kind is ValueKind.STRUCTURED
    assert (relabelled.payload, relabelled.ref, relabelled.meta) == (
        '{"a": 1}',
        "n1",
        {"alias": "fast"},
    )
    assert original.kind is ValueKind.TEXT


class _Stage(Module):
    def __init__(self) -> None:
        super().__init__()
        self.instructions = Parameter("Be brief.", description="How the stage answers.")
        self.demos = Parameter(["q -> a"], description="Few-shot examples.")
        self.llm = LLMInference(alias="fast")


class _Program(Module):
    def __init__(self, seen: list[Value]) -> None:
        super().__init__()
        self.stage1 = _Stage()
        self._seen = seen

    def forward(self, text: str) -> object:
        lifted = valueify(self.stage1.instructions)
        self._seen.append(lifted)
        self._seen.append(valueify(self.stage1.demos))
        return self.stage1.llm(lifted)


def test_valueify_lifts_a_parameter_with_a_param_ref() -> None:
    stage = _Stage()
    value = valueify(stage.instructions)
    assert value.kind is ValueKind.TEXT
    assert value.payload == "Be brief."
    assert value.ref == "param:instructions"
    assert value.meta == {"param_name": "instructions", "param_id": id(stage.instructions)}
    demos = valueify(stage.demos)
    assert demos.kind is ValueKind.STRUCTURED
    assert demos.payload == ["q -> a"]
    assert demos.ref == "param:demos"


def test_valueify_inside_a_trace_names_the_parameter_by_its_full_path() -> None:
    seen: list[Value] = []
    program = _Program(seen)
    graph = Tracer().trace(program, "doc")
    instructions, demos = seen
    assert instructions.ref == "param:stage1.instructions"
    assert instructions.meta["param_name"] == "stage1.instructions"
    assert instructions.meta["param_id"] == id(program.stage1.instructions)
    assert instructions.is_symbolic
    assert demos.ref == "param:stage1.demos"
    node = graph.nodes["stage1.llm"]
    assert node.args == (ValueRef("param:stage1.instructions"),)
    assert node.parameters == ("param:stage1.instructions",)
    assert node.dependencies == ()


def test_valueify_of_an_unregistered_parameter_says_so() -> None:
    value = valueify(Parameter("x", requires_grad=False))
    assert value.ref == "param:<unnamed>"


# --------------------------------------------------------------------- unwrap
def test_unwrap_returns_payloads_through_nested_containers() -> None:
    nested = {
        "a": Value(ValueKind.TEXT, "x", ref="n1"),
        "b": [Value(ValueKind.INT, 1), (Value(ValueKind.FLOAT, 2.0), "raw")],
        "c": Value(ValueKind.STRUCTURED, {"d": Value(ValueKind.TEXT, "deep")}),
    }
    assert unwrap(nested) == {"a": "x", "b": [1, (2.0, "raw")], "c": {"d": "deep"}}


def test_unwrap_leaves_raw_data_alone() -> None:
    obj = object()
    assert unwrap(obj) is obj
    assert unwrap("text") == "text"
    assert unwrap(None) is None
    person = Person(name="Ada", age=36)
    assert unwrap(Value(ValueKind.STRUCTURED, person)) is person


def test_unwrap_of_an_error_value_is_the_exception() -> None:
    error = error_value(KeyError("k"))
    assert isinstance(unwrap(error), KeyError)


# --------------------------------------------------------------- collect_refs
def test_collect_refs_walks_args_then_kwargs_in_first_seen_order_once_each() -> None:
    refs = collect_refs(
        Value(ValueKind.TEXT, "b", ref="b"),
        [Value(ValueKind.TEXT, "a", ref="a"), ValueRef("c"), Value(ValueKind.TEXT, "none")],
        {"x": Value(ValueKind.TEXT, "b again", ref="b"), "y": (ValueRef("e"),)},
        "plain text",
        k=Value(ValueKind.TEXT, "d", ref="d"),
        j=[ValueRef("a")],
    )
    assert refs == ["b", "a", "c", "e", "d"]


def test_collect_refs_looks_inside_structured_payloads() -> None:
    inner = Value(ValueKind.TEXT, "x", ref="inner")
    outer = Value(ValueKind.STRUCTURED, {"k": [inner, ValueRef("deeper")]}, ref="outer")
    assert collect_refs(outer) == ["outer", "inner", "deeper"]


def test_collect_refs_is_deterministic_and_matches_the_seed_example() -> None:
    output = {
        "summary": Value(ValueKind.TEXT, "...", ref="n1"),
        "entities": [Value(ValueKind.STRUCTURED, {"e": 1}, ref="n2")],
    }
    assert collect_refs(output) == ["n1", "n2"]
    assert all(collect_refs(output) == ["n1", "n2"] for _ in range(5))


def test_collect_refs_of_nothing_is_empty() -> None:
    assert collect_refs() == []
    assert collect_refs("a", 1, [None], {"k": "v"}) == []


# ---------------------------------------------------------------- error_value
def test_error_value_records_op_and_sources() -> None:
    value = error_value(KeyError("k"), op="F.select", sources=["llm", "input:text"])
    assert value.kind is ValueKind.ERROR
    assert isinstance(value.payload, KeyError)
    assert value.ref is None
    assert value.meta == {
        "error_type": "KeyError",
        "message": "'k'",
        "op": "F.select",
        "sources": ["llm", "input:text"],
    }


def test_error_value_from_a_message_wraps_it_in_value_error() -> None:
    value = error_value("no JSON found")
    assert isinstance(value.payload, ValueError)
    assert value.meta == {"error_type": "ValueError", "message": "no JSON found"}


def test_error_value_copies_the_sources_list() -> None:
    sources = ["a"]
    value = error_value("x", sources=sources)
    sources.append("b")
    assert value.meta["sources"] == ["a"]


# ----------------------------------------------------------- structured access
def test_getitem_goes_through_select_and_returns_values() -> None:
    data = valueify({"user": {"name": "Ada", "tags": ["x", "y"]}}, kind=ValueKind.STRUCTURED)
    user = data["user"]
    assert isinstance(user, Value)
    assert user.kind is ValueKind.STRUCTURED
    name = user["name"]
    assert (name.kind, name.payload) == (ValueKind.TEXT, "Ada")
    assert user["tags"][-1].payload == "y"


def test_getitem_reads_attributes_of_models() -> None:
    value = Value(ValueKind.STRUCTURED, Person(name="Ada", age=36))
    assert value["age"].payload == 36
    assert value["age"].kind is ValueKind.INT


def test_getitem_of_a_missing_key_is_an_error_value_naming_select() -> None:
    data = Value(ValueKind.STRUCTURED, {"a": 1, "b": 2}, ref="llm")
    missing = data["c"]
    assert missing.kind is ValueKind.ERROR
    assert isinstance(missing.payload, KeyError)
    assert missing.meta["op"] == "F.select"
    assert missing.meta["sources"] == ["llm"]
    assert "'c' not found in mapping with keys ['a', 'b']" in missing.meta["message"]


def test_getitem_past_the_end_of_a_list_is_an_error_value() -> None:
    missing = Value(ValueKind.STRUCTURED, ["a"])[3]
    assert missing.is_error
    assert "list of length 1" in missing.meta["message"]


def test_get_returns_the_default_for_a_missing_key() -> None:
    data = Value(ValueKind.STRUCTURED, {"a": 1})
    assert data.get("a").payload == 1
    fallback = data.get("z", "none")
    assert (fallback.kind, fallback.payload) == (ValueKind.TEXT, "none")
    assert data.get("z").payload is None


def test_getitem_of_an_error_propagates_it() -> None:
    error = Value(ValueKind.STRUCTURED, {"a": 1})["zz"]
    again = error["a"]
    assert again.is_error
    assert again.payload is error.payload
    assert again.meta["skipped"] == ["F.select"]


# ----------------------------------------------------------------- formatting
def test_a_concrete_value_formats_as_its_payload() -> None:
    text = Value(ValueKind.TEXT, "hi", ref="n1")
    number = Value(ValueKind.FLOAT, 3.14159)
    assert str(text) == "hi"
    assert f"<{text}>" == "<hi>"
    assert f"{text:>4}" == "  hi"
    assert f"{number:.2f}" == "3.14"
    assert "{} and {}".format(text, number) == "hi and 3.14159"  # noqa: UP032 - tests format()
    assert "%s!" % text == "hi!"  # noqa: UP031 - tests %-formatting
    assert repr(text) == "Value(text, 'hi', ref='n1')"


def test_a_concrete_value_concatenates_with_text_on_either_side() -> None:
    text = Value(ValueKind.TEXT, "hi")
    assert text + "!" == "hi!"
    assert "> " + text == "> hi"
    assert "-".join([f"{text}", "x"]) == "hi-x"


def test_adding_numeric_values_goes_through_add() -> None:
    two = Value(ValueKind.INT, 2)
    total = two + 3
    assert isinstance(total, Value)
    assert (total.kind, total.payload) == (ValueKind.INT, 5)
    assert (3 + two).payload == 5
    assert (two + Value(ValueKind.FLOAT, 0.5)).payload == 2.5


def test_concrete_values_answer_python_questions() -> None:
    text = Value(ValueKind.TEXT, "abc")
    assert bool(text)
    assert not Value(ValueKind.TEXT, "")
    assert len(text) == 3
    assert "b" in text
    assert list(text) == ["a", "b", "c"]
    assert int(Value(ValueKind.TEXT, "7")) == 7
    assert float(Value(ValueKind.INT, 2)) == 2.0
    assert ["x", "y", "z"][Value(ValueKind.INT, 1)] == "y"


def test_a_symbolic_value_formats_to_a_placeholder_token() -> None:
    value = Value(ValueKind.TEXT, SYMBOLIC, ref="stage1.llm")
    assert value.is_symbolic
    assert is_symbolic(value)
    assert not is_symbolic(Value(ValueKind.TEXT, "x"))
    assert not is_symbolic("x")
    assert str(value) == placeholder("stage1.llm")
    assert TOKEN_PATTERN.fullmatch(str(value)).groups() == ("s", "", "stage1.llm")
    assert TOKEN_PATTERN.fullmatch(f"{value:>9}").groups() == ("s", ">9", "stage1.llm")
    assert TOKEN_PATTERN.fullmatch(repr(value)).groups() == ("r", "", "stage1.llm")
    assert "stage1.llm" not in str(value).replace(placeholder("stage1.llm"), "")


def test_a_symbolic_value_without_a_ref_cannot_be_formatted() -> None:
    with pytest.raises(ValueError, match="without a ref"):
        str(Value(ValueKind.TEXT, SYMBOLIC))


def test_a_symbolic_value_refuses_decisions_even_outside_a_trace() -> None:
    value = Value(ValueKind.TEXT, SYMBOLIC, ref="llm")
    with pytest.raises(TracingError, match=r"traced value \(llm\) was used in `len\(\)`"):
        len(value)
    with pytest.raises(TracingError, match="outside a trace"):
        bool(value)


# ------------------------------------------------------------------- equality
def test_values_are_equal_by_kind_payload_and_ref_not_meta() -> None:
    a = Value(ValueKind.TEXT, "x", ref="n1", meta={"tokens": 3})
    assert a == Value(ValueKind.TEXT, "x", ref="n1")
    assert a != Value(ValueKind.TEXT, "x", ref="n2")
    assert a != Value(ValueKind.TEXT, "y", ref="n1")
    assert a != Value(ValueKind.RESPONSE, "x", ref="n1")


def test_a_value_never_equals_its_raw_payload() -> None:
    value = Value(ValueKind.TEXT, "x")
    assert value != "x"
    assert "x" != value  # noqa: SIM300 - the reflected comparison is the point


def test_values_are_unhashable() -> None:
    with pytest.raises(TypeError, match="unhashable"):
        hash(Value(ValueKind.TEXT, "x"))


def test_value_refs_are_hashable_and_equal_by_ref() -> None:
    assert ValueRef("n1") == ValueRef("n1")
    assert len({ValueRef("n1"), ValueRef("n1"), ValueRef("n2")}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        ValueRef("n1").ref = "n2"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del ValueRef("n1").ref  # type: ignore[misc]
    assert repr(ValueRef("n1")) == "ValueRef(ref='n1')"


def test_value_refs_and_values_survive_pickles_and_copies() -> None:
    import copy
    import pickle

    ref = ValueRef("stage1.llm")
    for made in (pickle.loads(pickle.dumps(ref)), copy.copy(ref), copy.deepcopy(ref)):
        assert made == ref
        assert type(made) is ValueRef
    value = Value(ValueKind.STRUCTURED, {"a": [1]}, ref="n1", meta={"usage": 3})
    restored = pickle.loads(pickle.dumps(value))
    assert (restored.kind, restored.payload, restored.ref, restored.meta) == (
        value.kind,
        value.payload,
        value.ref,
        value.meta,
    )


def test_values_and_value_refs_are_written_as_json_field_by_field() -> None:
    # As when they were dataclasses: a Value inside data plait writes keeps its provenance.
    from plait._jsondata import as_json_data, compact_json

    value = Value(ValueKind.TEXT, "hi", ref="n1", meta={"alias": "fast"})
    fields = {"kind": "text", "payload": "hi", "ref": "n1", "meta": {"alias": "fast"}}
    assert as_json_data({"out": value, "at": ValueRef("n1")}) == {
        "out": fields,
        "at": {"ref": "n1"},
    }
    assert as_json_data([value], fallback=repr) == [fields]
    assert compact_json(value) == (
        '{"kind":"text","payload":"hi","ref":"n1","meta":{"alias":"fast"}}'
    )


def test_a_value_matches_by_position_and_takes_a_new_meta_by_default() -> None:
    match Value(ValueKind.TEXT, "hi", ref="n1"):
        case Value(kind, payload, ref, meta):
            assert (kind, payload, ref, meta) == (ValueKind.TEXT, "hi", "n1", {})
    assert Value(ValueKind.TEXT, "a").meta is not Value(ValueKind.TEXT, "b").meta


def test_attribute_access_on_structured_values_selects_the_field() -> None:
    structured = valueify({"answer": 3}, kind=ValueKind.STRUCTURED)
    assert structured.answer.payload == 3
    assert structured.missing.kind is ValueKind.ERROR
    with pytest.raises(AttributeError):
        valueify("plain text").answer  # noqa: B018 - text has no fields


def test_attribute_access_on_a_traced_reply_records_a_select_node() -> None:
    from plait import LLMInference, Module
    from plait.tracing import Tracer

    class Reads(Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = LLMInference("x")

        def forward(self, question: str) -> object:
            return self.llm(question).answer

    graph = Tracer().trace(Reads(), "q")
    assert graph.nodes["F.select"].args == (ValueRef("llm"), "answer")


def test_a_field_named_like_a_str_method_is_selected_not_the_method() -> None:
    from plait import LLMInference, Module
    from plait.tracing import Tracer

    class Headline(Module):
        def __init__(self) -> None:
            super().__init__()
            self.extract = LLMInference("x")
            self.write = LLMInference("y")

        def forward(self, text: str) -> object:
            return self.write(self.extract(text).title)

    graph = Tracer().trace(Headline(), "doc")
    assert graph.nodes["F.select"].args == (ValueRef("extract"), "title")
    assert graph.nodes["write"].dependencies == ("F.select",)


@pytest.mark.parametrize("name", ["items", "keys", "values"])
def test_a_field_named_like_a_mapping_method_is_selected_not_the_method(name: str) -> None:
    from plait import LLMInference, Module
    from plait.tracing import Tracer

    class Reads(Module):
        def __init__(self) -> None:
            super().__init__()
            self.extract = LLMInference("x")
            self.write = LLMInference("y")

        def forward(self, text: str) -> object:
            return self.write(getattr(self.extract(text), name))

    graph = Tracer().trace(Reads(), "doc")
    assert graph.nodes["F.select"].args == (ValueRef("extract"), name)
