"""The batch path: many inputs through one program, concurrently, with bounded memory.

`run_batch` runs every item of a batch on one `Executor` (so endpoint limits
and the LLM-call limit hold across the batch), restores the items a checkpoint
already holds, writes each finished one to it, and fails what the batch's
deadline cut short. As many items as LLM-call slots start at once, and as
many again once every slot is taken, so a batch of 100,000 inputs never holds
100,000 tasks. Every item in flight keeps a call running or waiting, but an
item that ends frees its slot a turn of the event loop before the next item's
first calls exist (long when a round of replies lands at once); the second set
of items has calls waiting by then, so the slot goes straight to one of them.
The executor's slots serve the oldest item's calls first (see
`plait.execution.slots`), so the extra items wait and memory stays bounded by
twice the limit. Results come back as a
list in input order (`batch_to_list`), or — streaming — as `BatchResult`s
in completion order (or input order with ``preserve_order``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from plait import _context
from plait._together import together
from plait.errors import DeadlineExceededError, locate
from plait.execution.executor import Executor
from plait.execution.graph_cache import RunGraphs
from plait.execution.llm_call import USE_CACHE
from plait.execution.observe import resolve_callbacks

__all__ = [
    "BatchResult",
    "BatchStream",
    "batch_to_list",
    "run_batch",
    "run_items",
    "unfinished_error",
]

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
    """Why the item failed (the error of its own class, located at the node: its
    ``module_path``, ``node_id`` and ``input_index``), or None."""
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
    last_admitted: Callable[[], None] = lambda: None,
    reserve: int = 0,
    reserve_after: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Runs every item not skipped, at most ``window`` at once, reporting each result.

    Exceptions of an item become its `BatchResult.error`; ``on_result`` may
    return an awaitable (backpressure: the worker waits for it before its next
    item) and raise to stop the whole batch (remaining items are cancelled).
    ``reserve`` more items may run at once from when ``reserve_after()`` returns.
    ``last_admitted`` is called once the last item has started and at most
    ``window`` items are unfinished. Cancelled, it cancels each running item
    once and waits for them all, so an item's clean-up on cancel runs to its
    end; cancelled again while it waits, it ends those clean-ups too.
    """
    reserve_opens = asyncio.get_running_loop().create_future()
    pending = _Admission(len(items), skip, window, last_admitted, reserve_opens)

    async def worker(reserved: bool = False) -> None:
        if reserved:
            await asyncio.shield(reserve_opens)  # one future for every reserved worker
        for index in pending:
            try:
                output = await run_item(index, items[index])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                result = BatchResult(index, items[index], error=exc)
            else:
                result = BatchResult(index, items[index], output)
            pending.finished()
            waiting = on_result(result)
            if waiting is not None:
                await waiting  # a streaming consumer that falls behind holds the workers back

    async def open_reserve() -> None:
        assert reserve_after is not None
        await reserve_after()
        if not reserve_opens.done():
            reserve_opens.set_result(None)

    starting = max(1, min(window, len(items)))
    workers = [asyncio.create_task(worker()) for _ in range(starting)]
    later = min(reserve, len(items) - starting) if reserve_after is not None else 0
    if later > 0:
        workers += [asyncio.create_task(worker(reserved=True)) for _ in range(later)]
        opener = asyncio.create_task(open_reserve())
    try:
        await together(*workers)  # a stop cancels each item once: its clean-up runs to its end
    finally:
        if later > 0:
            opener.cancel()
            await asyncio.gather(opener, return_exceptions=True)


class _Admission:
    """The indices to run, handed to the workers one at a time (an iterator they share).

    It calls ``last_admitted`` once no index is left and at most ``window``
    items are unfinished: with a reserve, the last item starts while more
    than ``window`` items still run, which is not yet the batch's end. Once
    no index is left it also opens ``reserve_opens`` (the reserved workers
    then find nothing to do and end, rather than wait for a moment that may
    never come, such as slots that items making no LLM call never fill).
    """

    def __init__(
        self,
        total: int,
        skip: Callable[[int], bool],
        window: int,
        last_admitted: Callable[[], None],
        reserve_opens: asyncio.Future[None],
    ) -> None:
        self._todo = (index for index in range(total) if not skip(index))
        self._following = next(self._todo, None)
        self._window = window
        self._last_admitted: Callable[[], None] | None = last_admitted
        self._reserve_opens = reserve_opens
        self._unfinished = 0
        if self._following is None:
            self._none_left()

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        index = self._following
        if index is None:
            raise StopIteration
        self._following = next(self._todo, None)
        self._unfinished += 1
        if self._following is None:
            self._none_left()
        self._tell_when_near_the_end()
        return index

    def _none_left(self) -> None:
        if not self._reserve_opens.done():
            self._reserve_opens.set_result(None)

    def finished(self) -> None:
        """Notes that an item handed out has finished."""
        self._unfinished -= 1
        self._tell_when_near_the_end()

    def _tell_when_near_the_end(self) -> None:
        if (
            self._following is None
            and self._unfinished <= self._window
            and self._last_admitted is not None
        ):
            tell, self._last_admitted = self._last_admitted, None
            tell()


class BatchStream:
    """Async iterator of `BatchResult`s; awaiting it gives the list of all of them.

    Returned by a batch call inside ``ExecutionSettings(streaming=True)``, so
    ``async for r in module(batch)`` needs no extra ``await``. A failed item
    is reported with ``ok=False`` and the other items go on.
    """

    def __init__(
        self,
        start: Callable[[Callable[[BatchResult], Awaitable[None] | None]], Awaitable[None]],
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
        def offer(result: BatchResult) -> Awaitable[None] | None:
            # Waits only while the queue is full: a coroutine per result would cost more
            # than the result's own bookkeeping.
            if queue.full():
                return queue.put(result)
            queue.put_nowait(result)
            return None

        try:
            await self._start(offer)
        finally:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # Cancelled by the consumer, which reads no more: waiting for room in a
                # full queue would never end (a Ctrl-C hung `plait run` here on uvloop).
                if not queue.full():
                    queue.put_nowait(None)
            else:
                with contextlib.suppress(asyncio.CancelledError):
                    await queue.put(None)

    async def _collect(self) -> list[BatchResult]:
        return [result async for result in self]

    def __await__(self) -> Generator[Any, None, list[BatchResult]]:
        return self._collect().__await__()


async def _report_restored(
    done: dict[int, Any],
    items: list[Any],
    reported: set[int],
    progress: Any,
    report: Any,
) -> None:
    """Reports the items a checkpoint already holds, in order, before any item runs."""
    profiler = _context.PROFILE.get()
    for index, output in sorted(done.items()):
        reported.add(index)
        if profiler is not None:
            profiler.record_item(index, None, restored=True)
        progress.advance(True)
        waiting = report(BatchResult(index, items[index], output))
        if waiting is not None:
            await waiting


async def run_batch(
    graphs: RunGraphs,
    items: list[Any],
    extra: tuple[Any, ...],
    kwargs: dict[str, Any],
    resources: Any,
    options: dict[str, Any],
    report: Any,
) -> None:
    """Runs every item, calling ``report(BatchResult)`` as each finishes.

    Each input shape is traced once for the whole batch (``graphs``); the
    checkpoint takes the first item's graph for the program's identity.
    """
    # import time: rich (a progress bar) and the resource layer load on use, not with execution
    from plait.execution.progress import BatchProgress
    from plait.resources.usage import metered

    module = graphs.module
    executor = Executor.for_call(module, resources, options)
    usage_by_index: dict[int, dict[str, Any]] = {}
    profiler = _context.PROFILE.get()  # counts items and keeps failures for a run report

    async def run_item(index: int, item: Any) -> Any:
        item_args = (item, *extra)
        graph = graphs.graph_for(item_args, kwargs)
        with metered() as meter:  # every call of this item, inner and re-asked ones too
            try:
                return await executor.run_program(graph, item_args, kwargs, index)
            finally:
                usage_by_index[index] = meter.as_dict()

    deadline = options["deadline"]
    until = None if deadline is None else asyncio.get_running_loop().time() + deadline
    checkpoint = await _checkpoint_of(graphs, items, extra, kwargs, executor, options, until)
    cache_token = USE_CACHE.set(options["cache"])
    callbacks = resolve_callbacks()
    reported: set[int] = set()
    try:
        with BatchProgress(len(items), options["progress"], executor.manager) as progress:

            def on_result(result: BatchResult) -> Any:
                reported.add(result.index)
                usage = usage_by_index.pop(result.index, None)
                result.usage = usage
                kept = None
                if checkpoint is not None and result.ok:
                    kept = checkpoint.write(result.index, result.output, usage)
                if profiler is not None:
                    profiler.record_item(result.index, result.error)
                progress.advance(result.ok)
                return _both(kept, report(result))

            if checkpoint is not None:
                await _report_restored(checkpoint.done, items, reported, progress, report)
            skip = checkpoint.is_done if checkpoint is not None else (lambda index: False)
            try:
                async with asyncio.timeout_at(until) as scope:
                    await run_items(
                        items,
                        run_item,
                        executor.max_concurrent,
                        on_result,
                        skip,
                        executor.last_item_admitted,
                        reserve=executor.max_concurrent,
                        reserve_after=executor.slots_filled,
                    )
            except TimeoutError:
                if not scope.expired():
                    raise
                await _fail_unfinished(items, reported, deadline, on_result)
    finally:
        USE_CACHE.reset(cache_token)
        _context.CALLBACKS.reset(callbacks)
        if checkpoint is not None:
            await checkpoint.aclose(until)  # its rows' writes end with the deadline too


async def _checkpoint_of(
    graphs: RunGraphs,
    items: list[Any],
    extra: tuple[Any, ...],
    kwargs: dict[str, Any],
    executor: Executor,
    options: dict[str, Any],
    until: float | None,
) -> Any:
    """Opens the batch's checkpoint: in ``checkpoint_dir``, else in the resources' state
    store, unless the run asked for nothing stored to answer it (``cache=False``); None
    when there is none.

    The batch's deadline (``until``, a loop time) bounds this too: a state store that
    does not answer is asked again for a while, and that wait ends with the deadline.

    Raises:
        DeadlineExceededError: the deadline passed before the checkpoint was read.
    """
    directory = options["checkpoint_dir"] or None
    state = getattr(executor.manager.config, "state", None)
    if not items or not (directory or (state is not None and options["cache"])):
        return None
    from plait.execution.checkpoint import open_checkpoint  # import time: only a checkpointed batch

    graph = graphs.graph_for((items[0], *extra), kwargs)
    try:
        async with asyncio.timeout_at(until) as opening:
            return await open_checkpoint(
                graphs.module, graph, items, executor, directory, (extra, kwargs)
            )
    except TimeoutError as exc:
        if not opening.expired():
            raise
        deadline = options["deadline"]
        raise DeadlineExceededError(
            f"the batch's checkpoint could not be read within its deadline of {deadline:g} s "
            "(its state store did not answer); no item was sent. Run it again when the "
            "store answers, or raise deadline=",
            deadline=deadline,
        ) from exc


def _both(first: Awaitable[Any] | None, second: Awaitable[Any] | None) -> Any:
    """Returns what waits for both (None when neither waits): a checkpoint that is full and a
    consumer that falls behind both hold the batch back."""
    if first is None:
        return second
    if second is None:
        return first

    async def both() -> None:
        await first
        await second

    return both()


async def _fail_unfinished(
    items: list[Any],
    reported: set[int],
    deadline: float,
    on_result: Any,
) -> None:
    """Reports every item that had not finished when the batch's deadline passed."""
    unfinished = len(items) - len(reported)
    for index, item in enumerate(items):
        if index in reported:
            continue
        error = unfinished_error(index, deadline, unfinished, len(items))
        waiting = on_result(BatchResult(index, item, error=error))
        if waiting is not None:
            await waiting


def unfinished_error(
    index: int, deadline: float, unfinished: int, total: int, detail: str = ""
) -> DeadlineExceededError:
    """Returns the error of batch item ``index``, still running when the batch's deadline passed."""
    return DeadlineExceededError(
        f"input {index} did not finish within the batch's deadline of {deadline:g} s "
        f"({unfinished} of {total} items unfinished); its work was cancelled{detail}",
        deadline=deadline,
        input_index=index,
    )


async def batch_to_list(
    graphs: RunGraphs,
    items: list[Any],
    extra: tuple[Any, ...],
    kwargs: dict[str, Any],
    resources: Any,
    options: dict[str, Any],
) -> list[Any]:
    outputs: list[Any] = [None] * len(items)
    collect = options["on_error"] == "collect"

    def report(result: BatchResult) -> None:
        if result.error is not None and not collect:
            raise _item_error(result)
        outputs[result.index] = result.output if result.ok else result.error

    await run_batch(graphs, items, extra, kwargs, resources, options, report)
    return outputs


def _item_error(result: BatchResult) -> BaseException:
    assert result.error is not None
    return locate(result.error, f"input {result.index} failed", input_index=result.index)
