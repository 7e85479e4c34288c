"""Bounded time under a hostile server: a huge Retry-After fails its call, never the run.

The manager takes an injected clock and sleep, so a test can see every wait
the resource layer asked for (and would have slept) without sleeping it.
"""

from __future__ import annotations

import asyncio

import pytest

from plait import LLMInference, ResourceManager, run
from plait.errors import DeadlineExceededError, RateLimitError
from plait.testing import Fault, ScriptedServer

from .support import endpoint

ITEMS = [f"item {i}" for i in range(5)]


class FakeTime:
    """A clock that jumps forward by whatever is slept, recording each wait."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


@pytest.mark.parametrize("header", ["86400", "inf", "1e400"])
async def test_a_retry_after_beyond_the_cap_fails_that_call_and_holds_no_other(
    header: str,
) -> None:
    time = FakeTime()
    async with ScriptedServer(latency=0.05) as server:
        server.inject(Fault(status=429, headers={"Retry-After": header}, times=1))
        config = {"llm": endpoint(server, max_concurrent=2)}
        async with ResourceManager(config, clock=time.clock, sleep=time.sleep) as manager:
            outputs = await run(LLMInference("llm"), ITEMS, resources=manager, on_error="collect")
            stats = manager.stats()["llm"]

    failed = [out for out in outputs if isinstance(out, BaseException)]
    assert len(failed) == 1, outputs
    cause = failed[0]
    assert isinstance(cause, RateLimitError)
    message = str(cause)
    assert "alias 'llm'" in message and "Retry-After" in message and "max_retry_after=60" in message
    for item, output in zip(ITEMS, outputs, strict=True):
        assert output is cause or output == f"echo: {item}"
    assert server.stats.requests == 5  # the refused call was not retried
    # The other four went on at once: the endpoint was neither paused nor slowed.
    assert time.now < 1.0 < 60.0, time.slept
    assert stats.paused_for == 0.0 and stats.effective_max_concurrent == 2


async def test_every_call_told_to_wait_beyond_the_cap_fails_at_once() -> None:
    time = FakeTime()
    async with ScriptedServer() as server:
        server.inject(Fault(status=429, headers={"Retry-After": "86400"}))
        config = {"llm": endpoint(server, max_concurrent=2)}
        async with ResourceManager(config, clock=time.clock, sleep=time.sleep) as manager:
            outputs = await run(LLMInference("llm"), ITEMS, resources=manager, on_error="collect")

    assert all(isinstance(out, RateLimitError) for out in outputs)
    assert server.stats.requests == 5
    assert time.slept == []  # nobody waited for a quota that will not come back in the run


async def test_a_retry_after_within_the_cap_is_honoured_and_retried() -> None:
    time = FakeTime()
    async with ScriptedServer() as server:
        server.inject(Fault(status=429, headers={"Retry-After": "7"}, times=1))
        async with ResourceManager(
            {"llm": endpoint(server)}, clock=time.clock, sleep=time.sleep
        ) as manager:
            assert await run(LLMInference("llm"), "hi", resources=manager) == "echo: hi"
    assert server.stats.requests == 2
    assert 7.0 in time.slept


# ------------------------------------------------------------------ deadline
async def test_a_deadline_bounds_a_single_call_including_its_waits() -> None:
    async with ScriptedServer() as server:
        server.inject(Fault(kind="slow", delay=30.0))
        async with ResourceManager({"llm": endpoint(server, timeout=60)}) as manager:
            with pytest.raises(DeadlineExceededError, match=r"deadline of 0\.3 s") as info:
                await run(LLMInference("llm"), "hi", resources=manager, deadline=0.3)
    assert info.value.deadline == 0.3


async def test_a_batch_deadline_fails_only_the_unfinished_items_and_keeps_the_rest(
    tmp_path,
) -> None:
    async with ScriptedServer() as server:
        server.inject(Fault(kind="slow", delay=30.0, times=1))
        async with ResourceManager({"llm": endpoint(server)}) as manager:
            outputs = await run(
                LLMInference("llm"),
                ITEMS,
                resources=manager,
                deadline=1.0,
                on_error="collect",
                checkpoint_dir=tmp_path,
            )
            late = [i for i, out in enumerate(outputs) if isinstance(out, DeadlineExceededError)]
            assert len(late) == 1 and outputs[late[0]].input_index == late[0]
            assert all(out == f"echo: {ITEMS[i]}" for i, out in enumerate(outputs) if i not in late)
            server.reset_stats()
            again = await run(
                LLMInference("llm"), ITEMS, resources=manager, checkpoint_dir=tmp_path
            )
    assert again == [f"echo: {item}" for item in ITEMS]
    assert server.stats.requests == 1  # only the late item ran again
