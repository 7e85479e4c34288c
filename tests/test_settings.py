"""plait.settings (seed 003 "Settings"): one mechanism with ExecutionSettings and bind.

Priority for one call, highest first: call kwargs > bind > innermost context >
configure > defaults. Each rung is shown by a request the scripted server saw.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import plait
from plait import ExecutionSettings, LLMInference, Module, ResourceConfig
from plait.testing import Fault, ScriptedServer


@pytest.fixture(autouse=True)
def _clean_global_settings():
    yield
    plait.settings.reset()


def config_of(server: ScriptedServer, **options: Any) -> ResourceConfig:
    return ResourceConfig({"*": server.endpoint(**options)})


async def test_configure_sets_the_default_resources_for_unbound_modules() -> None:
    async with ScriptedServer() as server:
        plait.settings.configure(resources=config_of(server))
        assert await LLMInference("llm")("hello") == "echo: hello"
        assert plait.settings.resources is not None


async def test_lm_is_a_synonym_for_resources_that_serve_every_alias() -> None:
    async with ScriptedServer() as server:
        with plait.settings.context(lm=server.endpoint()):
            assert await LLMInference("any-alias-at-all")("x") == "echo: x"
            assert plait.settings.lm["whatever"].provider == "openai"


async def test_priority_call_then_bind_then_context_then_configure_then_default() -> None:
    async with ScriptedServer() as slow, ScriptedServer() as fast:
        slow.inject(Fault(kind="slow", delay=5.0))
        plait.settings.configure(resources=config_of(slow, max_retries=0), timeout=0.2)
        with pytest.raises(plait.errors.BackendTimeout, match=r"0\.2 s"):  # configure's timeout
            await LLMInference("llm")("a")
        with plait.settings.context(resources=config_of(fast)):  # context beats configure
            assert await LLMInference("llm")("b") == "echo: b"
            bound = LLMInference("llm").bind(config_of(slow, max_retries=0))
            with pytest.raises(plait.errors.BackendTimeout):  # bind beats the context
                await bound("c")
            # call kwargs beat everything: a longer timeout lets the slow server answer
            slow.clear_faults()
            assert await bound("d", timeout=5.0) == "echo: d"


async def test_context_is_execution_settings_and_nests() -> None:
    block = plait.settings.context(max_concurrent=3)
    assert isinstance(block, ExecutionSettings)
    with block:
        with plait.settings.context(timeout=9):
            assert plait.settings.max_concurrent == 3 and plait.settings.timeout == 9
        assert plait.settings.timeout is None
    assert plait.settings.max_concurrent is None


async def test_contexts_are_task_safe() -> None:
    async def in_task(value: int) -> int | None:
        with plait.settings.context(max_concurrent=value):
            await asyncio.sleep(0.01)
            return plait.settings.max_concurrent

    assert await asyncio.gather(*(in_task(n) for n in (1, 2, 3))) == [1, 2, 3]


def test_contexts_are_thread_safe_and_configure_reaches_every_thread() -> None:
    plait.settings.configure(max_concurrent=7)
    seen: dict[str, Any] = {}

    def worker(name: str, value: int) -> None:
        with plait.settings.context(timeout=value):
            seen[name] = (plait.settings.timeout, plait.settings.max_concurrent)

    threads = [threading.Thread(target=worker, args=(f"t{n}", n)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {"t1": (1, 7), "t2": (2, 7)}


def test_unknown_settings_are_refused_listing_the_known_ones() -> None:
    with pytest.raises(TypeError, match=r"unknown setting.*'lm_model'.*known:.*timeout"):
        plait.settings.configure(lm_model="gpt-4o")
    with pytest.raises(AttributeError, match="no setting 'nope'"):
        _ = plait.settings.nope


class Pair(Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = LLMInference("llm")
        self.b = LLMInference("llm")

    def forward(self, text: str) -> list[Any]:
        return [self.a(text), self.b(text)]


async def test_configured_max_concurrent_limits_a_program_like_a_context_would() -> None:
    async with ScriptedServer(latency=0.1) as server:
        plait.settings.configure(resources=config_of(server), max_concurrent=1)
        await Pair()("x")
        assert server.stats.peak_concurrency == 1
        server.reset_stats()
        with plait.settings.context(max_concurrent=2):
            await Pair()("y")
        assert server.stats.peak_concurrency == 2
