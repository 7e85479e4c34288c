"""Batches: streaming in completion or input order, failures per item, bounded windows."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from plait import BatchResult, ExecutionSettings, run
from plait.errors import BackendError
from plait.execution.batch import BatchStream, run_items
from plait.testing import server_in_thread

from .support import Ask, Shout, config_for, refuse_marker, user_of

ITEMS = ["slow", "medium", "fast"]


def answered_after(waits: dict[str, asyncio.Event]):
    """A responder that holds the reply to ``text`` until ``waits[text]`` is set."""

    async def responder(body: dict[str, Any]) -> str:
        text = user_of(body)
        if text in waits:
            await waits[text].wait()
        return "echo: " + text

    return responder


async def test_streaming_yields_results_in_completion_order(server, manager):
    # Each reply is held until the consumer has seen the one before it, so the
    # items can only finish fast, medium, slow.
    seen_fast, seen_medium = asyncio.Event(), asyncio.Event()
    server.responder = answered_after({"medium": seen_fast, "slow": seen_medium})
    program = Ask()
    results: list[BatchResult] = []

    async with ExecutionSettings(resources=manager, streaming=True):
        async for result in program(ITEMS):
            results.append(result)
            {"fast": seen_fast, "medium": seen_medium}.get(result.input, asyncio.Event()).set()

    assert [r.index for r in results] == [2, 1, 0]
    assert [(r.input, r.output, r.error, r.ok) for r in results] == [
        ("fast", "echo: fast", None, True),
        ("medium", "echo: medium", None, True),
        ("slow", "echo: slow", None, True),
    ]


async def test_streaming_with_preserve_order_yields_in_input_order(server, manager):
    # The server answers fast first, medium once fast is answered, slow last.
    records = server.stats.log

    def answered(text: str) -> bool:
        return any(user_of(r.body) == text and r.finished is not None for r in records)

    async def responder(body: dict[str, Any]) -> str:
        text = user_of(body)
        before = {"slow": "medium", "medium": "fast"}.get(text)
        while before is not None and not answered(before):
            await asyncio.sleep(0.005)
        return "echo: " + text

    server.responder = responder
    async with ExecutionSettings(resources=manager, streaming=True, preserve_order=True):
        results = [r async for r in Ask()(ITEMS)]

    assert [r.index for r in results] == [0, 1, 2]
    assert [r.output for r in results] == ["echo: slow", "echo: medium", "echo: fast"]
    by_finish = sorted(records, key=lambda r: r.finished)
    assert [user_of(r.body) for r in by_finish] == ["fast", "medium", "slow"]


async def test_a_failed_item_streams_ok_false_and_the_others_go_on(server, manager):
    server.responder = refuse_marker("bad")
    items = ["a", "b", "bad", "c", "d"]

    async with ExecutionSettings(resources=manager, streaming=True, preserve_order=True):
        results = [r async for r in Ask()(items)]

    assert [r.ok for r in results] == [True, True, False, True, True]
    failed = results[2]
    assert (failed.index, failed.input, failed.output) == (2, "bad", None)
    assert isinstance(failed.error, BackendError)
    assert (failed.error.node_id, failed.error.input_index) == ("ask", 2)
    assert "cannot answer bad" in str(failed.error)
    assert [r.output for r in results if r.ok] == ["echo: a", "echo: b", "echo: c", "echo: d"]
    assert server.stats.requests == 5


async def test_awaiting_a_streaming_batch_gives_every_result(server, manager):
    server.responder = refuse_marker("bad")
    with ExecutionSettings(resources=manager, streaming=True):
        stream = Ask()(["x", "bad"])
        assert isinstance(stream, BatchStream)
        results = await stream

    assert sorted((r.index, r.ok) for r in results) == [(0, True), (1, False)]


def test_run_sync_of_a_streaming_batch_returns_the_results():
    with server_in_thread() as server, ExecutionSettings(streaming=True, preserve_order=True):
        program = Ask().bind(config_for(server))
        results = program.run_sync(["p", "q"])

    assert [(r.index, r.output) for r in results] == [(0, "echo: p"), (1, "echo: q")]


async def test_closing_a_stream_early_stops_the_batch(server, manager):
    server.latency = 0.05
    items = [f"item {i}" for i in range(20)]

    firsts: list[BatchResult] = []
    async with (
        ExecutionSettings(resources=manager, streaming=True, max_concurrent=2),
        contextlib.aclosing(aiter(Ask()(items))) as results,
    ):
        async for result in results:
            firsts.append(result)
            break

    assert firsts[0].ok
    # Nothing new is sent after the stream closed: only the window that was in flight.
    assert server.stats.requests <= 4


async def test_a_plain_python_batch_needs_no_server(manager):
    outs = await run(Shout(), ["a", "b"], resources=manager)
    assert outs == ["A", "B"]


async def test_a_batch_longer_than_its_window_whose_items_make_no_llm_call_finishes(manager):
    # Its LLM-call slots are never all taken, so the batch must not wait for that
    # before it ends (well under the 10 s given here).
    items = [f"item {i}" for i in range(10)]
    outs = await asyncio.wait_for(run(Shout(), items, resources=manager, max_concurrent=2), 10)
    assert outs == [item.upper() for item in items]


async def test_an_empty_batch_returns_an_empty_list(manager):
    assert await run(Ask(), [], resources=manager) == []
    async with ExecutionSettings(resources=manager, streaming=True):
        assert [r async for r in Ask()([])] == []


# ------------------------------------------------------------------ run_items


async def test_run_items_keeps_at_most_window_items_in_flight():
    in_flight, peak, results = 0, 0, []

    async def run_item(index: int, item: str) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        return item.upper()

    items = [f"i{n}" for n in range(10)]
    await run_items(items, run_item, 3, results.append, skip=lambda index: index == 4)

    assert peak == 3
    assert sorted(r.index for r in results) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert all(r.output == r.input.upper() for r in results)


async def test_run_items_reports_exceptions_per_item_and_can_be_stopped():
    results: list[BatchResult] = []

    async def run_item(index: int, item: int) -> int:
        if item == 2:
            raise ValueError("two")
        return item

    await run_items([0, 1, 2, 3], run_item, 2, results.append)
    errors = {r.index: r.error for r in results if not r.ok}
    assert list(errors) == [2] and isinstance(errors[2], ValueError)

    def stop(result: BatchResult) -> None:
        raise RuntimeError(f"stopped at {result.index}")

    with pytest.raises(RuntimeError, match="stopped at"):
        await run_items([0, 1, 2, 3], run_item, 2, stop)


class CleaningUp:
    """A run_item whose items wait until cancelled, then clean up until ``done`` is set.

    An item "quick" has nothing to clean up. The tests wait on what the items
    report (how many run, how many are cleaning up), never on a sleep: on a
    loaded machine a few milliseconds do not mean that the loop got that far.
    """

    def __init__(self) -> None:
        self.running = 0
        self.cleaning = 0
        self.cleaned: list[int] = []
        self.done = asyncio.Event()
        self._changed = asyncio.Condition()

    async def __call__(self, index: int, item: str) -> None:
        await self._count("running")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if item != "quick":
                await self._count("cleaning")
                await self.done.wait()
                self.cleaned.append(index)
            raise

    async def _count(self, what: str) -> None:
        async with self._changed:
            setattr(self, what, getattr(self, what) + 1)
            self._changed.notify_all()

    async def until(self, what: str, count: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: getattr(self, what) == count)


async def test_a_cancelled_batch_lets_every_items_clean_up_finish():
    # One item stops at once; the batch must not cancel the others a second time
    # (aborting their clean-up) when it sees that one end.
    run_item = CleaningUp()
    items = ["quick", "slow", "slow", "slow"]
    batch = asyncio.create_task(run_items(items, run_item, 4, lambda result: None))
    await run_item.until("running", 4)
    batch.cancel()
    await run_item.until("cleaning", 3)
    run_item.done.set()
    with pytest.raises(asyncio.CancelledError):
        await batch
    assert sorted(run_item.cleaned) == [1, 2, 3]


async def test_a_second_cancel_ends_the_clean_ups_at_once():
    run_item = CleaningUp()
    batch = asyncio.create_task(run_items(["slow"] * 3, run_item, 3, lambda result: None))
    await run_item.until("running", 3)
    batch.cancel()
    await run_item.until("cleaning", 3)
    batch.cancel()  # the clean-ups would wait for good: only this cancel can end them
    with pytest.raises(asyncio.CancelledError):
        await batch
    assert run_item.cleaned == []


def test_batch_result_ok_follows_error():
    assert BatchResult(0, "x", "out").ok
    failed = BatchResult(1, "y", error=ValueError("no"))
    assert (failed.ok, failed.output) == (False, None)
