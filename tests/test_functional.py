"""Tests of plait.functional: every op eagerly (happy and error path) and while tracing."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pydantic
import pytest

import plait.functional as F
from plait import LLMInference, Module
from plait.tracing import Tracer, substitute
from plait.values import Value, ValueKind, ValueRef, error_value, valueify


class Verdict(pydantic.BaseModel):
    label: str
    score: float


def _text(payload: Any, ref: str) -> Value:
    return Value(ValueKind.TEXT, payload, ref=ref)


@dataclass
class Case:
    """One eager call of an op: its arguments and the payload (or error type) it gives."""

    op: Callable[..., Value]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    expected: Any

    @property
    def name(self) -> str:
        return self.op.op_name  # type: ignore[attr-defined]


def case(op: Callable[..., Value], *args: Any, expected: Any, **kwargs: Any) -> Case:
    return Case(op, args, kwargs, expected)


HAPPY = [
    case(F.render, "Hi {name}, {n}!", {"name": "Ada"}, n=2, expected="Hi Ada, 2!"),
    case(F.render, "{a}", expected="x", a="x"),
    case(F.format, "{} + {x}", 1, x="y", expected="1 + y"),
    case(F.concat, "a", 1, "b", expected="a1b"),
    case(F.concat, ["a", "b", "c"], sep=", ", expected="a, b, c"),
    case(F.strip, "  pad \n", expected="pad"),
    case(F.strip, "--x--", "-", expected="x"),
    case(F.lower, "MiXed", expected="mixed"),
    case(F.upper, "MiXed", expected="MIXED"),
    case(F.parse_structured, '{"a": [1, 2]}', expected={"a": [1, 2]}),
    case(F.select, {"a": {"b": 1}}, "a", expected={"b": 1}),
    case(F.select, ["x", "y"], -1, expected="y"),
    case(F.select, {"a": 1}, "z", default=0, expected=0),
    case(F.merge, {"a": 1, "b": 1}, {"b": 2}, expected={"a": 1, "b": 2}),
    case(F.coerce, " 42 ", int, expected=42),
    case(F.coerce, "2.5", float, expected=2.5),
    case(F.coerce, "Yes", bool, expected=True),
    case(F.coerce, "off", bool, expected=False),
    case(F.coerce, 7, str, expected="7"),
    case(F.coerce, ["1", "2"], list[int], expected=[1, 2]),
    case(F.unwrap_or, "fine", "fallback", expected="fine"),
    case(F.is_error, "fine", expected=False),
    case(F.add, 2, 3, expected=5),
    case(F.add, "ab", "cd", expected="abcd"),
    case(F.sub, 5, 3.5, expected=1.5),
    case(F.mul, 4, 2.5, expected=10.0),
    case(F.div, 1, 4, expected=0.25),
    case(F.sum, [1, 2, 3.5], expected=6.5),
    case(F.sum, [1, 2], start=10, expected=13),
    case(F.min, [3, 1, 2], expected=1),
    case(F.max, [3, 1, 2], expected=3),
    case(F.mean, [1, 2, 3, 4], expected=2.5),
    case(F.map_values, str.upper, ["a", "b"], expected=["A", "B"]),
    case(F.map_values, len, {"a": "xy", "b": ""}, expected={"a": 2, "b": 0}),
    case(F.zip_values, [1, 2], ["a", "b"], expected=[(1, "a"), (2, "b")]),
]

ERRORS = [
    case(F.render, "Hi {name}", {"other": 1}, expected=KeyError),
    case(F.format, "{} {}", "only one", expected=IndexError),
    case(F.concat, "a", "b", sep=None, expected=AttributeError),
    case(F.strip, 12, expected=TypeError),
    case(F.lower, ["a"], expected=TypeError),
    case(F.upper, None, expected=TypeError),
    case(F.parse_structured, "no json here at all", expected=ValueError),
    case(F.parse_structured, '{"label": "x"}', Verdict, expected=pydantic.ValidationError),
    case(F.select, {"a": 1}, "b", expected=KeyError),
    case(F.select, ["a"], 5, expected=KeyError),
    case(F.merge, {"a": 1}, ["not", "a", "mapping"], expected=TypeError),
    case(F.coerce, "forty", int, expected=ValueError),
    case(F.coerce, "maybe", bool, expected=ValueError),
    case(F.coerce, "x", list[int], expected=pydantic.ValidationError),
    case(F.add, "a", 1, expected=TypeError),
    case(F.sub, "a", 1, expected=TypeError),
    case(F.mul, "a", "b", expected=TypeError),
    case(F.div, 1, 0, expected=ZeroDivisionError),
    case(F.sum, [1, "2"], expected=TypeError),
    case(F.sum, "123", expected=TypeError),
    case(F.min, [], expected=ValueError),
    case(F.max, [True, 2], expected=TypeError),
    case(F.mean, [], expected=ValueError),
    case(F.map_values, str.upper, "not a container", expected=TypeError),
    case(F.map_values, lambda x: 1 / x, [1, 0], expected=ZeroDivisionError),
    case(F.zip_values, [1, 2], [1], expected=ValueError),
]

LLM_OPS = {"chat_complete"}
"""Ops that call a model: not pure, so not in the tables here (see test_seed000_snippets.py)."""

ALL_OPS = sorted(set(F.__all__) - LLM_OPS)

HANDLERS = {"F.unwrap_or", "F.is_error", "F.with_meta"}
"""Ops that exist to handle errors, so an error input does not short-circuit them."""


def _id(c: Case) -> str:
    return c.name


def test_the_issue_lists_every_op() -> None:
    required = [
        *("render", "format", "concat", "strip", "lower", "upper", "parse_structured"),
        *("select", "merge", "coerce", "unwrap_or", "is_error", "with_meta"),
        *("add", "sub", "mul", "div", "sum", "min", "max", "mean", "map_values", "zip_values"),
    ]
    assert set(required) <= set(ALL_OPS)
    for name in ALL_OPS:
        assert getattr(F, name).op_name == f"F.{name}"


def test_every_op_has_a_happy_case_and_every_fallible_op_an_error_case() -> None:
    happy = {c.name for c in HAPPY} | {"F.with_meta"}
    errors = {c.name for c in ERRORS} | HANDLERS
    assert happy == {f"F.{name}" for name in ALL_OPS}
    assert errors == {f"F.{name}" for name in ALL_OPS}


# ------------------------------------------------------------------ eager ops
@pytest.mark.parametrize("c", HAPPY, ids=_id)
def test_op_on_raw_inputs_returns_a_value(c: Case) -> None:
    result = c.op(*c.args, **c.kwargs)
    assert isinstance(result, Value)
    assert not result.is_error, result.meta.get("message")
    assert result.payload == c.expected
    assert type(result.payload) is type(c.expected)


@pytest.mark.parametrize("c", HAPPY, ids=_id)
def test_op_on_value_inputs_gives_the_same_payload(c: Case) -> None:
    args = tuple(_wrap(a, f"a{i}") for i, a in enumerate(c.args))
    kwargs = {k: _wrap(v, f"k_{k}") for k, v in c.kwargs.items()}
    result = c.op(*args, **kwargs)
    assert isinstance(result, Value)
    assert result.payload == c.expected


def _wrap(x: Any, ref: str) -> Any:
    """Returns ``x`` as a Value with ``ref``; functions and target types stay as they are."""
    if callable(x):
        return x
    kind = ValueKind.STRUCTURED if isinstance(x, dict | list | tuple) else valueify(x).kind
    return Value(kind, x, ref=ref)


@pytest.mark.parametrize("c", ERRORS, ids=_id)
def test_op_failure_is_an_error_value_naming_the_op(c: Case) -> None:
    result = c.op(*c.args, **c.kwargs)
    assert isinstance(result, Value)
    assert result.kind is ValueKind.ERROR
    assert isinstance(result.payload, c.expected)
    assert result.meta["op"] == c.name
    assert result.meta["error_type"] == c.expected.__name__
    assert result.meta["message"] == str(result.payload)
    assert "sources" not in result.meta  # raw inputs have no refs
    assert result.meta["traceback"].startswith("Traceback (most recent call last)")


@pytest.mark.parametrize("c", ERRORS, ids=_id)
def test_op_failure_lists_the_refs_of_its_inputs(c: Case) -> None:
    args = tuple(_wrap(a, f"a{i}") for i, a in enumerate(c.args))
    kwargs = {k: _wrap(v, f"k_{k}") for k, v in c.kwargs.items()}
    result = c.op(*args, **kwargs)
    assert result.kind is ValueKind.ERROR
    expected_refs = [v.ref for v in (*args, *kwargs.values()) if isinstance(v, Value)]
    assert expected_refs, "each error case reads at least one data input"
    assert result.meta["sources"] == expected_refs


def test_error_messages_say_what_was_wrong() -> None:
    assert F.select({"a": 1, "b": 2}, "c").meta["message"] == (
        "\"'c' not found in mapping with keys ['a', 'b']\""
    )
    assert F.mean([]).meta["message"] == "F.mean of an empty list"
    assert F.sum(["x"]).meta["message"] == "F.sum item 0 is str, not a number"
    assert F.zip_values([1], [1, 2]).meta["message"] == (
        "F.zip_values got sequences of different lengths [1, 2]"
    )
    assert F.coerce("maybe", bool).meta["message"] == "cannot read 'maybe' as a boolean"
    assert F.merge({}, 3).meta["message"] == "F.merge argument 1 is int, not a mapping"
    assert F.upper(5).meta["message"] == "F.upper needs text, got int"


@pytest.mark.parametrize("c", [c for c in HAPPY if c.name not in HANDLERS], ids=_id)
def test_an_error_input_short_circuits_the_op(c: Case) -> None:
    upstream = error_value(KeyError("k"), op="F.select", sources=["llm"])
    upstream.ref = "F.select"
    data_positions = [i for i, a in enumerate(c.args) if _wrap(a, "r") is not a]
    args = list(c.args)
    args[data_positions[-1]] = upstream
    result = c.op(*args, **c.kwargs)
    assert result.kind is ValueKind.ERROR
    assert result.payload is upstream.payload
    assert result.ref == "F.select"
    assert result.meta["op"] == "F.select"
    assert result.meta["sources"] == ["llm"]
    assert result.meta["skipped"] == [c.name]
    assert "skipped" not in upstream.meta


def test_an_error_nested_in_a_container_or_kwarg_short_circuits() -> None:
    failed = F.div(1, 0)
    assert F.sum([1, failed]).meta["skipped"] == ["F.sum"]
    assert F.merge({"a": 1}, {"b": failed}).meta["skipped"] == ["F.merge"]
    assert F.render("{x}", x=failed).meta["skipped"] == ["F.render"]
    assert F.concat(Value(ValueKind.STRUCTURED, ["a", failed])).meta["skipped"] == ["F.concat"]


def test_skips_accumulate_along_a_chain() -> None:
    result = F.lower(F.strip(F.select({}, "text")))
    assert result.meta["op"] == "F.select"
    assert result.meta["skipped"] == ["F.strip", "F.lower"]


# ------------------------------------------------------------ error handling
def test_unwrap_or_replaces_an_error_with_the_default() -> None:
    failed = F.select({"a": 1}, "b")
    result = F.unwrap_or(failed, 0)
    assert (result.kind, result.payload) == (ValueKind.INT, 0)
    assert F.unwrap_or(failed, Value(ValueKind.TEXT, "dflt")).payload == "dflt"


def test_unwrap_or_keeps_a_good_value_and_its_provenance() -> None:
    good = Value(ValueKind.TEXT, "ok", ref="llm", meta={"tokens": 2})
    assert F.unwrap_or(good, "x") is good
    assert F.unwrap_or("raw", "x").payload == "raw"


def test_is_error_tells_errors_from_data() -> None:
    assert F.is_error(F.div(1, 0)).payload is True
    assert F.is_error(Value(ValueKind.TEXT, "x")).payload is False
    assert F.is_error(3).payload is False
    assert F.is_error(3).kind is ValueKind.OTHER


def test_with_meta_adds_entries_and_keeps_kind_and_ref() -> None:
    good = Value(ValueKind.TEXT, "ok", ref="llm", meta={"tokens": 2})
    tagged = F.with_meta(good, source="cache")
    assert (tagged.kind, tagged.payload, tagged.ref) == (ValueKind.TEXT, "ok", "llm")
    assert tagged.meta == {"tokens": 2, "source": "cache"}
    assert good.meta == {"tokens": 2}
    raw = F.with_meta(1.5, unit="s")
    assert (raw.kind, raw.payload, raw.meta) == (ValueKind.FLOAT, 1.5, {"unit": "s"})


def test_with_meta_on_an_error_keeps_it_an_error() -> None:
    failed = F.div(1, 0)
    tagged = F.with_meta(failed, retry=True)
    assert tagged.kind is ValueKind.ERROR
    assert tagged.payload is failed.payload
    assert tagged.meta["op"] == "F.div"
    assert tagged.meta["retry"] is True
    assert "skipped" not in tagged.meta


# ----------------------------------------------------------- parse_structured
@pytest.mark.parametrize(
    "text",
    [
        '{"label": "spam", "score": 0.9}',
        '  \n{"label": "spam", "score": 0.9}\n',
        '```json\n{"label": "spam", "score": 0.9}\n```',
        '```\n{"label": "spam", "score": 0.9}\n```',
        'Sure! Here is the JSON:\n```json\n{"label": "spam", "score": 0.9}\n```\nHope it helps.',
        'The answer is {"label": "spam", "score": 0.9} as requested.',
    ],
    ids=["plain", "padded", "fenced-json", "fenced", "fenced-in-prose", "prose"],
)
def test_parse_structured_finds_json_leniently(text: str) -> None:
    assert F.parse_structured(text).payload == {"label": "spam", "score": 0.9}
    parsed = F.parse_structured(text, Verdict)
    assert parsed.kind is ValueKind.STRUCTURED
    assert parsed.payload == Verdict(label="spam", score=0.9)


def test_parse_structured_reads_arrays_in_prose_into_generic_types() -> None:
    result = F.parse_structured('Categories: ["a", "b"] (two)', list[str])
    assert result.payload == ["a", "b"]


def test_parse_structured_validates_already_parsed_data() -> None:
    result = F.parse_structured({"label": "ham", "score": "0.5"}, Verdict)
    assert result.payload == Verdict(label="ham", score=0.5)


def test_parse_structured_reports_validation_problems_as_data() -> None:
    result = F.parse_structured(_text('{"label": "x", "score": "high"}', "llm"), Verdict)
    assert result.is_error
    assert isinstance(result.payload, pydantic.ValidationError)
    assert "score" in result.meta["message"]
    assert result.meta["sources"] == ["llm"]


def test_parse_structured_shows_the_start_of_unparsable_text() -> None:
    result = F.parse_structured("x" * 200)
    assert result.meta["message"] == f"no JSON object or array found in {'x' * 77 + '...'!r}"


def test_parse_structured_round_trips_json_dumps() -> None:
    data = {"nested": {"list": [1, 2.5, None, True]}, "text": "ünïcode"}
    assert F.parse_structured(json.dumps(data)).payload == data


# ------------------------------------------------------------------- tracing
class OpsOnReplies(Module):
    """Calls two LLMs on the input, then builds one op node from their replies."""

    def __init__(self, build: Callable[[Any, Any], Any]) -> None:
        super().__init__()
        self.first = LLMInference(alias="fast")
        self.second = LLMInference(alias="fast")
        self._build = build

    def forward(self, text: str) -> Any:
        return self._build(self.first(text), self.second(text))


TRACED: list[tuple[str, Callable[[Any, Any], Any], tuple[str, ...]]] = [
    ("render", lambda r, s: F.render("{a} {b}", {"a": r}, b=s), ("first", "second")),
    ("format", lambda r, s: F.format("{}: {}", s, r), ("second", "first")),
    ("concat", lambda r, s: F.concat([r, "-", s]), ("first", "second")),
    ("strip", lambda r, s: F.strip(r), ("first",)),
    ("lower", lambda r, s: F.lower(s), ("second",)),
    ("upper", lambda r, s: F.upper(r), ("first",)),
    ("parse_structured", lambda r, s: F.parse_structured(r, Verdict), ("first",)),
    ("select", lambda r, s: F.select(r, "label", default=s), ("first", "second")),
    ("merge", lambda r, s: F.merge({"a": r}, {"b": s}), ("first", "second")),
    ("coerce", lambda r, s: F.coerce(s, int), ("second",)),
    ("unwrap_or", lambda r, s: F.unwrap_or(r, s), ("first", "second")),
    ("is_error", lambda r, s: F.is_error(r), ("first",)),
    ("with_meta", lambda r, s: F.with_meta(s, note="n"), ("second",)),
    ("add", lambda r, s: F.add(r, s), ("first", "second")),
    ("sub", lambda r, s: F.sub(s, 1), ("second",)),
    ("mul", lambda r, s: F.mul(2, r), ("first",)),
    ("div", lambda r, s: F.div(r, s), ("first", "second")),
    ("sum", lambda r, s: F.sum([r, s, 1]), ("first", "second")),
    ("min", lambda r, s: F.min([s, r]), ("second", "first")),
    ("max", lambda r, s: F.max([r]), ("first",)),
    ("mean", lambda r, s: F.mean((r, s)), ("first", "second")),
    ("map_values", lambda r, s: F.map_values(str.upper, {"x": r}), ("first",)),
    ("zip_values", lambda r, s: F.zip_values([r], [s]), ("first", "second")),
]


def test_every_op_is_covered_while_tracing() -> None:
    assert sorted(name for name, _, _ in TRACED) == ALL_OPS


@pytest.mark.parametrize(("name", "build", "deps"), TRACED, ids=[t[0] for t in TRACED])
def test_op_records_exactly_one_node_while_tracing(
    name: str, build: Callable[[Any, Any], Any], deps: tuple[str, ...]
) -> None:
    graph = Tracer().trace(OpsOnReplies(build), "doc")
    graph.lint()
    assert list(graph.nodes) == ["input:text", "first", "second", f"F.{name}"]
    node = graph.nodes[f"F.{name}"]
    assert node.kind == "op"
    assert node.name == f"F.{name}"
    assert node.module is None
    assert node.module_path == ""
    assert node.op is getattr(F, name)
    assert node.dependencies == deps
    assert node.parameters == ()
    assert graph.output == ValueRef(f"F.{name}")
    assert graph.output_ids == [f"F.{name}"]


def test_traced_op_records_its_arguments_with_value_refs() -> None:
    graph = Tracer().trace(OpsOnReplies(lambda r, s: F.render("{a} {b}", {"a": r}, b=s)), "doc")
    node = graph.nodes["F.render"]
    assert node.args == ("{a} {b}", {"a": ValueRef("first")})
    assert node.kwargs == {"b": ValueRef("second")}


def test_a_recorded_op_runs_like_the_eager_call() -> None:
    graph = Tracer().trace(OpsOnReplies(lambda r, s: F.format("{}: {}", s, r)), "doc")
    node = graph.nodes["F.format"]
    replies = {"first": "one", "second": "two"}
    args = substitute(node.args, replies.__getitem__)
    kwargs = substitute(node.kwargs, replies.__getitem__)
    assert (
        node.op(*args, **kwargs).payload == F.format("{}: {}", "two", "one").payload == "two: one"
    )


def test_value_indexing_records_select_nodes_while_tracing() -> None:
    graph = Tracer().trace(OpsOnReplies(lambda r, s: r["user"]["name"] + s.get("x", "")), "doc")
    graph.lint()
    assert list(graph.nodes) == [
        "input:text",
        "first",
        "second",
        "F.select",
        "F.select_2",
        "F.select_3",
        "F.add",
    ]
    assert graph.nodes["F.select"].args == (ValueRef("first"), "user")
    assert graph.nodes["F.select_2"].args == (ValueRef("F.select"), "name")
    assert graph.nodes["F.select_2"].dependencies == ("F.select",)
    assert graph.nodes["F.select_3"].args == (ValueRef("second"), "x")
    assert graph.nodes["F.select_3"].kwargs == {"default": ""}
    assert graph.nodes["F.add"].dependencies == ("F.select_2", "F.select_3")


def test_ops_on_inputs_and_constants_are_recorded_too() -> None:
    class Prep(Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = LLMInference(alias="fast")

        def forward(self, text: str, n: int) -> Any:
            return self.llm(F.concat(F.strip(text), F.upper("const"), n))

    graph = Tracer().trace(Prep(), "doc", 3)
    graph.lint()
    assert list(graph.nodes) == ["input:text", "F.strip", "F.upper", "F.concat", "llm"]
    assert graph.nodes["F.strip"].dependencies == ("input:text",)
    assert graph.nodes["F.upper"].dependencies == ()
    assert graph.nodes["F.concat"].args == (ValueRef("F.strip"), ValueRef("F.upper"), 3)
    assert graph.nodes["llm"].dependencies == ("F.concat",)


def test_ops_in_a_nested_module_carry_its_path() -> None:
    class Clean(Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = LLMInference(alias="fast")

        def forward(self, text: str) -> Any:
            return F.strip(self.llm(F.lower(text)))

    class Outer(Module):
        def __init__(self) -> None:
            super().__init__()
            self.stage1 = Clean()
            self.stage2 = Clean()

        def forward(self, text: str) -> Any:
            return F.upper(self.stage2(self.stage1(text)))

    graph = Tracer().trace(Outer(), "doc")
    graph.lint()
    paths = {node_id: node.module_path for node_id, node in graph.nodes.items()}
    assert paths == {
        "input:text": "",
        "F.lower": "stage1",
        "stage1.llm": "stage1.llm",
        "F.strip": "stage1",
        "F.lower_2": "stage2",
        "stage2.llm": "stage2.llm",
        "F.strip_2": "stage2",
        "F.upper": "",
    }
    assert graph.nodes["F.lower_2"].dependencies == ("F.strip",)


def test_ops_run_directly_outside_a_trace_even_inside_modules() -> None:
    class Tidy(Module):
        def forward(self, text: str) -> Value:
            return F.upper(F.strip(text))

    result = Tidy()("  quiet ")
    assert isinstance(result, Value)
    assert result.payload == "QUIET"
