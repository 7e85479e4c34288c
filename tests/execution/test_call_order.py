"""Which waiting LLM call gets a freed slot: the batch's limit, not its items, bounds the work.

The program fans out: three calls on the item's text, then one call reading all
three. Replies to item ``a`` come fast and to the other items slowly, so the
moment at which both an item's last call and other items' first calls wait for
a slot is certain; the server's request log tells which one was sent first.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from plait import LLMInference, Module, run
from plait.execution.slots import CallSlots

from .support import config_for, label_prompts, path_of, user_of

FAST, SLOW = 0.02, 0.5


class Wide(Module):
    def __init__(self) -> None:
        super().__init__()
        self.one = LLMInference("llm")
        self.two = LLMInference("llm")
        self.three = LLMInference("llm")
        self.join = LLMInference("llm")

    def forward(self, text: str) -> Any:
        return self.join(f"{self.one(text)}|{self.two(text)}|{self.three(text)}")


async def item_paced(body: dict[str, Any]) -> str:
    """Replies with the item's name (the text before ``|``), fast for ``a`` only."""
    item = user_of(body).split("|")[0]
    await asyncio.sleep(FAST if item == "a" else SLOW)
    return item


def sent(server) -> list[str]:
    """Returns ``<item>.<node>`` of each request in the order the server received them."""
    return [f"{user_of(r.body).split('|')[0]}.{path_of(r)}" for r in server.stats.log]


async def test_an_items_last_call_goes_before_new_items_first_calls(server):
    # Two slots, so two items in flight out of four: a's three calls are done
    # while b's first two hold both slots; then a's join and b's third call
    # both wait, and the slot b's first call frees goes to a's join.
    server.responder = item_paced
    outputs = await run(
        label_prompts(Wide()), ["a", "b", "c", "d"], resources=config_for(server),
        max_concurrent=2, progress=False,
    )  # fmt: skip

    assert outputs == ["a", "b", "c", "d"]
    order = sent(server)
    assert order[:5] == ["a.one", "a.two", "a.three", "b.one", "b.two"]
    assert order.index("a.join") < order.index("b.three")


async def test_once_every_item_is_admitted_calls_with_more_work_after_them_go_first(server):
    # The same moment with no item left to admit: b's third call, which still
    # has the join after it, goes before a's join, which ends its item.
    server.responder = item_paced
    outputs = await run(
        label_prompts(Wide()), ["a", "b"], resources=config_for(server),
        max_concurrent=2, progress=False,
    )  # fmt: skip

    assert outputs == ["a", "b"]
    order = sent(server)
    assert order.index("b.three") < order.index("a.join")


async def test_a_fanout_batch_keeps_the_call_limit_and_a_bounded_window_of_items(server):
    server.latency = 0.01
    server.responder = lambda body: user_of(body).split("|")[0]
    texts = [f"item{i}" for i in range(40)]

    outputs = await run(
        label_prompts(Wide()), texts, resources=config_for(server),
        max_concurrent=6, progress=False,
    )  # fmt: skip

    assert outputs == texts
    assert server.stats.requests == 4 * len(texts)
    assert server.stats.peak_concurrency <= 6
    spans: dict[str, list[float]] = {}
    for record in server.stats.log:
        item = user_of(record.body).split("|")[0]
        start, end = spans.setdefault(item, [record.arrived, record.finished])
        spans[item] = [min(start, record.arrived), max(end, record.finished)]
    most_items_at_once = max(
        sum(start <= moment < end for start, end in spans.values()) for moment, _ in spans.values()
    )
    assert most_items_at_once <= 6


async def test_a_cancelled_waiter_never_takes_or_loses_a_slot():
    slots = CallSlots(1)
    await slots.acquire((0, 1))
    cancelled = asyncio.create_task(slots.acquire((0, 1)))
    waiting = asyncio.create_task(slots.acquire((1, 1)))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)

    slots.release()  # skips the cancelled waiter
    await asyncio.wait_for(waiting, 10)

    granted = asyncio.create_task(slots.acquire((0, 1)))
    await asyncio.sleep(0)
    slots.release()  # picks `granted`, which is cancelled before it runs
    granted.cancel()
    await asyncio.gather(granted, return_exceptions=True)
    await asyncio.wait_for(slots.acquire((0, 1)), 10)  # the slot was passed on, not lost


async def test_once_every_slot_is_taken_a_reserve_of_items_starts_and_queues_its_calls(server):
    # Two slots, six items: the first two items' calls take both slots, then
    # two more items start at once and wait with their calls queued, so the
    # slot an item frees as it ends goes straight to a waiting call instead of
    # idling while the next item starts.
    server.latency = 0.5
    started: dict[str, float] = {}

    class Noted(Module):
        def forward(self, text: str) -> str:
            started[text] = time.monotonic()
            return text

    class Program(Module):
        def __init__(self) -> None:
            super().__init__()
            self.note = Noted()
            self.ask = LLMInference("llm")

        def forward(self, text: str) -> Any:
            return self.ask(self.note(text))

    texts = [f"item{i}" for i in range(6)]
    outputs = await run(
        Program(), texts, resources=config_for(server), max_concurrent=2, progress=False
    )

    assert outputs == [f"echo: {text}" for text in texts]
    assert server.stats.peak_concurrency == 2
    first_reply = min(record.finished for record in server.stats.log)
    assert sorted(text for text, when in started.items() if when < first_reply) == texts[:4]
