"""Whole programs against a cached endpoint: a rerun sends nothing and costs nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from plait import ExecutionSettings, LLMInference, ResourceConfig, ResourceManager, run
from plait.report.profiling import profile
from plait.testing import ScriptedServer

from .support import TwoStep, endpoint

ITEMS = [f"item {i}" for i in range(20)]
EXPECTED = [f"echo: echo: item {i}" for i in range(20)]


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(latency=0.01) as running:
        yield running


@pytest.fixture
def config(server: ScriptedServer, tmp_path: Path) -> ResourceConfig:
    return ResourceConfig({"llm": endpoint(server, cache=str(tmp_path / "responses.sqlite"))})


async def test_second_run_of_a_batch_sends_nothing_and_costs_nothing(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    program = TwoStep()
    async with ResourceManager(config) as manager:
        with profile() as first_run:
            assert await run(program, ITEMS, resources=manager) == EXPECTED
        assert server.stats.requests == 40
        spent = manager.total_usage().cost
        assert spent > 0 and all(r.cost > 0 and not r.cache_hit for r in first_run.records)

        with profile() as second_run:
            assert await run(program, ITEMS, resources=manager) == EXPECTED
        assert server.stats.requests == 40  # the server saw nothing new
        assert manager.total_usage().cost == spent
        records = second_run.records
        assert len(records) == 40 and all(r.cache_hit and r.cost == 0.0 for r in records)
        # tokens are still reported, as they were when the reply was made
        assert sorted(r.input_tokens for r in records) == sorted(
            r.input_tokens for r in first_run.records
        )
        assert manager.stats()["llm"].cache_hits == 40

    async with ResourceManager(config) as fresh:  # a new process would see the same: disk
        assert await run(program, ITEMS, resources=fresh) == EXPECTED
        assert fresh.total_usage().cost == 0.0
    assert server.stats.requests == 40


async def test_cache_false_per_call_bind_or_settings_goes_to_the_provider(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    program = LLMInference("llm", temperature=0.0)
    async with ResourceManager(config) as manager:
        await run(program, ITEMS, resources=manager)
        assert server.stats.requests == 20

        assert await run(program, ITEMS, resources=manager, cache=False) == [
            f"echo: {item}" for item in ITEMS
        ]
        assert server.stats.requests == 40

        async with ExecutionSettings(resources=manager, cache=False):
            await program("item 0")
            async with ExecutionSettings(cache=True):  # an inner block may turn it back on
                await program("item 0")
        assert server.stats.requests == 41

        bound = LLMInference("llm", temperature=0.0).bind(manager, cache=False)
        await bound(ITEMS[:5])
        assert server.stats.requests == 46
        await bound(ITEMS[:5], cache=True)  # call options beat bind
        assert server.stats.requests == 46
