"""Seed 001 (plait's values): its snippets for `valueify`, structured access and functional ops.

Each test is a snippet of the seed, run eagerly and, where the seed says what
tracing records, inside a traced ``forward``. Modules, tapes and backward are
in ``test_seed000_snippets.py``.
"""

from __future__ import annotations

from typing import Any

import plait.functional as F
from plait import (
    LLMInference,
    Module,
    Parameter,
    ResourceConfig,
    Value,
    ValueKind,
    ValueRef,
    collect_refs,
    unwrap,
    valueify,
)
from plait.testing import ScriptedServer
from plait.tracing import Tracer


# ----------------------------------------------------------- structured access
def test_structured_access_snippet() -> None:
    data = valueify({"user": {"name": "Ada"}})
    name = data["user"]["name"]  # each [] is a select op
    assert isinstance(data, Value) and data.kind is ValueKind.STRUCTURED
    assert data.payload == {"user": {"name": "Ada"}}
    assert data["user"].kind is ValueKind.STRUCTURED  # "chaining continues to work"
    assert (name.kind, name.payload) == (ValueKind.TEXT, "Ada")


class GreetUser(Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference(alias="llm")

    def forward(self, text: str) -> Any:
        data = valueify({"user": {"name": "Ada"}, "text": text})
        name = data["user"]["name"]  # each [] is a select op
        return self.llm(F.render("{text}, {name}", data, name=name))


async def test_structured_access_records_a_select_per_index_while_tracing() -> None:
    graph = Tracer().trace(GreetUser(), "Hello")
    assert list(graph.nodes) == ["input:text", "F.select", "F.select_2", "F.render", "llm"]
    assert graph.nodes["F.select_2"].dependencies == ("F.select",)
    # the structured value holds the traced input, so rendering it reads that input
    assert graph.nodes["F.render"].dependencies == ("input:text", "F.select_2")
    async with ScriptedServer() as server:
        program = GreetUser().bind(ResourceConfig({"*": server.endpoint(max_retries=0)}))
        assert await program("Hello") == "echo: Hello, Ada"


# ---------------------------------------------------------------- collections
def test_batch_of_inputs_snippet() -> None:
    inputs = ["a", "b", "c"]
    values = valueify(inputs)  # -> list[Value(TEXT)]
    assert [(v.kind, v.payload) for v in values] == [(ValueKind.TEXT, x) for x in inputs]
    assert unwrap(values) == inputs


def test_structured_output_snippet() -> None:
    output = {
        "summary": Value(ValueKind.TEXT, "...", ref="n1"),
        "entities": [Value(ValueKind.STRUCTURED, {"name": "Ada"}, ref="n2")],
    }
    refs = collect_refs(output)  # -> ["n1", "n2"]
    assert refs == ["n1", "n2"]
    assert collect_refs(valueify(output)) == ["n1", "n2"]  # kept inside a structured Value


# -------------------------------------------------------------- functional ops
def test_functional_ops_snippet() -> None:
    template = valueify("Summarize: {text}", kind=ValueKind.FSTRING)
    vars = valueify({"text": "long doc"})
    prompt = F.render(template, vars)  # -> Value(TEXT, ref=...)
    assert vars.kind is ValueKind.STRUCTURED
    assert (prompt.kind, prompt.payload) == (ValueKind.TEXT, "Summarize: long doc")


# ----------------------------------------------------------------- parameters
class Templated(Module):
    def __init__(self) -> None:
        super().__init__()
        self.template = Parameter("Summarize: {text}", description="The summary prompt.")
        self.llm = LLMInference(alias="llm")
        self.seen: list[Value] = []

    def forward(self, text: str) -> Any:
        template = valueify(self.template, kind=ValueKind.FSTRING)
        self.seen.append(template)
        return self.llm(F.render(template, text=text))


def test_valueify_of_a_parameter_takes_the_kind_given() -> None:
    program = Templated()
    lifted = valueify(program.template, kind=ValueKind.FSTRING)
    assert (lifted.kind, lifted.payload, lifted.ref) == (
        ValueKind.FSTRING,
        "Summarize: {text}",
        "param:template",
    )
    assert lifted.meta["param_name"] == "template"
    graph = Tracer().trace(program, "doc")
    (traced,) = program.seen
    assert traced.kind is ValueKind.FSTRING and traced.ref == "param:template"
    assert graph.nodes["F.render"].args == (ValueRef("param:template"),)


def test_render_an_fstring_value_with_vars_in_meta_snippet() -> None:
    # Seed 001: "F-string rendering: Value(FSTRING) with variables in meta" → Value(TEXT).
    template = Value(ValueKind.FSTRING, "Hi {name}", meta={"vars": {"name": "Ada"}})
    rendered = F.render(template)
    assert rendered.kind is ValueKind.TEXT and rendered.payload == "Hi Ada"
    assert F.render(template, {"name": "Bob"}).payload == "Hi Bob"  # given variables win
    graph = Tracer().trace(_RendersItsTemplate(), "Ada")
    assert list(graph.nodes) == ["input:name", "F.render", "llm"]
    assert graph.nodes["F.render"].dependencies == ("input:name",)  # the vars' refs count


class _RendersItsTemplate(Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm")

    def forward(self, name: Any) -> Any:
        return self.llm(
            F.render(Value(ValueKind.FSTRING, "Hi {name}", meta={"vars": {"name": name}}))
        )


class _KeepsATracedValue(Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm")
        self.seen: list[Value] = []

    def forward(self, text: Any) -> Any:
        reply = self.llm(text)
        self.seen.append(reply)
        return reply


def test_an_ops_value_has_a_ref_only_inside_a_trace_and_a_traced_payload_is_symbolic() -> None:
    # Seed 001: "During execution, ops ... return Value with ref"; a recorded call
    # returns "Value(kind=ValueKind.RESPONSE, payload=None, ref=node_id)".
    eager = F.render("Hi {name}", {"name": "Ada"})
    assert eager.payload == "Hi Ada" and eager.ref is None  # no graph, no node to name
    program = _KeepsATracedValue()
    Tracer().trace(program, "x")
    (traced,) = program.seen
    assert traced.ref == "llm" and traced.is_symbolic and traced.payload is not None
