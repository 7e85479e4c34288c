"""Shared programs and helpers for the tracing tests.

The seed's example programs (``000``) are built with a ``leaf`` factory so the
same code can be traced with `LLMInference` leaves and run eagerly with
`Echo` leaves (plain modules with no LLM below, which run directly). A
reference interpreter runs a traced graph with the same echo rule, so a test
can assert that tracing records exactly what eager Python computes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from plait import LLMInference, Module
from plait.tracing import InferenceGraph, Tracer, substitute
from plait.values import Value, unwrap
from seed_programs import (
    DeepPipeline,
    Leaf,
    MultiPerspectiveAnalysis,
    SummarizeAndAnalyze,
    Synthesizer,
)


class Echo(Module):
    """Stands in for an LLM when a program runs eagerly: replies ``alias<prompt>``."""

    def __init__(self, alias: str, system_prompt: str = "", **settings: Any) -> None:
        super().__init__()
        self.alias = alias

    def forward(self, prompt: Any) -> str:
        return echo(self.alias, prompt)


def echo(alias: str, prompt: Any) -> str:
    """The reply both `Echo` and the reference interpreter give."""
    return f"{alias}<{prompt}>"


SEED = SimpleNamespace(
    SummarizeAndAnalyze=SummarizeAndAnalyze,
    MultiPerspectiveAnalysis=MultiPerspectiveAnalysis,
    Synthesizer=Synthesizer,
    DeepPipeline=DeepPipeline,
    Echo=Echo,
)


@pytest.fixture
def seed() -> SimpleNamespace:
    """The seed's example program classes, plus `Echo`."""
    return SEED


def evaluate(graph: InferenceGraph, *args: Any, **kwargs: Any) -> Any:
    """Runs a traced graph in recording order, answering each LLM call with `echo`.

    Input nodes take their data from the call arguments (following
    ``input_path``), op nodes run their function, other leaf modules run
    directly; ValueRefs and Templates are filled by `substitute`, with
    ``param:<name>`` refs read from the root's parameters.
    """
    bound = inspect.signature(graph.root.forward).bind(*args, **kwargs).arguments
    results: dict[str, Any] = {
        f"param:{name}": param.value for name, param in graph.root.named_parameters()
    }
    for node_id in graph.topological_order():
        node = graph.nodes[node_id]
        if node.kind == "input":
            data: Any = bound
            for key in node.input_path:
                data = data[key]
            results[node_id] = unwrap(data)
            continue
        call_args = substitute(node.args, results.__getitem__)
        call_kwargs = substitute(node.kwargs, results.__getitem__)
        if node.kind == "op":
            out = node.op(*call_args, **call_kwargs)
        elif isinstance(node.module, LLMInference):
            out = echo(node.module.alias, *call_args, **call_kwargs)
        else:
            out = node.module(*call_args, **call_kwargs)
        results[node_id] = out.payload if isinstance(out, Value) else out
    return substitute(graph.output, results.__getitem__)


def check_trace(
    build: Callable[[Leaf], Module], *args: Any, **kwargs: Any
) -> tuple[InferenceGraph, Any]:
    """Traces ``build(LLMInference)``, runs ``build(Echo)`` eagerly, asserts equal outputs.

    Returns the linted graph and the eager output.
    """
    graph = Tracer().trace(build(LLMInference), *args, **kwargs)
    graph.lint()
    eager = unwrap(build(Echo)(*args, **kwargs))
    assert evaluate(graph, *args, **kwargs) == eager
    return graph, eager


@pytest.fixture(name="check_trace")
def check_trace_fixture() -> Callable[..., tuple[InferenceGraph, Any]]:
    """`check_trace`: trace with LLM leaves, run eagerly with Echo leaves, outputs must agree."""
    return check_trace


@pytest.fixture(name="evaluate")
def evaluate_fixture() -> Callable[..., Any]:
    """`evaluate`: run a traced graph, answering LLM calls like `Echo`."""
    return evaluate
