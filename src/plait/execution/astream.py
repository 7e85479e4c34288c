"""``module.astream(...)``: run a program and yield its events as they happen, then its output.

The program runs as a task in a copy of the caller's context in which
`plait.streaming` finds the consumer's `EventStream`; everything inside it
that emits (token streams, tools, your own code) reaches the consumer
through that stream. The consumer controls the work: when it stops
iterating (``break``, an exception, cancellation) the task is cancelled,
and with it every request in flight. A program that pauses for a person's
confirmation ends its stream with the pause, a non-final `Prediction`
carrying the `ConfirmationRequired` (resume with ``resume_state=``).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncGenerator
from typing import Any

from plait import _context
from plait.errors import ExecutionInterrupt
from plait.execution.run import execute_bound, is_batch
from plait.module import takes_keyword
from plait.streaming import EventStream

__all__ = ["stream_events"]


async def stream_events(
    module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> AsyncGenerator[Any, None]:
    """Yields the `StreamEvent`s of one call of ``module``, then its output (the last item).

    A ``forward`` that declares a ``stream`` parameter is called with
    ``stream=True`` unless the caller gave it (see `Module.aforward`).

    Raises:
        TypeError: the first argument is a batch (stream batches with
            ``ExecutionSettings(streaming=True)`` instead).
        PlaitError: the module has no resources, or the program failed (raised
            after the events it emitted before failing).
    """
    if args and is_batch(args[0]):
        raise TypeError(
            f"{type(module).__name__}.astream() runs one input, got a list of "
            f"{len(args[0])}; for a batch, iterate `async for result in module(batch)` "
            "inside ExecutionSettings(streaming=True)"
        )
    if "stream" not in kwargs and takes_keyword(type(module).forward, "stream"):
        # A forward that takes ``stream`` is told it is being streamed, so it can
        # pass the flag on to the children it wants streamed.
        kwargs = {**kwargs, "stream": True}
    work = execute_bound(module, args, kwargs)
    stream = EventStream()
    context = contextvars.copy_context()
    context.run(_context.STREAM.set, stream)
    task = asyncio.get_running_loop().create_task(work, context=context)  # type: ignore[arg-type]
    task.add_done_callback(lambda _: stream.close())
    last: Any = None
    try:
        while (event := await stream.get()) is not None:
            yield event
            last = event
        try:
            output = task.result()
        except ExecutionInterrupt as interrupt:
            if getattr(last, "confirmation", None) is interrupt:
                return  # the pause was the last event (a non-final Prediction): a normal end
            raise
    finally:
        if not task.done():  # the consumer stopped early: stop the program with it
            task.cancel()
            await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # retrieved: whatever it was, the consumer has left or seen it
    yield output
