"""Tests of plait.tracing.graph: queries, lint, structural hash, templates."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Literal

import pydantic
import pytest

import plait.functional as F
from plait import LLMInference, Module, ValueRef
from plait.tracing import InferenceGraph, Node, Slot, Template, Tracer, substitute


@pytest.fixture
def deep(seed: SimpleNamespace) -> InferenceGraph:
    return Tracer().trace(seed.DeepPipeline(), "doc")


STAGE2 = {"stage2.technical", "stage2.business", "stage2.user"}
STAGE3_ANALYZERS = {"stage3.analyzer.technical", "stage3.analyzer.business", "stage3.analyzer.user"}


# ------------------------------------------------------------------ queries
def test_topological_order_puts_every_node_after_its_dependencies(deep: InferenceGraph) -> None:
    order = deep.topological_order()
    assert order == list(deep.nodes)
    position = {node_id: i for i, node_id in enumerate(order)}
    for node in deep:
        assert all(position[dep] < position[node.id] for dep in node.dependencies)


def test_ancestors_are_everything_a_node_reads_transitively(deep: InferenceGraph) -> None:
    assert deep.ancestors("input:text") == set()
    assert deep.ancestors("stage1.analyzer") == {"input:text", "stage1.summarizer"}
    assert deep.ancestors("stage3.analyzer.user") == {
        "input:text",
        "stage1.summarizer",
        "stage1.analyzer",
        *STAGE2,
    }
    assert deep.ancestors("stage3.synthesizer") == set(deep.nodes) - {"stage3.synthesizer"}


def test_descendants_are_everything_that_reads_a_node_transitively(deep: InferenceGraph) -> None:
    assert deep.descendants("stage3.synthesizer") == set()
    assert deep.descendants("stage2.business") == {*STAGE3_ANALYZERS, "stage3.synthesizer"}
    assert deep.descendants("input:text") == set(deep.nodes) - {"input:text"}


def test_dependents_invert_dependencies(deep: InferenceGraph) -> None:
    dependents = deep.dependents
    assert set(dependents) == set(deep.nodes)
    assert dependents["stage1.analyzer"] == ["stage2.technical", "stage2.business", "stage2.user"]
    assert dependents["stage2.user"] == sorted(STAGE3_ANALYZERS, key=list(deep.nodes).index)
    assert dependents["stage3.synthesizer"] == []
    assert deep.dependents is dependents  # computed once


def test_queries_on_an_unknown_node_name_the_known_ones(deep: InferenceGraph) -> None:
    with pytest.raises(KeyError, match=r"no node 'stage9' in graph; nodes: input:text, stage1"):
        deep.ancestors("stage9")
    with pytest.raises(KeyError, match="stage9"):
        deep.descendants("stage9")


def test_a_diamond_counts_shared_ancestors_once() -> None:
    class Diamond(Module):
        def __init__(self) -> None:
            super().__init__()
            self.left = LLMInference(alias="l")
            self.right = LLMInference(alias="r")
            self.join = LLMInference(alias="j")

        def forward(self, text: str) -> Any:
            top = F.strip(text)
            return self.join(f"{self.left(top)} {self.right(top)}")

    graph = Tracer().trace(Diamond(), "doc")
    graph.lint()
    assert graph.ancestors("join") == {"input:text", "F.strip", "left", "right"}
    assert graph.descendants("F.strip") == {"left", "right", "join"}
    assert graph.dependents["F.strip"] == ["left", "right"]


def test_graph_is_sized_iterable_and_readable(deep: InferenceGraph) -> None:
    assert len(deep) == 10
    assert [node.id for node in deep] == list(deep.nodes)
    assert repr(deep) == (
        "InferenceGraph(10 nodes, inputs=['input:text'], outputs=['stage3.synthesizer'])"
    )
    assert repr(deep.nodes["stage1.analyzer"]) == (
        "Node('stage1.analyzer', call, LLMInference, deps=[stage1.summarizer])"
    )


def test_llm_nodes_skip_inputs_ops_and_other_leaves() -> None:
    class Plain(Module):
        def forward(self, text: str) -> str:
            return text

    class Mix(Module):
        def __init__(self) -> None:
            super().__init__()
            self.plain = Plain()
            self.llm = LLMInference(alias="m")

        def forward(self, text: str) -> Any:
            return F.upper(self.llm(self.plain(text)))

    graph = Tracer().trace(Mix(), "doc")
    assert [n.id for n in graph] == ["input:text", "plain", "llm", "F.upper"]
    assert [n.id for n in graph.llm_nodes()] == ["llm"]


# --------------------------------------------------------------------- lint
def test_lint_accepts_traced_graphs(deep: InferenceGraph) -> None:
    deep.lint()


def _broken(seed: SimpleNamespace) -> InferenceGraph:
    return Tracer().trace(seed.SummarizeAndAnalyze(), "doc")


def test_lint_reports_an_unknown_dependency(seed: SimpleNamespace) -> None:
    graph = _broken(seed)
    graph.nodes["analyzer"].dependencies = ("summarizer", "ghost")
    with pytest.raises(ValueError, match=r"analyzer: unknown dependency 'ghost'"):
        graph.lint()


def test_lint_reports_a_dependency_recorded_later(seed: SimpleNamespace) -> None:
    graph = _broken(seed)
    graph.nodes = {key: graph.nodes[key] for key in ("input:text", "analyzer", "summarizer")}
    with pytest.raises(ValueError, match=r"analyzer: dependency 'summarizer' is not earlier"):
        graph.lint()


def test_lint_reports_a_ref_that_is_not_a_declared_dependency(seed: SimpleNamespace) -> None:
    graph = _broken(seed)
    graph.nodes["analyzer"].args = (Template(("a", Slot("summarizer"), Slot("input:text"))),)
    with pytest.raises(ValueError, match=r"analyzer: reads undeclared \['input:text'\]"):
        graph.lint()


def test_lint_reports_an_unknown_output(seed: SimpleNamespace) -> None:
    graph = _broken(seed)
    graph.output_ids = ["analyzer", "nowhere"]
    with pytest.raises(ValueError, match=r"output reads unknown node 'nowhere'"):
        graph.lint()


def test_lint_lists_every_problem_at_once(seed: SimpleNamespace) -> None:
    graph = _broken(seed)
    graph.nodes["summarizer"].dependencies = ("ghost",)
    graph.output_ids = ["nowhere"]
    with pytest.raises(ValueError) as info:
        graph.lint()
    assert str(info.value) == (
        "malformed InferenceGraph:\n"
        "  summarizer: unknown dependency 'ghost'\n"
        "  summarizer: reads undeclared ['input:text']\n"
        "  output reads unknown node 'nowhere'"
    )


def test_lint_allows_parameter_refs_that_are_not_nodes() -> None:
    node = Node(
        id="llm", kind="call", args=(ValueRef("param:prompt"),), parameters=("param:prompt",)
    )
    InferenceGraph({"llm": node}, [], ValueRef("llm"), ["llm", "param:prompt"]).lint()


# ----------------------------------------------------------- structural hash
def _hash(program: Module, *args: Any) -> str:
    return Tracer().trace(program, *args).structural_hash()


def test_the_same_program_traced_twice_has_the_same_hash(seed: SimpleNamespace) -> None:
    first = _hash(seed.DeepPipeline(), "doc")
    assert len(first) == 64
    assert _hash(seed.DeepPipeline(), "doc") == first
    assert _hash(seed.DeepPipeline(), "a different document") == first


def test_the_hash_is_computed_once(deep: InferenceGraph) -> None:
    first = deep.structural_hash()
    deep.nodes.clear()
    assert deep.structural_hash() == first


class Typed(pydantic.BaseModel):
    label: str


def _set(path: str, name: str, value: Any) -> Any:
    def change(program: Module) -> None:
        setattr(dict(program.named_modules())[path], name, value)

    return change


CHANGES = {
    "temperature": _set("stage1.summarizer", "temperature", 0.0),
    "max_tokens": _set("stage2.user", "max_tokens", 64),
    "alias": _set("stage3.synthesizer", "alias", "other_llm"),
    "response_format": _set("stage1.analyzer", "response_format", Typed),
    "module type": lambda p: setattr(
        p.stage3, "synthesizer", type("Synth", (LLMInference,), {})(alias="smart_llm")
    ),
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_changing_a_leaf_setting_changes_the_hash(seed: SimpleNamespace, change: Any) -> None:
    program = seed.DeepPipeline()
    before = _hash(program, "doc")
    change(program)
    assert _hash(program, "doc") != before


@pytest.mark.parametrize(
    ("first", "second"),
    [(list[str], list[int]), (Literal["a", "b"], Literal["a", "c"]), (Typed, list[Typed])],
    ids=["list item type", "literal values", "model vs list of model"],
)
def test_generic_response_formats_are_told_apart(first: Any, second: Any) -> None:
    class Classify(Module):
        def __init__(self, fmt: Any) -> None:
            super().__init__()
            self.llm = LLMInference(alias="c", response_format=fmt)

        def forward(self, text: str) -> Any:
            return self.llm(text)

    assert _hash(Classify(first), "x") != _hash(Classify(second), "x")
    assert _hash(Classify(first), "x") == _hash(Classify(first), "x")


def test_changing_the_structure_changes_the_hash(seed: SimpleNamespace) -> None:
    class Prompted(Module):
        def __init__(self, template: str, extra: bool) -> None:
            super().__init__()
            self.llm = LLMInference(alias="p")
            self.template = template
            self.extra = extra

        def forward(self, text: str) -> Any:
            reply = self.llm(self.template.format(text))
            return F.strip(reply) if self.extra else reply

    base = _hash(Prompted("Summarize: {}", False), "doc")
    assert _hash(Prompted("Summarize: {}", False), "doc") == base
    assert _hash(Prompted("Translate: {}", False), "doc") != base
    assert _hash(Prompted("Summarize: {}", True), "doc") != base
    assert _hash(seed.SummarizeAndAnalyze(), "doc") != _hash(seed.DeepPipeline(), "doc")


def test_constants_are_part_of_the_hash_but_input_text_is_not() -> None:
    class Counted(Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = LLMInference(alias="c")

        def forward(self, text: str, n: int) -> Any:
            return self.llm(f"{text} x{n}")

    assert _hash(Counted(), "a", 3) == _hash(Counted(), "b", 3)
    assert _hash(Counted(), "a", 3) != _hash(Counted(), "a", 4)


def test_output_structure_is_part_of_the_hash(seed: SimpleNamespace) -> None:
    class Wrap(Module):
        def __init__(self, as_dict: bool) -> None:
            super().__init__()
            self.inner = seed.SummarizeAndAnalyze()
            self.as_dict = as_dict

        def forward(self, text: str) -> Any:
            out = self.inner(text)
            return {"analysis": out} if self.as_dict else out

    assert _hash(Wrap(True), "doc") != _hash(Wrap(False), "doc")


def test_prompts_are_state_not_structure(seed: SimpleNamespace) -> None:
    """Optimizers rewrite prompts between steps; that must not force a re-trace."""
    program = seed.SummarizeAndAnalyze()
    before = _hash(program, "doc")
    program.summarizer.system_prompt.value = "Be extremely brief."
    assert _hash(program, "doc") == before


# ------------------------------------------------------- templates, substitute
def test_template_renders_str_spec_and_repr_slots() -> None:
    template = Template(("<", Slot("a"), "|", Slot("b", "s", ">5"), "|", Slot("a", "r"), ">"))
    values = {"a": "it's", "b": 42}
    assert template.render(values.__getitem__) == "<it's|   42|\"it's\">"
    assert template.refs == ["a", "b"]
    assert repr(template) == "Template('<{a}|{b}|{a}>')"


def test_substitute_fills_refs_and_templates_keeping_containers() -> None:
    recorded = {
        "x": ValueRef("a"),
        "y": [Template(("n=", Slot("b"))), (ValueRef("b"), 3)],
        "z": "plain",
    }
    values = {"a": {"k": 1}, "b": 2}
    assert substitute(recorded, values.__getitem__) == {
        "x": {"k": 1},
        "y": ["n=2", (2, 3)],
        "z": "plain",
    }
