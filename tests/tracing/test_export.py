"""Tests of plait.tracing.export: Mermaid and DOT printouts, pinned as text snapshots."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import plait.functional as F
from plait import LLMInference, Module, ValueRef
from plait.tracing import InferenceGraph, Node, Tracer

SUMMARIZE_AND_ANALYZE_MERMAID = """\
graph TD
    input_text(["input:text"])
    summarizer["summarizer<br/>LLMInference"]
    analyzer["analyzer<br/>LLMInference"]
    input_text --> summarizer
    summarizer --> analyzer"""

SUMMARIZE_AND_ANALYZE_DOT = """\
digraph plait {
    rankdir=TB;
    "input:text" [label="input:text", shape=ellipse];
    "summarizer" [label="summarizer\\nLLMInference", shape=box];
    "analyzer" [label="analyzer\\nLLMInference", shape=box];
    "input:text" -> "summarizer";
    "summarizer" -> "analyzer";
}"""


def test_summarize_and_analyze_mermaid_snapshot(seed: SimpleNamespace) -> None:
    graph = Tracer().trace(seed.SummarizeAndAnalyze(), "doc")
    assert graph.to_mermaid() == SUMMARIZE_AND_ANALYZE_MERMAID


def test_summarize_and_analyze_dot_snapshot(seed: SimpleNamespace) -> None:
    graph = Tracer().trace(seed.SummarizeAndAnalyze(), "doc")
    assert graph.to_dot() == SUMMARIZE_AND_ANALYZE_DOT


class Tidy(Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference(alias="t")

    def forward(self, text: str) -> Any:
        return F.strip(self.llm(text))


class Pipeline(Module):
    def __init__(self) -> None:
        super().__init__()
        self.stage1 = Tidy()

    def forward(self, text: str) -> Any:
        cleaned = self.stage1(text)
        return F.upper(cleaned), F.lower(cleaned)


def test_ops_show_where_they_ran_in_both_formats() -> None:
    graph = Tracer().trace(Pipeline(), "doc")
    assert graph.to_mermaid() == (
        "graph TD\n"
        '    input_text(["input:text"])\n'
        '    stage1_llm["stage1.llm<br/>LLMInference"]\n'
        '    F_strip["F.strip in stage1"]\n'
        '    F_upper["F.upper"]\n'
        '    F_lower["F.lower"]\n'
        "    input_text --> stage1_llm\n"
        "    stage1_llm --> F_strip\n"
        "    F_strip --> F_upper\n"
        "    F_strip --> F_lower"
    )
    assert graph.to_dot() == (
        "digraph plait {\n"
        "    rankdir=TB;\n"
        '    "input:text" [label="input:text", shape=ellipse];\n'
        '    "stage1.llm" [label="stage1.llm\\nLLMInference", shape=box];\n'
        '    "F.strip" [label="F.strip in stage1", shape=note];\n'
        '    "F.upper" [label="F.upper", shape=note];\n'
        '    "F.lower" [label="F.lower", shape=note];\n'
        '    "input:text" -> "stage1.llm";\n'
        '    "stage1.llm" -> "F.strip";\n'
        '    "F.strip" -> "F.upper";\n'
        '    "F.strip" -> "F.lower";\n'
        "}"
    )


def test_every_node_and_dependency_appears_once(seed: SimpleNamespace) -> None:
    graph = Tracer().trace(seed.DeepPipeline(), "doc")
    mermaid = graph.to_mermaid().splitlines()
    dot = graph.to_dot().splitlines()
    edges = sum(len(node.dependencies) for node in graph)
    assert len(mermaid) == 1 + len(graph) + edges
    assert len([line for line in mermaid if "-->" in line]) == edges == 17
    assert len([line for line in dot if "->" in line]) == edges
    assert '    "stage2.user" -> "stage3.analyzer.technical";' in dot
    assert "    stage3_analyzer_user --> stage3_synthesizer" in mermaid


def test_mermaid_ids_stay_unique_when_punctuation_is_replaced() -> None:
    class Clash(Module):
        def __init__(self) -> None:
            super().__init__()
            self.input_text = LLMInference(alias="a")
            self.F_upper = LLMInference(alias="b")
            self.end = LLMInference(alias="c")

        def forward(self, text: str) -> Any:
            return self.end(self.F_upper(F.upper(self.input_text(text))))

    mermaid = Tracer().trace(Clash(), "doc").to_mermaid()
    assert mermaid == (
        "graph TD\n"
        '    input_text(["input:text"])\n'
        '    input_text_2["input_text<br/>LLMInference"]\n'
        '    F_upper["F.upper"]\n'
        '    F_upper_2["F_upper<br/>LLMInference"]\n'
        '    end_2["end<br/>LLMInference"]\n'
        "    input_text --> input_text_2\n"
        "    input_text_2 --> F_upper\n"
        "    F_upper --> F_upper_2\n"
        "    F_upper_2 --> end_2"
    )


def test_quotes_and_backslashes_are_escaped() -> None:
    nodes = {
        'say "hi"': Node(id='say "hi"', kind="input"),
        "back\\slash": Node(
            id="back\\slash",
            kind="call",
            name="Quote",
            args=(ValueRef('say "hi"'),),
            dependencies=('say "hi"',),
        ),
    }
    graph = InferenceGraph(nodes, ['say "hi"'], ValueRef("back\\slash"), ["back\\slash"])
    assert graph.to_dot().splitlines()[2:5] == [
        '    "say \\"hi\\"" [label="say \\"hi\\"", shape=ellipse];',
        '    "back\\\\slash" [label="back\\\\slash\\nQuote", shape=box];',
        '    "say \\"hi\\"" -> "back\\\\slash";',
    ]
    assert graph.to_mermaid().splitlines()[1:] == [
        '    say__hi_(["say #quot;hi#quot;"])',
        '    back_slash["back\\slash<br/>Quote"]',
        "    say__hi_ --> back_slash",
    ]
