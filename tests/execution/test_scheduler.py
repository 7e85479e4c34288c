"""The scheduler against the scripted server: what runs when, and what fails how.

Concurrency is asserted on the server's request log (arrival and finish
times on one clock) and its peak concurrency, never on client timings.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

import plait.functional as F
from plait import LLMInference, Module, ResourceManager, run
from plait.errors import BackendError
from plait.tracing import Tracer
from seed_programs import DeepPipeline, MultiPerspectiveAnalysis, SummarizeAndAnalyze, Synthesizer

from .support import (
    Shout,
    by_path,
    config_for,
    label_prompts,
    labelled_reply,
    llm_ancestors,
    path_of,
    system_of,
    user_of,
)

# ------------------------------------------------------------- what overlaps


async def test_independent_branches_are_in_flight_at_the_same_time(server, manager):
    server.latency = 0.2
    program = label_prompts(MultiPerspectiveAnalysis())

    out = await run(program, "the text", resources=manager)

    assert out == {
        "technical": "echo: the text",
        "business": "echo: the text",
        "user": "echo: the text",
    }
    log = server.stats.log
    assert sorted(path_of(r) for r in log) == ["business", "technical", "user"]
    assert max(r.arrived for r in log) < min(r.finished for r in log)
    assert server.stats.peak_concurrency == 3


async def test_a_chain_is_serial(server, manager):
    server.latency = 0.05
    program = label_prompts(SummarizeAndAnalyze())

    out = await run(program, "text", resources=manager)

    assert out == "echo: echo: text"
    first, second = server.stats.log
    assert (path_of(first), path_of(second)) == ("summarizer", "analyzer")
    assert second.arrived >= first.finished
    assert user_of(second.body) == "echo: text"
    assert server.stats.peak_concurrency == 1


async def test_deep_pipeline_order_at_the_server_respects_every_dependency(server, manager):
    server.latency = 0.02
    server.responder = labelled_reply
    program = label_prompts(DeepPipeline())
    graph = Tracer().trace(program, "doc")

    out = await run(program, "doc", resources=manager)

    assert out == "reply-from-stage3.synthesizer"
    requests = by_path(server)
    llm_nodes = [n.id for n in graph.nodes.values() if isinstance(n.module, LLMInference)]
    assert sorted(requests) == sorted(llm_nodes)
    assert len(llm_nodes) == 9
    for node_id in llm_nodes:
        for upstream in llm_ancestors(graph, node_id):
            assert requests[node_id].arrived >= requests[upstream].finished, (node_id, upstream)
    # stage2's three calls are independent of each other: they overlap.
    stage2 = [requests[f"stage2.{name}"] for name in ("technical", "business", "user")]
    assert max(r.arrived for r in stage2) < min(r.finished for r in stage2)


async def test_fan_in_request_carries_exactly_the_upstream_replies(server, manager):
    server.responder = labelled_reply
    program = label_prompts(Synthesizer())

    await run(program, "doc", resources=manager)

    synthesis = user_of(by_path(server)["synthesizer"].body)
    assert re.findall(r"reply-from-[\w.]+", synthesis) == [
        "reply-from-analyzer.technical",
        "reply-from-analyzer.business",
        "reply-from-analyzer.user",
    ]
    assert synthesis == (
        "## Technical Perspective\nreply-from-analyzer.technical\n\n"
        "## Business Perspective\nreply-from-analyzer.business\n\n"
        "## User Perspective\nreply-from-analyzer.user"
    )


class Normalize(Module):
    """An LLM call, a plain-Python module, and another LLM call on its output."""

    def __init__(self) -> None:
        super().__init__()
        self.draft = LLMInference(alias="llm")
        self.shout = Shout()
        self.polish = LLMInference(alias="llm")

    def forward(self, text: str) -> str:
        return self.polish(self.shout(self.draft(text)))


async def test_a_plain_python_module_in_a_graph_runs_on_the_real_reply(server, manager):
    program = Normalize()
    graph = Tracer().trace(program, "x")

    out = await run(program, "hello", resources=manager)

    assert graph.nodes["shout"].module is program.shout  # one node, not followed
    assert program.shout.seen == ["echo: hello"]  # real text, not a traced value
    assert [user_of(r.body) for r in server.stats.log] == ["hello", "ECHO: HELLO"]
    assert out == "echo: ECHO: HELLO"


# ------------------------------------------------------------------- limits


async def test_endpoint_max_concurrent_holds_across_a_whole_batch(server):
    server.latency = 0.03
    async with ResourceManager(config_for(server, max_concurrent=5)) as manager:
        outs = await run(
            MultiPerspectiveAnalysis(), [f"item {i}" for i in range(40)], resources=manager
        )
        stats = manager.stats()["*"]
        usage = manager.usage()["llm"]

    assert server.stats.requests == 120
    assert server.stats.peak_concurrency == 5
    assert (stats.calls, stats.effective_max_concurrent) == (120, 5)
    assert usage.output_tokens == 120 * 3  # "echo: item <i>"
    assert [o["business"] for o in outs] == [f"echo: item {i}" for i in range(40)]


async def test_endpoint_limit_holds_for_a_config_shared_by_separate_calls(server):
    """Calls made with the same config object share one manager and its limit."""
    server.latency = 0.03
    config = config_for(server, max_concurrent=4)
    program = MultiPerspectiveAnalysis()
    try:
        await asyncio.gather(*(run(program, f"x{i}", resources=config) for i in range(10)))
    finally:
        await ResourceManager.shared(config).aclose()

    assert server.stats.requests == 30
    assert server.stats.peak_concurrency == 4


@pytest.mark.parametrize("via", ["run", "bind"])
async def test_global_max_concurrent_holds_across_a_batch(server, manager, via):
    server.latency = 0.03
    program = MultiPerspectiveAnalysis()
    items = [f"item {i}" for i in range(20)]

    if via == "run":
        outs = await run(program, items, resources=manager, max_concurrent=4)
    else:
        outs = await program.bind(manager, max_concurrent=4)(items)

    assert len(outs) == 20
    assert server.stats.requests == 60
    assert server.stats.peak_concurrency == 4


# ------------------------------------------------------------------- errors


def fail_on(marker: str, system: str):
    """A responder that raises (the server answers 500) for one node on one input."""

    def responder(body: dict[str, Any]) -> str:
        if system_of(body) == system and marker in user_of(body):
            raise RuntimeError(f"refusing {marker}")
        return "echo: " + user_of(body)

    return responder


async def test_a_failed_node_in_a_batch_names_its_path_and_input_index(server, manager):
    server.responder = fail_on("poison", "stage2.business")
    program = label_prompts(DeepPipeline())

    with pytest.raises(BackendError, match=r"refusing poison") as info:
        await run(program, ["a", "b", "poison", "d"], resources=manager)

    error = info.value
    assert (error.node_id, error.module_path, error.input_index) == (
        "stage2.business",
        "stage2.business",
        2,
    )
    assert error.status == 500
    assert error.__notes__ == ["stage2.business failed on input 2"]


async def test_a_failed_single_call_names_the_node_and_no_index(server, manager):
    server.responder = fail_on("poison", "business")
    program = label_prompts(MultiPerspectiveAnalysis())

    with pytest.raises(BackendError, match="refusing poison") as info:
        await run(program, "poison", resources=manager)

    assert (info.value.node_id, info.value.input_index) == ("business", None)
    assert info.value.__notes__ == ["business failed"]


async def test_on_error_collect_puts_the_exception_at_its_index(server, manager):
    server.responder = fail_on("poison", "stage2.business")
    program = label_prompts(DeepPipeline())

    outs = await run(program, ["a", "poison", "c"], resources=manager, on_error="collect")

    assert isinstance(outs[1], BackendError)
    assert (outs[1].module_path, outs[1].input_index) == ("stage2.business", 1)
    assert outs[0].startswith("echo: ## Technical Perspective")
    assert outs[2].startswith("echo: ## Technical Perspective")


class PickTopic(Module):
    """Selects a key with F.select, then writes about it."""

    def __init__(self) -> None:
        super().__init__()
        self.writer = LLMInference(alias="llm")

    def forward(self, record: dict[str, str]) -> str:
        return self.writer(F.select(record, "topic"))


async def test_an_error_value_from_an_op_fails_the_llm_node_that_consumes_it(server, manager):
    program = PickTopic()

    assert await run(program, {"topic": "owls"}, resources=manager) == "echo: owls"
    with pytest.raises(KeyError, match=r"writer.*F\.select.*error Value") as info:
        await run(program, {"title": "owls"}, resources=manager)

    assert info.value.node_id == "writer"  # type: ignore[attr-defined]
    assert "'topic' not found" in str(info.value)
    assert server.stats.requests == 1  # the failing item sent nothing


class SelectOnly(Module):
    """No LLM below it: the whole module is one plain-Python node."""

    def forward(self, record: dict[str, str]) -> Any:
        return {"topic": F.select(record, "topic")}


class SelectAndAsk(Module):
    """Traced: F.select is a node of its own, and part of the output."""

    def __init__(self) -> None:
        super().__init__()
        self.ask = LLMInference(alias="llm")

    def forward(self, record: dict[str, str]) -> Any:
        return {"topic": F.select(record, "topic"), "reply": self.ask(record["title"])}


async def test_an_error_value_in_the_output_of_a_traced_program_raises(manager):
    with pytest.raises(KeyError, match=r"'topic' not found") as info:
        await run(SelectAndAsk(), {"title": "x"}, resources=manager)
    assert info.value.node_id.startswith("F.select")  # type: ignore[attr-defined]
    assert info.value.__notes__[0].startswith("F.select")


async def test_an_error_value_inside_a_plain_leafs_output_raises(manager):
    """Not ``{"topic": KeyError(...)}`` returned as if it were data."""
    program = SelectOnly()
    assert await run(program, {"topic": "owls"}, resources=manager) == {"topic": "owls"}

    with pytest.raises(KeyError, match=r"'topic' not found") as info:
        await run(program, {"title": "x"}, resources=manager)
    assert "SelectOnly" in info.value.__notes__[0]


# ------------------------------------------------------------- binding inputs


class _Brief(Module):
    """Inputs given by position, by keyword, by default and by keyword only."""

    def __init__(self) -> None:
        super().__init__()
        self.ask = LLMInference("llm")

    def forward(self, topic: str, tone: str = "plain", *, audience: str = "all") -> Any:
        return self.ask(f"{topic} | {tone} | {audience}")


@pytest.mark.parametrize(
    ("args", "kwargs", "sent"),
    [
        (("cats",), {}, "cats | plain | all"),
        (("cats", "warm"), {}, "cats | warm | all"),
        (("cats",), {"tone": "dry"}, "cats | dry | all"),
        (("cats", "warm"), {"audience": "kids"}, "cats | warm | kids"),
    ],
)
async def test_each_input_reaches_the_call_however_it_was_given(
    server, manager, args, kwargs, sent
):
    out = await run(_Brief(), *args, resources=manager, **kwargs)

    assert out == f"echo: {sent}"
