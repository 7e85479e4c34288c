"""`together`: awaits concurrent steps so that none outlives the step that started them.

`asyncio.gather` raises the first error at once and leaves the other awaitables
running: a search that raised (an endpoint's failure, an endpoint's own budget,
a metric's error) would return to its caller with proposals or evaluations still
sending requests, which no report counts and no budget of the caller sees end.
`together` cancels the others and waits for them before it raises. When the
caller itself is cancelled, `gather` has already cancelled each of them; they are
not cancelled a second time, so a step's own clean-up on cancel runs to its end.
A batch's items (`plait.execution.batch.run_items`) and every concurrent step of
learning are awaited through it, so both layers stop work the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["together"]

T = TypeVar("T")


async def together(*steps: Awaitable[T]) -> list[T]:
    """Awaits ``steps`` concurrently and returns their results in order, like
    `asyncio.gather`; when one raises (or the caller is cancelled), every other one is
    cancelled once and awaited before the error is raised."""
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(step) for step in steps]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            # A task the caller's cancel already reached (through the gather) is not
            # cancelled again: its clean-up on cancel runs to its end.
            if not task.done() and not (isinstance(task, asyncio.Task) and task.cancelling()):
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
