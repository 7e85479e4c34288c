"""Running programs for requests: one resource manager for all, admission, usage, pauses.

The `RunService` lives as long as the app. It opens one `ResourceManager` when the app
starts, so every request shares the endpoints' limits, cache, retries and budgets, and
closes it when the app stops. Each run is admitted first (`Admission`: a bounded number run
at once, a bounded number wait, the rest are refused), is metered on its own (the usage of
that request alone), and either finishes with an output or pauses for approval, in which
case the pause is kept in the pending store and the client gets its run id.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from plait.confirmation import ConfirmationRequired
from plait.resources import ResourceConfig, ResourceManager
from plait.resources.usage import UsageMeter, metered
from plait.serve.events import event_data
from plait.serve.options import ServeOptions
from plait.serve.pending import MemoryPendingStore, PendingRun, PendingStore
from plait.serve.programs import ServedProgram, json_data
from plait.streaming import StreamEvent

__all__ = ["Admission", "Draining", "Outcome", "Overloaded", "RunService"]


class Overloaded(Exception):
    """Too many runs are waiting already: the request is refused (429)."""


class Draining(Exception):
    """The server is stopping: it finishes the runs it has and takes no new ones (503)."""


class Admission:
    """Lets at most ``max_active`` runs execute at once and ``max_queued`` more wait.

    A run beyond both is refused at once (`Overloaded`), so a burst the endpoints cannot
    serve turns into quick 429s rather than a queue that grows without bound.
    """

    def __init__(self, max_active: int, max_queued: int) -> None:
        self.max_queued = max_queued
        self._slots = asyncio.Semaphore(max_active)
        self.active = 0
        """Runs executing now."""
        self.waiting = 0
        """Runs waiting for a place now."""

    @contextlib.asynccontextmanager
    async def place(self) -> AsyncIterator[None]:
        """Holds a place for one run while the block executes.

        Raises:
            Overloaded: every place is taken and the queue is full.
        """
        if self._slots.locked():
            if self.waiting >= self.max_queued:
                raise Overloaded
            self.waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self.waiting -= 1
        else:
            await self._slots.acquire()
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            self._slots.release()

    @property
    def in_flight(self) -> int:
        """Runs admitted and not finished: executing or waiting."""
        return self.active + self.waiting


@dataclass
class Outcome:
    """How one run ended: with an output, or paused for approval (``pause`` set)."""

    run_id: str
    usage: UsageMeter
    output: Any = None
    pause: ConfirmationRequired | None = None


class RunService:
    """Runs the served programs for requests, sharing one set of resources.

    Args:
        programs: the served programs by name.
        resources: the resources every request uses (a config, mapping or manager; a
            manager given here is used as it is and not closed by the server).
        options: the server's options.
    """

    def __init__(
        self, programs: dict[str, ServedProgram], resources: Any, options: ServeOptions
    ) -> None:
        self.programs = programs
        self.options = options
        self.resources = resources
        self.manager: ResourceManager | None = None
        self.pending: PendingStore = options.pending_store or MemoryPendingStore()
        self.admission = Admission(options.max_active, options.max_queued)
        self.draining = False

    # -- lifetime -----------------------------------------------------------------------

    async def open(self) -> None:
        """Opens the resources for the app's lifetime (inside the server's event loop)."""
        if isinstance(self.resources, ResourceManager):
            self.manager = self.resources
        else:
            self.manager = ResourceManager(
                self.resources
                if isinstance(self.resources, ResourceConfig)
                else ResourceConfig(self.resources)
            )

    async def aclose(self) -> None:
        """Closes what `open` opened, and the pending store."""
        manager, self.manager = self.manager, None
        if manager is not None and manager is not self.resources:
            await manager.aclose()
        await self.pending.aclose()

    @property
    def is_ready(self) -> bool:
        """Whether the server takes runs: resources open and not draining."""
        return self.manager is not None and not self.manager.is_closed and not self.draining

    # -- runs ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """Holds a place for a run while the block executes (see `Admission.place`); the
        route holds it around `run`, or for as long as it sends a `stream`.

        Raises:
            Draining: the server is stopping.
            Overloaded: too many runs wait already.
        """
        if self.draining:
            raise Draining
        async with self.admission.place():
            yield

    def _call_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"resources": self.manager}
        if self.options.deadline is not None:
            options["deadline"] = self.options.deadline
        return options

    async def run(self, served: ServedProgram, arguments: dict[str, Any]) -> Outcome:
        """Runs ``served`` once with ``arguments``; returns its output or its pause.

        Raises:
            PlaitError: the program failed (``DeadlineExceededError`` past the deadline).
        """
        from plait.execution import run

        outcome = Outcome(uuid.uuid4().hex, UsageMeter())
        with metered(outcome.usage):
            try:
                outcome.output = await run(served.module, **self._call_options(), **arguments)
            except ConfirmationRequired as pause:
                outcome.pause = pause
        return outcome

    async def stream(
        self, served: ServedProgram, arguments: dict[str, Any]
    ) -> AsyncIterator[tuple[str, Any, bool]]:
        """Yields ``(name, data, own)`` of each event of one run, then ``output`` or ``paused``.

        ``own`` tells an event the program's own call made (not one of its children).
        Stopping the iteration (the client left) cancels the run and its requests.

        Raises:
            PlaitError: the program failed (after the events it made before failing).
        """
        outcome = Outcome(uuid.uuid4().hex, UsageMeter())
        with metered(outcome.usage):
            events = served.module.astream(**self._call_options(), **arguments)
            try:
                async for item in events:
                    if getattr(item, "confirmation", None) is not None:
                        outcome.pause = item.confirmation
                    elif isinstance(item, StreamEvent) and not _is_output(item):
                        name, data = event_data(item)
                        yield name, data, getattr(item, "module", None) is served.module
                    else:
                        outcome.output = item
            except ConfirmationRequired as pause:
                outcome.pause = pause
            finally:
                await events.aclose()
        if outcome.pause is not None:
            yield "paused", await self.paused_body(served, arguments, outcome.pause, outcome), True
        else:
            yield "output", self.result_body(outcome), True

    # -- bodies -------------------------------------------------------------------------

    def result_body(self, outcome: Outcome) -> dict[str, Any]:
        """Returns the JSON body of a finished run."""
        return {
            "run_id": outcome.run_id,
            "status": "completed",
            "output": json_data(outcome.output),
            "usage": outcome.usage.as_dict(),
        }

    async def paused_body(
        self,
        served: ServedProgram,
        arguments: dict[str, Any],
        pause: ConfirmationRequired,
        outcome: Outcome,
    ) -> dict[str, Any]:
        """Keeps a paused run in the pending store; returns the JSON body that tells of it."""
        await self.pending.put(
            PendingRun(outcome.run_id, served.name, json_data(arguments), pause.to_dict())
        )
        return {
            "run_id": outcome.run_id,
            "status": "paused",
            "program": served.name,
            "pending": [pending_call(pause)],
            "usage": outcome.usage.as_dict(),
        }


def pending_call(pause: ConfirmationRequired) -> dict[str, Any]:
    """Returns a pause's waiting call as JSON data (`PendingCall`)."""
    return {
        "approval_id": pause.approval_id,
        "call_id": pause.confirmation_id,
        "tool_name": pause.tool_name,
        "arguments": json_data(pause.arguments),
        "question": pause.question,
    }


def _is_output(item: StreamEvent) -> bool:
    """Whether a stream item is the program's output rather than an event: a final
    `Prediction` (events never are one)."""
    return getattr(item, "is_final", False) is True and hasattr(item, "native_tool_calls")
