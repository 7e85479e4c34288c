"""Batches: many inputs through one program, concurrently, with bounded memory.

At most ``window`` items are in flight at once (by default the LLM-call
limit), so a batch of 100,000 inputs never holds 100,000 tasks. Results come
back as a list in input order, or — streaming — as `BatchResult`s in
completion order (or input order with ``preserve_order``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BatchResult", "BatchStream", "run_items"]

_QUEUE_SIZE = 256
"""Finished results a streaming batch holds for a slow consumer before workers pause."""


@dataclass(slots=True)
class BatchResult:
    """The outcome of one batch item."""

    index: int
    """Position of the item in the input list."""
    input: Any
    """The item itself."""
    output: Any = None
    """The program's output (None when it failed)."""
    error: BaseException | None = None
    """Why the item failed (an ExecutionError naming the node), or None."""
    usage: dict[str, Any] | None = None
    """The item's model calls: ``calls``, ``cached``, ``input_tokens``, ``output_tokens``,
    ``cost`` (None for an item restored from a checkpoint)."""

    @property
    def ok(self) -> bool:
        """Whether the item succeeded."""
        return self.error is None


ItemRunner = Callable[[int, Any], Awaitable[Any]]
"""Runs item ``index`` (the input is given too) and returns its output."""


async def run_items(
    items: Sequence[Any],
    run_item: ItemRunner,
    window: int,
    on_result: Callable[[BatchResult], Awaitable[None] | None],
    skip: Callable[[int], bool] = lambda index: False,
) -> None:
    """Runs every item not skipped, at most ``window`` at once, reporting each result.

    Exceptions of an item become its `BatchResult.error`; ``on_result`` may
    return an awaitable (backpressure: the worker waits for it before its next
    item) and     raise to stop the whole batch (remaining items are cancelled).
    """
    pending = (i for i in range(len(items)) if not skip(i))

    async def worker() -> None:
        for index in pending:
            try:
                output = await run_item(index, items[index])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                result = BatchResult(index, items[index], error=exc)
            else:
                result = BatchResult(index, items[index], output)
            waiting = on_result(result)
            if waiting is not None:
                await waiting  # a streaming consumer that falls behind holds the workers back

    workers = [asyncio.create_task(worker()) for _ in range(max(1, min(window, len(items))))]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


class BatchStream:
    """Async iterator of `BatchResult`s; awaiting it gives the list of all of them.

    Returned by a batch call inside ``ExecutionSettings(streaming=True)``, so
    ``async for r in module(batch)`` needs no extra ``await``. A failed item
    is reported with ``ok=False`` and the other items go on.
    """

    def __init__(
        self,
        start: Callable[[Callable[[BatchResult], None]], Awaitable[None]],
        total: int,
        preserve_order: bool,
    ) -> None:
        self._start = start
        self.total = total
        self._preserve_order = preserve_order

    async def __aiter__(self) -> AsyncIterator[BatchResult]:
        # Bounded: results wait here only while the consumer is busy; when it
        # falls further behind, workers pause, so memory stays flat.
        queue: asyncio.Queue[BatchResult | None] = asyncio.Queue(maxsize=_QUEUE_SIZE)
        producer = asyncio.create_task(self._produce(queue))
        held: dict[int, BatchResult] = {}
        next_index = 0
        try:
            while True:
                result = await queue.get()
                if result is None:
                    break
                if not self._preserve_order:
                    yield result
                    continue
                held[result.index] = result
                while next_index in held:
                    yield held.pop(next_index)
                    next_index += 1
            await producer
            for index in sorted(held):
                yield held[index]
        finally:
            if not producer.done():
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)

    async def _produce(self, queue: asyncio.Queue[BatchResult | None]) -> None:
        try:
            await self._start(queue.put)
        finally:
            with contextlib.suppress(asyncio.CancelledError):
                await queue.put(None)

    async def _collect(self) -> list[BatchResult]:
        return [result async for result in self]

    def __await__(self) -> Generator[Any, None, list[BatchResult]]:
        return self._collect().__await__()
