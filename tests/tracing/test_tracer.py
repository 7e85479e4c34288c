"""Tests of plait.tracing.tracer: what a forward() records, and what it may not do."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import plait.functional as F
from modules.scripted import scripted
from plait import LLMInference, Module, Parameter, TracingError, Value, ValueKind, ValueRef
from plait.tracing import InferenceGraph, Template, Tracer, is_leaf_module
from plait.tracing.graph import Slot, iter_refs
from plait.tracing.tracer import MAX_INPUT_DEPTH

Leaf = Callable[..., Module]
"""Builds a leaf: `LLMInference` when traced, the conftest's `Echo` when run eagerly."""
Check = Callable[..., tuple[InferenceGraph, Any]]
Evaluate = Callable[..., Any]


def line_of(marker: str) -> str:
    """Returns ``test_tracer.py:<n>`` for the one line of this file ending in ``# <marker>``."""
    lines = Path(__file__).read_text().splitlines()
    found = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, f"marker {marker!r} found {len(found)} times"
    return f"test_tracer.py:{found[0]}"


def deps(graph: InferenceGraph) -> dict[str, tuple[str, ...]]:
    return {node_id: node.dependencies for node_id, node in graph.nodes.items()}


# ------------------------------------------------------------ seed programs
def test_summarize_and_analyze_is_a_chain(seed: SimpleNamespace, check_trace: Check) -> None:
    graph, eager = check_trace(seed.SummarizeAndAnalyze, "a document")
    assert deps(graph) == {
        "input:text": (),
        "summarizer": ("input:text",),
        "analyzer": ("summarizer",),
    }
    assert graph.input_ids == ["input:text"]
    assert graph.output == ValueRef("analyzer")
    assert graph.output_ids == ["analyzer"]
    assert eager == "smart_llm<fast_llm<a document>>"
    summarizer = graph.nodes["summarizer"]
    assert summarizer.kind == "call"
    assert summarizer.name == "LLMInference"
    assert summarizer.module_path == "summarizer"
    assert summarizer.args == (ValueRef("input:text"),)
    assert summarizer.kwargs == {}


def test_multi_perspective_analysis_fans_out_and_returns_a_dict(
    seed: SimpleNamespace, check_trace: Check
) -> None:
    graph, eager = check_trace(seed.MultiPerspectiveAnalysis, "doc")
    assert deps(graph) == {
        "input:text": (),
        "technical": ("input:text",),
        "business": ("input:text",),
        "user": ("input:text",),
    }
    assert graph.output == {
        "technical": ValueRef("technical"),
        "business": ValueRef("business"),
        "user": ValueRef("user"),
    }
    assert graph.output_ids == ["technical", "business", "user"]
    assert eager == {"technical": "llm<doc>", "business": "llm<doc>", "user": "llm<doc>"}


def test_synthesizer_depends_on_exactly_the_three_analyzers(
    seed: SimpleNamespace, check_trace: Check
) -> None:
    graph, _ = check_trace(seed.Synthesizer, "doc")
    assert list(graph.nodes) == [
        "input:text",
        "analyzer.technical",
        "analyzer.business",
        "analyzer.user",
        "synthesizer",
    ]
    synthesizer = graph.nodes["synthesizer"]
    assert synthesizer.dependencies == (
        "analyzer.technical",
        "analyzer.business",
        "analyzer.user",
    )
    (prompt,) = synthesizer.args
    assert isinstance(prompt, Template)
    assert prompt.parts == (
        "## Technical Perspective\n",
        Slot("analyzer.technical"),
        "\n\n## Business Perspective\n",
        Slot("analyzer.business"),
        "\n\n## User Perspective\n",
        Slot("analyzer.user"),
    )
    assert graph.output == ValueRef("synthesizer")


def test_deep_pipeline_flattens_into_nine_llm_nodes_and_one_input(
    seed: SimpleNamespace, check_trace: Check
) -> None:
    graph, eager = check_trace(seed.DeepPipeline, "doc")
    perspectives = ("stage2.technical", "stage2.business", "stage2.user")
    analyses = ("stage3.analyzer.technical", "stage3.analyzer.business", "stage3.analyzer.user")
    assert deps(graph) == {
        "input:text": (),
        "stage1.summarizer": ("input:text",),
        "stage1.analyzer": ("stage1.summarizer",),
        "stage2.technical": ("stage1.analyzer",),
        "stage2.business": ("stage1.analyzer",),
        "stage2.user": ("stage1.analyzer",),
        "stage3.analyzer.technical": perspectives,
        "stage3.analyzer.business": perspectives,
        "stage3.analyzer.user": perspectives,
        "stage3.synthesizer": analyses,
    }
    # 2 (stage1) + 3 (stage2) + 3 + 1 (stage3's analyzer and synthesizer) LLM calls.
    assert len(graph.nodes) == 10
    assert len(graph.llm_nodes()) == 9
    assert graph.input_ids == ["input:text"]
    assert [n.module_path for n in graph.llm_nodes()] == list(graph.nodes)[1:]
    assert all(n.module_path == n.id for n in graph.llm_nodes())
    assert graph.output_ids == ["stage3.synthesizer"]
    assert eager.startswith("smart_llm<## Technical Perspective\nllm<{'technical': 'llm<smart")


def test_deep_pipeline_records_str_of_a_dict_as_a_repr_template(seed: SimpleNamespace) -> None:
    graph = Tracer().trace(seed.DeepPipeline(), "doc")
    (prompt,) = graph.nodes["stage3.analyzer.user"].args
    assert prompt.parts == (
        "{'technical': ",
        Slot("stage2.technical", "r"),
        ", 'business': ",
        Slot("stage2.business", "r"),
        ", 'user': ",
        Slot("stage2.user", "r"),
        "}",
    )
    replies = {"stage2.technical": "it's fast", "stage2.business": 'say "hi"', "stage2.user": ""}
    assert prompt.render(replies.__getitem__) == str(replies | {}).replace("stage2.", "")


def test_each_llm_node_keeps_its_module(seed: SimpleNamespace) -> None:
    program = seed.DeepPipeline()
    graph = Tracer().trace(program, "doc")
    assert graph.root is program
    modules = dict(program.named_modules())
    for node in graph.llm_nodes():
        assert node.module is modules[node.module_path]


# ----------------------------------------------------------- string building
BUILDERS: dict[str, Callable[[Any, Any], str]] = {
    "f-string": lambda a, b: f"A: {a}\nB: {b}",
    "f-string spec": lambda a, b: f"[{a:>30}] [{b:_<10.3}]",
    "f-string repr": lambda a, b: f"{a!r} vs {b!r}",
    # users call str.format and %-formatting too, so these stay as written
    "format positional": lambda a, b: "{} then {}".format(a, b),  # noqa: UP032
    "format keyword": lambda a, b: "{x} / {y!r}".format(x=a, y=b),  # noqa: UP032
    "format indexed": lambda a, b: "{1}{0}{1}".format(a, b),  # noqa: UP032
    "format_map": lambda a, b: "{a}-{b}".format_map({"a": a, "b": b}),
    "percent": lambda a, b: "%s & %r" % (a, b),  # noqa: UP031
    "plus": lambda a, b: a + " :: " + b,
    "plus on the left": lambda a, b: "<" + a + ">" + ("|" + b),
    "join f-strings": lambda a, b: "\n".join(f"- {x}" for x in (a, b)),
    "join str()": lambda a, b: ", ".join([str(a), str(b), "end"]),
    "str(dict)": lambda a, b: str({"a": a, "b": [b, 1, None]}),
    "repr(list)": lambda a, b: repr([a, (b,)]),
    "nested f-string": lambda a, b: f"outer({f'inner({a})'}, {b})",
}


def _string_program(build: Callable[[Any, Any], str]) -> Callable[[Leaf], Module]:
    class Compose(Module):
        def __init__(self, leaf: Leaf) -> None:
            super().__init__()
            self.first = leaf(alias="one")
            self.second = leaf(alias="two")
            self.final = leaf(alias="three")

        def forward(self, text: str) -> Any:
            return self.final(build(self.first(text), self.second(text)))

    return Compose


@pytest.mark.parametrize("build", BUILDERS.values(), ids=BUILDERS.keys())
def test_string_building_on_traced_values_renders_like_eager(
    build: Callable[[Any, Any], str], check_trace: Check
) -> None:
    graph, eager = check_trace(_string_program(build), "doc's")
    final = graph.nodes["final"]
    (prompt,) = final.args
    assert isinstance(prompt, Template)
    assert set(final.dependencies) == {"first", "second"}
    assert list(final.dependencies) == prompt.refs
    replies = {"first": "one<doc's>", "second": "two<doc's>"}
    assert prompt.render(replies.__getitem__) == build(*replies.values())
    assert eager == f"three<{build(*replies.values())}>"


def test_template_refs_follow_the_order_text_reads_them() -> None:
    graph = Tracer().trace(_string_program(BUILDERS["format indexed"])(LLMInference), "doc")
    assert graph.nodes["final"].dependencies == ("second", "first")


def test_join_directly_over_traced_values(check_trace: Check) -> None:
    graph, _ = check_trace(_string_program(lambda a, b: "\n".join([a, b])), "doc")
    assert graph.nodes["final"].dependencies == ("first", "second")


@pytest.mark.parametrize(
    ("use", "match"),
    [
        (lambda a: a.upper(), r"`\.upper\(\)` \(use F\.upper\)"),
        (lambda a: a.split(","), r"`\.split\(\)`"),
        (lambda a: a < "m", "a `<` comparison"),
        (lambda a: a >= "m", "a `>=` comparison"),
    ],
)
def test_string_methods_and_comparisons_on_traced_text_raise(use, match) -> None:
    with pytest.raises(TracingError, match=match):
        Tracer().trace(_string_program(lambda a, b: use(a))(LLMInference), "doc")


@pytest.mark.parametrize(
    "build",
    [lambda a, b: f"[{a!s:>30}] {b}", lambda a, b: f"[{a!r:<25}|{b!s:^9}]"],
    ids=["str conversion", "repr conversion"],
)
def test_a_conversion_with_a_format_spec_renders_like_eager(check_trace: Check, build) -> None:
    check_trace(_string_program(build), "doc")


def test_a_value_plus_a_value_is_an_add_op(check_trace: Check) -> None:
    graph, eager = check_trace(_string_program(lambda a, b: a + b), "doc")
    assert graph.nodes["F.add"].dependencies == ("first", "second")
    assert graph.nodes["final"].args == (ValueRef("F.add"),)
    assert eager == "three<one<doc>two<doc>>"


def test_a_string_with_no_traced_value_stays_a_literal(check_trace: Check) -> None:
    class Fixed(Module):
        def __init__(self, leaf: Leaf) -> None:
            super().__init__()
            self.llm = leaf(alias="a")

        def forward(self, text: str) -> Any:
            return [self.llm(f"{'constant'} prompt"), self.llm(text)]

    graph, _ = check_trace(Fixed, "doc")
    assert graph.nodes["llm"].args == ("constant prompt",)
    assert graph.nodes["llm"].dependencies == ()


def test_text_output_built_from_traced_values_is_a_template(check_trace: Check) -> None:
    class Report(Module):
        def __init__(self, leaf: Leaf) -> None:
            super().__init__()
            self.title = leaf(alias="t")
            self.body = leaf(alias="b")

        def forward(self, text: str) -> str:
            return f"# {self.title(text)}\n\n{self.body(text)}"

    graph, eager = check_trace(Report, "doc")
    assert isinstance(graph.output, Template)
    assert graph.output_ids == ["title", "body"]
    assert eager == "# t<doc>\n\nb<doc>"


# ------------------------------------------------------------------ outputs
def _output_program(shape: Callable[[Any, Any, Any], Any]) -> Callable[[Leaf], Module]:
    class Shaped(Module):
        def __init__(self, leaf: Leaf) -> None:
            super().__init__()
            self.a = leaf(alias="a")
            self.b = leaf(alias="b")

        def forward(self, text: str) -> Any:
            return shape(self.a(text), self.b(text), text)

    return Shaped


OUTPUTS: dict[str, tuple[Callable[[Any, Any, Any], Any], Any]] = {
    "one-key dict": (lambda a, b, t: {"only": a}, {"only": ValueRef("a")}),
    "dict": (lambda a, b, t: {"x": a, "y": b}, {"x": ValueRef("a"), "y": ValueRef("b")}),
    "list": (lambda a, b, t: [b, a], [ValueRef("b"), ValueRef("a")]),
    "one-item list": (lambda a, b, t: [a], [ValueRef("a")]),
    "tuple": (lambda a, b, t: (a, b), (ValueRef("a"), ValueRef("b"))),
    "nested": (
        lambda a, b, t: {"outer": {"inner": [a, {"b": b}]}, "n": 3, "none": None},
        {"outer": {"inner": [ValueRef("a"), {"b": ValueRef("b")}]}, "n": 3, "none": None},
    ),
    "input passed through": (
        lambda a, b, t: {"in": t, "a": a},
        {"in": ValueRef("input:text"), "a": ValueRef("a")},
    ),
    "empty dict": (lambda a, b, t: {}, {}),
}


@pytest.mark.parametrize(("shape", "recorded"), OUTPUTS.values(), ids=OUTPUTS.keys())
def test_output_keeps_the_exact_structure_forward_returned(
    shape: Callable[[Any, Any, Any], Any], recorded: Any, check_trace: Check
) -> None:
    graph, eager = check_trace(_output_program(shape), "doc")
    assert graph.output == recorded
    assert type(graph.output) is type(recorded)
    assert type(eager) is type(recorded)


def test_a_one_key_dict_output_stays_a_dict(check_trace: Check) -> None:
    graph, eager = check_trace(_output_program(lambda a, b, t: {"answer": b}), "doc")
    assert graph.output == {"answer": ValueRef("b")}
    assert graph.output_ids == ["b"]
    assert eager == {"answer": "b<doc>"}


# ------------------------------------------------------------------- inputs
def test_inputs_become_nodes_and_constants_stay_constants(check_trace: Check) -> None:
    class Many(Module):
        def __init__(self, leaf: Leaf) -> None:
            super().__init__()
            self.llm = leaf(alias="m")

        def forward(
            self, text: str, docs: list[str], n: int, *extra: Any, flag: bool = False, **opts: Any
        ) -> Any:
            return self.llm(f"{text}|{docs[1]}|{n}|{extra}|{flag}|{opts}")

    args = ("t", ["d0", "d1"], 7, "e0", {"k": "v"})
    graph, eager = check_trace(Many, *args, flag=True, mode="fast", limit=None)
    assert graph.input_ids == [
        "input:text",
        "input:docs.0",
        "input:docs.1",
        "input:extra.0",
        "input:extra.1.k",
        "input:opts.mode",
    ]
    assert [graph.nodes[i].input_path for i in graph.input_ids] == [
        ("text",),
        ("docs", 0),
        ("docs", 1),
        ("extra", 0),
        ("extra", 1, "k"),
        ("opts", "mode"),
    ]
    assert all(graph.nodes[i].kind == "input" for i in graph.input_ids)
    assert graph.nodes["llm"].dependencies == (
        "input:text",
        "input:docs.1",
        "input:extra.0",
        "input:extra.1.k",
        "input:opts.mode",
    )
    assert eager == "m<t|d1|7|('e0', {'k': 'v'})|True|{'mode': 'fast', 'limit': None}>"


def test_a_value_argument_becomes_an_input_with_its_kind() -> None:
    seen: list[Value] = []

    class Keep(Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = LLMInference(alias="m")

        def forward(self, data: Any) -> Any:
            seen.append(data)
            return self.llm(data)

    graph = Tracer().trace(Keep(), Value(ValueKind.STRUCTURED, {"a": 1}))
    assert graph.input_ids == ["input:data"]
    (data,) = seen
    assert data.is_symbolic
    assert (data.kind, data.ref) == (ValueKind.STRUCTURED, "input:data")


def test_wrong_arguments_name_the_forward(seed: SimpleNamespace) -> None:
    with pytest.raises(TypeError, match=r"DeepPipeline\.forward\(\): missing a required argument"):
        Tracer().trace(seed.DeepPipeline())
    with pytest.raises(TypeError, match=r"DeepPipeline\.forward\(\): too many positional"):
        Tracer().trace(seed.DeepPipeline(), "a", "b")


def nested(depth: int, leaf: Any = "leaf") -> Any:
    """Returns ``leaf`` inside ``depth`` lists."""
    for _ in range(depth):
        leaf = [leaf]
    return leaf


class AskWithContext(Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference(alias="llm")

    def forward(self, question: str, context: Any = None) -> Any:
        return {"answer": self.llm(question), "context": context}


async def test_an_input_at_the_depth_limit_runs() -> None:
    async with scripted() as (server, manager):
        output = await AskWithContext().bind(manager)("q", context=nested(MAX_INPUT_DEPTH))
    assert output["answer"] == "echo: q" and output["context"] == nested(MAX_INPUT_DEPTH)
    assert server.stats.requests == 1


@pytest.mark.parametrize("depth", [MAX_INPUT_DEPTH + 1, 500, 5000])
async def test_an_input_nested_too_deep_is_refused_before_any_call(depth: int) -> None:
    async with scripted() as (server, manager):
        program = AskWithContext().bind(manager)
        with pytest.raises(TracingError) as raised:
            await program("q", context=nested(depth))
        with pytest.raises(
            TracingError, match=r"positional argument 1 nests .* \(at args\[1\]\[0\]"
        ):
            await program("q", nested(depth))
    assert re.match(
        r"argument 'context' nests lists, tuples or dicts more than 100 levels deep "
        r"\(at context\[0\]\[0\]\[0\]\[0\]\[0\]\[0\]\[…\], level 101\).*Flatten",
        str(raised.value),
    )
    assert server.stats.requests == 0


def test_a_self_containing_or_deep_input_is_refused_by_the_tracer_too() -> None:
    loop: list[Any] = ["x"]
    loop.append(loop)
    with pytest.raises(TracingError, match=r"argument 'context' .* \(at context\[1\]\[1\]"):
        Tracer().trace(AskWithContext(), "q", context=loop)
    deep = {"k": nested(MAX_INPUT_DEPTH)}
    with pytest.raises(TracingError, match=r"\(at context\['k'\]\[0\]"):
        Tracer().trace(AskWithContext(), "q", context=deep)


# -------------------------------------------------------------------- leaves
class Agent(Module):
    """Data-dependent control flow: an async forward runs eagerly as one node."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference(alias="agent")

    async def forward(self, task: str) -> str:
        reply = await self.llm(task)
        return reply if reply else "nothing"


class Retriever(Module):
    """Marked as a leaf although it holds an LLM."""

    _plait_leaf = True

    def __init__(self) -> None:
        super().__init__()
        self.rewrite = LLMInference(alias="rewrite")

    def forward(self, query: str) -> list[str]:
        return [query]


class Shout(Module):
    """Plain Python: no LLM below, so one step."""

    def forward(self, text: str) -> str:
        return text.upper() if text else ""


class Mixed(Module):
    def __init__(self) -> None:
        super().__init__()
        self.agent = Agent()
        self.retriever = Retriever()
        self.shout = Shout()
        self.llm = LLMInference(alias="final")

    def forward(self, text: str) -> Any:
        found = self.retriever(self.shout(text))
        return self.llm(f"{self.agent(text)} {found}")


def test_async_leaf_and_plain_modules_are_single_nodes() -> None:
    program = Mixed()
    graph = Tracer().trace(program, "doc")
    graph.lint()
    assert deps(graph) == {
        "input:text": (),
        "shout": ("input:text",),
        "retriever": ("shout",),
        "agent": ("input:text",),
        "llm": ("agent", "retriever"),
    }
    for path, cls in [("agent", Agent), ("retriever", Retriever), ("shout", Shout)]:
        node = graph.nodes[path]
        assert node.kind == "call"
        assert node.module is getattr(program, path)
        assert node.name == cls.__name__
        assert node.module_path == path
    assert "agent.llm" not in graph.nodes
    assert "retriever.rewrite" not in graph.nodes
    assert [n.id for n in graph.llm_nodes()] == ["llm"]


def test_is_leaf_module_classifies_modules() -> None:
    program = Mixed()
    assert is_leaf_module(program.agent)
    assert is_leaf_module(program.retriever)
    assert is_leaf_module(program.shout)
    assert is_leaf_module(program.llm)
    assert not is_leaf_module(program)


def test_a_composite_holding_an_async_leaf_is_followed() -> None:
    class Outer(Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Agent()
            self.shout = Shout()

        def forward(self, text: str) -> Any:
            return self.shout(self.inner(text))

    graph = Tracer().trace(Outer(), "doc")
    assert list(graph.nodes) == ["input:text", "inner", "shout"]


def test_a_root_without_llms_is_one_node(evaluate: Evaluate) -> None:
    graph = Tracer().trace(Shout(), "doc")
    assert list(graph.nodes) == ["input:text", "Shout"]
    node = graph.nodes["Shout"]
    assert (node.module_path, node.dependencies) == ("", ("input:text",))
    assert evaluate(graph, "doc") == "DOC"


def test_calling_the_same_module_again_numbers_the_ids(check_trace: Check) -> None:
    class Thrice(Module):
        def __init__(self, leaf: Leaf) -> None:
            super().__init__()
            self.x = leaf(alias="x")

        def forward(self, text: str) -> Any:
            return self.x(self.x(text)), self.x(text)

    graph, eager = check_trace(Thrice, "doc")
    assert deps(graph) == {
        "input:text": (),
        "x": ("input:text",),
        "x_2": ("x",),
        "x_3": ("input:text",),
    }
    assert {graph.nodes[i].module_path for i in ("x", "x_2", "x_3")} == {"x"}
    assert graph.nodes["x"].module is graph.nodes["x_3"].module
    assert eager == ("x<x<doc>>", "x<doc>")


def test_a_repeat_id_never_collides_with_a_module_named_like_it() -> None:
    class Numbered(Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = LLMInference(alias="first")
            self.llm_2 = LLMInference(alias="second")

        def forward(self, text: str) -> Any:
            return self.llm_2(self.llm(self.llm(text)))

    graph = Tracer().trace(Numbered(), "doc")
    graph.lint()
    assert deps(graph) == {
        "input:text": (),
        "llm": ("input:text",),
        "llm_2": ("llm",),
        "llm_2_2": ("llm_2",),
    }
    assert [graph.nodes[i].module.alias for i in ("llm", "llm_2", "llm_2_2")] == [
        "first",
        "first",
        "second",
    ]
    assert graph.nodes["llm_2_2"].module_path == "llm_2"


def test_a_module_shared_under_two_names_is_named_by_its_first_path() -> None:
    class Shared(Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = LLMInference(alias="s")
            self.second = self.first

        def forward(self, text: str) -> Any:
            return self.second(self.first(text))

    graph = Tracer().trace(Shared(), "doc")
    assert list(graph.nodes) == ["input:text", "first", "first_2"]


def test_unregistered_modules_are_named_under_their_caller() -> None:
    class Inner(Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = LLMInference(alias="i")
            self.helpers = [Shout()]  # a plain list does not register

        def forward(self, text: str) -> Any:
            return self.llm(self.helpers[0](Shout()(text)))

    class Outer(Module):
        def __init__(self) -> None:
            super().__init__()
            self.stage = Inner()

        def forward(self, text: str) -> Any:
            return self.stage(text)

    graph = Tracer().trace(Outer(), "doc")
    assert list(graph.nodes) == ["input:text", "stage.shout", "stage.shout_2", "stage.llm"]


def test_nodes_remember_the_line_that_called_them() -> None:
    class Sited(Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = LLMInference(alias="s")

        def forward(self, text: str) -> Any:
            return F.strip(self.llm(text))  # site-of-call

    graph = Tracer().trace(Sited(), "doc")
    assert graph.nodes["llm"].source == line_of("site-of-call")
    assert graph.nodes["F.strip"].source == line_of("site-of-call")
    assert graph.nodes["input:text"].source is None


def test_dependencies_and_parameters_list_refs_in_reading_order() -> None:
    class Reads(Module):
        def __init__(self) -> None:
            super().__init__()
            self.tone = Parameter("calm", description="Tone of every reply.")
            self.a = LLMInference(alias="a")
            self.b = LLMInference(alias="b")
            self.c = LLMInference(alias="c")

        def forward(self, text: str, notes: list[str]) -> Any:
            a, b = self.a(text), self.b(notes[0])
            return self.c(
                [f"{b} {self.tone}", {"k": (a, notes[1])}], extra=f"{text}{a}", style=self.tone
            )

    graph = Tracer().trace(Reads(), "doc", ["n0", "n1"])
    graph.lint()
    node = graph.nodes["c"]
    assert node.dependencies == ("b", "a", "input:notes.1", "input:text")
    assert node.parameters == ("param:tone",)
    read = list(dict.fromkeys(iter_refs((node.args, node.kwargs))))
    assert read == ["b", "param:tone", "a", "input:notes.1", "input:text"]


# ---------------------------------------------------------------- parameters
class Assistant(Module):
    """Seed 000's AssistantGeneration: a learnable instruction formatted into the prompt."""

    def __init__(self, leaf: Leaf) -> None:
        super().__init__()
        self.assistant_instructions = Parameter(
            "Answer kindly.", description="Defines the assistant's core behavior and tone."
        )
        self.llm = leaf(alias="assistant_llm")

    def forward(self, request: str) -> Any:
        full_prompt = f"{self.assistant_instructions}\n\nUser: {request}"
        return self.llm(full_prompt)


def test_a_parameter_in_an_f_string_is_a_parameter_ref_not_a_dependency(check_trace: Check) -> None:
    graph, eager = check_trace(Assistant, "hi")
    node = graph.nodes["llm"]
    assert node.dependencies == ("input:request",)
    assert node.parameters == ("param:assistant_instructions",)
    (prompt,) = node.args
    assert prompt.parts == (
        Slot("param:assistant_instructions"),
        "\n\nUser: ",
        Slot("input:request"),
    )
    assert "param:assistant_instructions" not in graph.nodes
    assert eager == "assistant_llm<Answer kindly.\n\nUser: hi>"


def test_nested_parameters_are_named_by_their_full_path() -> None:
    class Wrapper(Module):
        def __init__(self) -> None:
            super().__init__()
            self.stage1 = Assistant(LLMInference)
            self.llm = LLMInference(alias="w")

        def forward(self, text: str) -> Any:
            return self.llm(self.stage1.assistant_instructions), self.stage1(text)

    graph = Tracer().trace(Wrapper(), "hi")
    graph.lint()
    assert graph.nodes["llm"].args == (ValueRef("param:stage1.assistant_instructions"),)
    assert graph.nodes["llm"].dependencies == ()
    assert graph.nodes["stage1.llm"].parameters == ("param:stage1.assistant_instructions",)


def test_a_parameter_is_read_when_the_graph_runs_not_when_traced(evaluate: Evaluate) -> None:
    program = Assistant(LLMInference)
    graph = Tracer().trace(program, "hi")
    program.assistant_instructions.value = "Answer briefly."
    assert evaluate(graph, "hi") == "assistant_llm<Answer briefly.\n\nUser: hi>"


# ------------------------------------------------------------- TracingError
class Decides(Module):
    """Makes one Python decision on a traced reply, chosen by ``case``."""

    def __init__(self, case: str) -> None:
        super().__init__()
        self.case = case
        self.llm = LLMInference(alias="d")

    def forward(self, text: str) -> Any:
        reply = self.llm(text)
        case = self.case
        if case == "if":
            if reply:  # refuse-if
                return text
        elif case == "while":
            while reply:  # refuse-while
                break
        elif case == "bool":
            return bool(reply)  # refuse-bool
        elif case == "or":
            return reply or "fallback"  # refuse-or
        elif case == "not":
            return not reply  # refuse-not
        elif case == "len":
            return len(reply)  # refuse-len
        elif case == "in":
            return "yes" in reply  # refuse-in
        elif case == "in list":
            return reply in ["yes", "no"]  # refuse-in list
        elif case == "in set":
            return reply in {"yes", "no"}  # refuse-in set
        elif case == "int":
            return int(reply)  # refuse-int
        elif case == "float":
            return float(reply)  # refuse-float
        elif case == "for":
            return [part for part in reply]  # refuse-for
        elif case == "unpack":
            first, _ = reply  # refuse-unpack
            return first
        elif case == "list":
            return list(reply)  # refuse-list
        elif case == "==":
            return reply == "yes"  # refuse-==
        elif case == "!=":
            return "no" != reply  # noqa: SIM300 - reflected on purpose  # refuse-!=
        elif case == "index":
            return ["a", "b"][reply]  # refuse-index
        elif case == "dict":
            return dict(reply)  # refuse-dict
        elif case == "keys":
            return reply.keys()  # refuse-keys
        elif case == "items":
            return reply.items()  # refuse-items
        elif case == "values":
            return reply.values()  # refuse-values
        elif case == "to_dict":
            return reply.to_dict()  # refuse-to_dict
        return reply


FIELDS_UNKNOWN = (
    "(the fields are known only at run time: return the value itself, whose fields stay "
    'fields, or pick them by name: {"answer": value.answer})'
)
REFUSALS = {
    "if": "an `if`/`while` condition or `bool()`",
    "while": "an `if`/`while` condition or `bool()`",
    "bool": "an `if`/`while` condition or `bool()`",
    "or": "an `if`/`while` condition or `bool()`",
    "not": "an `if`/`while` condition or `bool()`",
    "len": "`len()`",
    "in": "an `in` test",
    "in list": "an `==` comparison",
    "in set": "a dict key, a set, or an `in` test on a dict or set",
    "int": "`int()`",
    "float": "`float()`",
    "for": "iteration (a `for` loop or unpacking)",
    "unpack": "iteration (a `for` loop or unpacking)",
    "list": "iteration (a `for` loop or unpacking)",
    "==": "an `==` comparison",
    "!=": "an `==` comparison",
    "index": "an index or slice",
    "dict": f"`dict()` or the mapping method `.keys()` {FIELDS_UNKNOWN}",
    "keys": f"`dict()` or the mapping method `.keys()` {FIELDS_UNKNOWN}",
    "items": f"the mapping method `.items()` {FIELDS_UNKNOWN}",
    "values": f"the mapping method `.values()` {FIELDS_UNKNOWN}",
    "to_dict": f"the mapping method `.to_dict()` {FIELDS_UNKNOWN}",
}


class Holder(Module):
    def __init__(self, case: str) -> None:
        super().__init__()
        self.stage1 = LLMInference(alias="s1")
        self.stage2 = Decides(case)

    def forward(self, text: str) -> Any:
        return self.stage2(self.stage1(text))


@pytest.mark.parametrize(("case", "action"), REFUSALS.items(), ids=REFUSALS.keys())
def test_python_decisions_on_traced_values_raise_tracing_error(case: str, action: str) -> None:
    site = line_of(f"refuse-{case}")
    expected = (
        f"stage2 ({site}) used a traced value in {action}; its value "
        "(the output of stage2.llm) is unknown until run time. "
        "Make `forward` async (`async def forward`) to work with real values, "
        "or express the step with an `F.*` op"
    )
    with pytest.raises(TracingError, match=re.escape(expected)) as info:
        Tracer().trace(Holder(case), "doc")
    message = str(info.value)
    assert "F.select, F.coerce" in message
    code = Path(__file__).read_text().splitlines()[int(site.split(":")[1]) - 1].strip()
    assert message.endswith(f"\n    {code}")


def test_a_decision_in_the_root_forward_names_the_root_class() -> None:
    with pytest.raises(
        TracingError, match=r"^Decides \(test_tracer\.py:\d+\) used a traced value in `len\(\)`"
    ):
        Tracer().trace(Decides("len"), "doc")


def test_a_decision_deep_in_the_tree_names_the_full_path() -> None:
    class Middle(Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Decides("int")

        def forward(self, text: str) -> Any:
            return self.inner(text)

    class Top(Module):
        def __init__(self) -> None:
            super().__init__()
            self.stage3 = Middle()

        def forward(self, text: str) -> Any:
            return self.stage3(text)

    with pytest.raises(
        TracingError, match=r"^stage3\.inner \(test_tracer\.py:\d+\) .* stage3\.inner\.llm\)"
    ):
        Tracer().trace(Top(), "doc")


def test_a_decision_on_a_traced_input_names_the_input() -> None:
    class OnInput(Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = LLMInference(alias="x")

        def forward(self, text: str) -> Any:
            return self.llm(text) if text else None

    with pytest.raises(TracingError, match=r"\(the output of input:text\)"):
        Tracer().trace(OnInput(), "doc")


def test_a_failed_trace_leaves_no_trace_active() -> None:
    with pytest.raises(TracingError):
        Tracer().trace(Holder("len"), "doc")
    assert Shout()("ok") == "OK"
    assert F.upper("x").payload == "X"


def test_an_async_forward_may_branch_because_it_is_not_traced_inside() -> None:
    graph = Tracer().trace(Agent(), "task")
    assert list(graph.nodes) == ["input:task", "Agent"]


def test_echo_leaves_have_no_llm_so_programs_built_from_them_run_directly(
    seed: SimpleNamespace,
) -> None:
    assert is_leaf_module(seed.DeepPipeline(seed.Echo))
    assert seed.SummarizeAndAnalyze(seed.Echo)("x") == "smart_llm<fast_llm<x>>"
