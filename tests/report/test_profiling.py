"""Profiling: one NodeTiming per LLM node of a run, with its tokens, from real runs."""

from __future__ import annotations

from typing import Any

from plait import LLMInference, Module, ResourceConfig, ResourceManager, run
from plait.report.profiling import NodeTiming, Profiler, profile
from plait.testing import ScriptedServer, server_in_thread


class Views(Module):
    def __init__(self) -> None:
        super().__init__()
        self.technical = LLMInference(alias="llm", system_prompt="Technical view.")
        self.business = LLMInference(alias="llm", system_prompt="Business view.")

    def forward(self, text: str) -> dict[str, str]:
        return {"technical": self.technical(text), "business": self.business(text)}


class Report(Module):
    def __init__(self) -> None:
        super().__init__()
        self.views = Views()
        self.summary = LLMInference(alias="llm", system_prompt="Summarize.")

    def forward(self, text: str) -> str:
        views = self.views(text)
        return self.summary(f"{views['technical']} / {views['business']}")


def config_for(server: ScriptedServer) -> ResourceConfig:
    return ResourceConfig(
        {"*": {"provider": "openai", "model": "m", "base_url": server.base_url, "api_key": "k"}}
    )


def words(text: str) -> int:
    return len(text.split())


def test_profile_records_each_llm_node_of_a_run_sync_call_with_tokens():
    with server_in_thread() as server:
        program = Report().bind(config_for(server))
        with profile() as prof:
            out = program.run_sync("hello world")
        log = server.stats.log

    assert out == "echo: echo: hello world / echo: hello world"
    assert sorted(r.node_id for r in prof.records) == [
        "summary",
        "views.business",
        "views.technical",
    ]
    by_id = {r.node_id: r for r in prof.records}
    technical = by_id["views.technical"]
    assert isinstance(technical, NodeTiming)
    assert (technical.module_path, technical.input_index) == ("views.technical", None)
    assert (technical.input_tokens, technical.output_tokens) == (2 + 2, 3)  # scripted: words
    # the summary could only start after both views finished
    assert by_id["summary"].start >= max(technical.end, by_id["views.business"].end)
    assert all(0 <= r.start <= r.end for r in prof.records)
    total_in = sum(words(m["content"]) for record in log for m in record.body["messages"])
    assert sum(r.input_tokens for r in prof.records) == total_in
    assert prof.wall_time >= by_id["summary"].duration > 0


async def test_profile_records_the_batch_index_of_every_node():
    async with ScriptedServer() as server, ResourceManager(config_for(server)) as manager:
        with profile() as prof:
            await run(Report(), ["a", "b", "c"], resources=manager)

    assert len(prof.records) == 9
    assert sorted({r.input_index for r in prof.records}) == [0, 1, 2]
    assert sorted(r.node_id for r in prof.records if r.input_index == 1) == [
        "summary",
        "views.business",
        "views.technical",
    ]


class Careful(Module):
    """An async leaf: its own calls must be profiled too (SPEC §4.2)."""

    def __init__(self) -> None:
        super().__init__()
        self.draft = LLMInference(alias="llm")
        self.views = Views()

    async def forward(self, text: str) -> Any:
        draft = await self.draft(text)
        return await self.views(draft)


class Desk(Module):
    def __init__(self) -> None:
        super().__init__()
        self.careful = Careful()

    def forward(self, text: str) -> Any:
        return self.careful(text)


async def test_profile_records_the_calls_made_inside_an_async_leaf():
    async with ScriptedServer() as server, ResourceManager(config_for(server)) as manager:
        with profile() as prof:
            await run(Desk(), ["x", "y"], resources=manager)

    calls = sorted((r.input_index, r.node_id) for r in prof.records if r.node_id != "careful")
    assert calls == [
        (index, path)
        for index in (0, 1)
        for path in (
            "careful.draft",
            "careful.views.business",
            "careful.views.technical",
        )
    ]
    leaves = [r for r in prof.records if r.node_id == "careful"]
    assert sorted(r.input_index for r in leaves) == [0, 1]
    assert sum(r.output_tokens for r in prof.records if r.node_id != "careful") == sum(
        words(f"echo: {x}") for x in ("x", "y")
    ) + 2 * sum(words(f"echo: echo: {x}") for x in ("x", "y"))


async def test_no_profile_no_records_and_the_table_summarises():
    async with ScriptedServer() as server, ResourceManager(config_for(server)) as manager:
        await run(Report(), "unprofiled", resources=manager)
        with profile() as prof:
            await run(Report(), "profiled", resources=manager)

    assert len(prof.records) == 3
    table = prof.table()
    assert table.splitlines()[0].split()[:2] == ["node", "start"]
    assert "views.technical" in table and "3 nodes; wall" in table


def test_an_empty_profiler_has_no_wall_time():
    assert Profiler().wall_time == 0.0


async def test_a_request_cancelled_in_flight_counts_as_a_request_not_a_call():
    # a budget ending a step, or Ctrl-C, cancels requests the provider already has: the
    # report counts them as the budget does (they were sent), as neither calls nor failures
    import asyncio
    import contextlib

    from plait.backends.types import Message, Request

    async with ScriptedServer(latency=30) as server, ResourceManager(config_for(server)) as manager:
        with profile() as prof:
            request = Request(messages=(Message("user", "hi"),))
            task = asyncio.create_task(manager.complete("llm", request))
            while server.stats.in_flight < 1:
                await asyncio.sleep(0.01)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    totals = prof.alias_totals["llm"]
    assert (totals["requests"], totals["calls"], totals["failures"]) == (1, 0, 0)
    [timing] = prof.requests
    assert timing.status is None and timing.error is not None
    assert timing.error.startswith("CancelledError")


def test_a_sampled_profiler_keeps_a_uniform_sample_of_requests_and_nodes():
    # The records a sample keeps are made only when it keeps them; which ones it keeps
    # must still be a uniform sample of the whole run (run.json's spans), not its start.
    profiler = Profiler(max_records=1_000)
    with profiler:
        for call in range(10_000):
            clock = profiler.start_node()
            profiler.record_request("llm", "llm", call, 1, 0.0, 0.001 * call, status=200)
            clock.stop()
            profiler.record(f"n{call}", "summary", call, clock, {})
    assert profiler.nodes_seen == 10_000
    assert len(profiler.requests) == len(profiler.records) == 1_000
    for kept in ([r.call for r in profiler.requests], [r.input_index for r in profiler.records]):
        tenths = [0] * 10
        for call in kept:
            tenths[call // 1_000] += 1
        assert len(set(kept)) == 1_000
        assert all(60 <= count <= 140 for count in tenths), tenths  # 100 each, drawn
    assert sum(profiler.timelines["llm"].requests.values()) == 10_000  # counted exactly
