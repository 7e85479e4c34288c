"""Running programs for requests: one resource manager for all, admission, usage, pauses.

The `RunService` lives as long as the app. It opens one `ResourceManager` when the app
starts, so every request shares the endpoints' limits, cache, retries and budgets, and
closes it when the app stops. Each run is admitted first (`Admission`: a bounded number run
at once, a bounded number wait, the rest are refused), is metered on its own (the usage of
that request alone), and either finishes with an output or pauses for approval, in which
case the pause is kept in the pending store, with the fingerprint of the API key that
started it, and the client gets its run id. A paused run is seen and resumed only with that
key, and resumed once: the resume is admitted first, then `RunService.claim` takes the run
from the store, checks its seal and pairs it with the person's answer, and it runs like any
other, with the inputs it paused on (media included); it may pause again, or end
``rejected`` when the person's "no" stops it. A resume that fails before its approval is used
(the client left, the deadline passed, a model call failed first) puts the run back to wait,
so a retry runs it; the approval ledger keeps the call to one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from plait.confirmation import (
    APPROVAL_KEY_ENV,
    ConfirmationRequired,
    ResumeState,
    approval_used,
    set_approval_key,
    set_approval_ledger,
)
from plait.errors import ConfigError, ConfirmationRejected, ResumeRefusedError
from plait.execution import run
from plait.module import Module
from plait.resources import ResourceConfig, ResourceManager
from plait.resources.config import resources_with_state
from plait.resources.limits import limiter_shares, too_small_to_share
from plait.resources.shared_budget import BudgetStore
from plait.resources.state import StateStore, StateURL, open_store, release_store
from plait.resources.usage import UsageMeter, metered
from plait.serve.events import RunEvents
from plait.serve.ids import random_id
from plait.serve.options import ServeOptions
from plait.serve.pending import (
    MemoryPendingStore,
    PendingRun,
    PendingStore,
    PendingStoreFull,
    SQLitePendingStore,
)
from plait.serve.programs import ServedProgram, json_data
from plait.streaming import StreamEvent, StreamRestart

__all__ = [
    "Admission",
    "Draining",
    "NotResumable",
    "Outcome",
    "Overloaded",
    "Resume",
    "RunService",
    "check_shares",
]

logger = logging.getLogger("plait.serve")


class Overloaded(Exception):
    """Too many runs are waiting already: the request is refused (429)."""


class Draining(Exception):
    """The server is stopping: it finishes the runs it has and takes no new ones (503)."""


class NotResumable(Exception):
    """A resume the server refuses before running anything, with the status it answers.

    Attributes:
        status: 404 (no such paused run, or another key's), 409 (resumed already, or its
            stored state no longer fits the program), 410 (expired) or 422 (the answers do
            not fit its pending calls).
        kind: the error's ``type``.
        message: what is wrong and what to do.
    """

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


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

    async def enter(self) -> None:
        """Takes a place for one run (waiting for one while the queue has room); `leave`
        gives it back.

        Raises:
            Overloaded: every place is taken and the queue is full.
        """
        slots = self._slots
        if slots.locked():
            if self.waiting >= self.max_queued:
                raise Overloaded
            self.waiting += 1
            try:
                await slots.acquire()
            finally:
                self.waiting -= 1
        else:
            await slots.acquire()
        self.active += 1

    def leave(self) -> None:
        """Gives back the place `enter` took."""
        self.active -= 1
        self._slots.release()

    @property
    def in_flight(self) -> int:
        """Runs admitted and not finished: executing or waiting."""
        return self.active + self.waiting


@dataclass
class Outcome:
    """How one run ended: with an output, paused for approval (``pause`` set), or stopped
    by the person's "no" (``rejected`` set)."""

    run_id: str
    usage: UsageMeter
    owner: str | None = None
    """The fingerprint of the API key that started the run (`plait.serve.owners`)."""
    output: Any = None
    pause: ConfirmationRequired | None = None
    rejected: ConfirmationRejected | None = None


@dataclass(frozen=True)
class Resume:
    """A paused run taken from the store for one resume (`RunService.claim`).

    Attributes:
        run: the run as it was stored (put back when the resume fails before its approval
            is used).
        arguments: the inputs it paused on, validated again.
        state: its pause with the person's answer.
    """

    run: PendingRun
    arguments: dict[str, Any]
    state: ResumeState


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
        self.state = options.state or _state_of(resources)
        if options.state is not None and not isinstance(resources, ResourceManager):
            resources = resources_with_state(_config(resources), options.state)
        self.resources = resources
        self.manager: ResourceManager | None = None
        self._books_store: StateStore | None = None
        self.pending: PendingStore = (
            _pending_store(options, self.state)
            if options.pending_store is None
            else options.pending_store
        )  # not `or`: an empty store has no length, and is still the one given
        self.admission = Admission(options.max_active, options.max_queued)
        self.draining = False
        self._admitted = _Admitted(self)
        if options.workers > 1:
            check_shares(resources, options.workers)

    # -- lifetime -----------------------------------------------------------------------

    async def open(self) -> None:
        """Opens the resources for the app's lifetime (inside the server's event loop), and
        sets the process's approval key and ledger for the pauses it serves."""
        self._approvals_open()
        if isinstance(self.resources, ResourceManager):
            self.manager = self.resources
        else:
            workers = self.options.workers
            self.manager = ResourceManager(
                _config(self.resources),
                limiter_factory=limiter_shares(workers) if workers > 1 else None,
                budget_store=self.options.budget_store or self._shared_books(),
            )

    def _shared_books(self) -> BudgetStore | None:
        """The endpoints' budgets in the state store, shared by every process and machine
        serving with it (`StateBooks`); None without a store."""
        if self.state is None:
            return None
        from plait.resources.budget_state import StateBooks  # import time: only with a store

        self._books_store = open_store(self.state)
        return BudgetStore(StateBooks(self._books_store))

    async def aclose(self) -> None:
        """Closes what `open` opened, and the pending store."""
        manager, self.manager = self.manager, None
        if manager is not None and manager is not self.resources:
            await manager.aclose()
        books, self._books_store = self._books_store, None
        if books is not None:
            release_store(books)
        await self.pending.aclose()
        self._approvals_close()

    def _approvals_open(self) -> None:
        """Seals pauses with the configured key, and records used approvals in the store
        when it can (`SQLitePendingStore`), so a replay is refused after a restart too."""
        key = self.options.approval_key()
        if key is not None:
            set_approval_key(key)
        elif not os.environ.get(APPROVAL_KEY_ENV) and (self.state or self.options.pending_db):
            logger.warning(
                "plait serve: no approval key is configured, so pauses are sealed with a key "
                "of this process: paused runs kept in %s cannot be resumed after a restart "
                "or by another process; set %s or --approval-key-env NAME",
                self.state or self.options.pending_db,
                APPROVAL_KEY_ENV,
            )
        if callable(getattr(self.pending, "use", None)):
            set_approval_ledger(self.pending)  # type: ignore[arg-type]

    def _approvals_close(self) -> None:
        if self.options.approval_key_env is not None:
            set_approval_key(None)
        if callable(getattr(self.pending, "use", None)):
            set_approval_ledger(None)

    @property
    def is_ready(self) -> bool:
        """Whether the server takes runs: resources open and not draining."""
        return self.manager is not None and not self.manager.is_closed and not self.draining

    # -- runs ---------------------------------------------------------------------------

    def admitted(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Returns the context that holds a place for a run while its block executes (see
        `Admission.enter`); the route holds it around `run`, or for as long as it sends a
        `stream`. Entering it raises `Draining` when the server is stopping, `Overloaded`
        when too many runs wait already."""
        return self._admitted

    def _call_options(self, resume: Resume | None) -> dict[str, Any]:
        options: dict[str, Any] = {"resources": self.manager}
        if self.options.deadline is not None:
            options["deadline"] = self.options.deadline
        if resume is not None:
            options["resume_state"] = resume.state
        return options

    async def run(
        self,
        served: ServedProgram,
        arguments: dict[str, Any],
        resume: Resume | None = None,
        *,
        owner: str | None = None,
    ) -> Outcome:
        """Runs ``served`` once with ``arguments`` (resuming ``resume``, if given), for the
        API key whose fingerprint is ``owner``; returns its output, its pause or the
        person's rejection.

        Raises:
            PlaitError: the program failed (``DeadlineExceededError`` past the deadline,
                ``ResumeRefusedError`` for a resume the approval rules refuse); a resumed
                run whose approval was not used by then waits again (`_put_back`).
        """
        outcome = Outcome(random_id(), UsageMeter(), owner)
        with metered(outcome.usage):
            try:
                outcome.output = await run(served.module, **self._call_options(resume), **arguments)
            except ConfirmationRequired as pause:
                outcome.pause = pause
            except ConfirmationRejected as rejected:
                outcome.rejected = rejected
            except BaseException as failure:
                await self._put_back(resume, failure)
                raise
        return outcome

    async def stream(
        self,
        served: ServedProgram,
        arguments: dict[str, Any],
        resume: Resume | None = None,
        *,
        owner: str | None = None,
    ) -> AsyncIterator[tuple[str, Any, bool]]:
        """Yields ``(name, data, in_reply)`` of each event of one run, then its last event:
        ``output``, ``paused`` or ``rejected`` (see `finish`).

        Text events carry deltas (`RunEvents`). ``in_reply`` tells a text event that is
        part of the chat reply as it is written (`ServedProgram.reply_streams`: the text of
        the call whose output the program returns, of the field that is the reply), and a
        restart of that call, which takes that text back; the text of other calls is not.
        Stopping the iteration (the client left) cancels the run and its requests.

        Raises:
            PlaitError: the program failed (after the events it made before failing); a
                resumed run whose approval was not used by then waits again.
        """
        outcome = Outcome(random_id(), UsageMeter(), owner)
        reply = served.reply_streams(arguments)
        encoder = RunEvents()
        with metered(outcome.usage):
            events = served.module.astream(**self._call_options(resume), **arguments)
            try:
                async for item in events:
                    if getattr(item, "confirmation", None) is not None:
                        outcome.pause = item.confirmation
                    elif isinstance(item, StreamEvent) and not _is_output(item):
                        name, data = encoder.data(item)
                        yield name, data, _in_reply(item, reply)
                    else:
                        outcome.output = item
            except ConfirmationRequired as pause:
                outcome.pause = pause
            except ConfirmationRejected as rejected:
                outcome.rejected = rejected
            except BaseException as failure:  # the client leaving closes this: GeneratorExit
                await events.aclose()
                await self._put_back(resume, failure)
                raise
            finally:
                await events.aclose()
        name, body = await self.finish(served, arguments, outcome)
        yield name, body, True

    async def _put_back(self, resume: Resume | None, failure: BaseException) -> None:
        """Lets a resumed run wait again when its run failed before its approval was used:
        no call of it ran, so a retry may run it (the ledger keeps that to once). A resume
        the approval rules refused stays gone, and so does one whose ledger cannot tell."""
        if resume is None or isinstance(failure, ResumeRefusedError):
            return
        if approval_used(resume.state.approval_id) is not False:
            return
        try:
            await asyncio.shield(self.pending.restore(resume.run))
        except Exception:  # the failure the client hears of is the run's
            logger.exception("paused run %s could not be put back to wait", resume.run.run_id)
            return
        logger.info(
            "paused run %s waits again: its resume failed (%s) before its approval was used",
            resume.run.run_id,
            type(failure).__name__,
        )

    async def claim(
        self, served: ServedProgram, run_id: str, answers: dict[str, Any], owner: str | None
    ) -> Resume:
        """Takes the paused run ``run_id`` from the store for the person's ``answers``, given
        by the API key whose fingerprint is ``owner``; returns it with the arguments it
        paused on and its resume state.

        The run must be ``owner``'s; its answers are checked against its pending calls and
        its stored inputs validated before it is taken, so a mistaken request leaves it
        waiting; once taken, no other request gets it, and a stored pause whose seal fails
        is refused (and gone).

        Raises:
            NotResumable: no such run of this key (404), taken already (409), its inputs no
                longer fit the program (409, and gone), expired (410), answers that do not
                fit its pending calls (422).
            ResumeRefusedError: the stored pause was changed, or sealed with another key.
        """
        waiting = await self._waiting(served, run_id, owner)
        if waiting is None:
            raise await self._not_waiting(served, run_id, owner)
        _check_answers(waiting, answers)
        try:
            arguments = served.arguments(served.input_model.model_validate(waiting.inputs))
        except ValidationError as exc:
            await self.pending.take(run_id)
            raise NotResumable(
                409,
                "resume_refused",
                f"run {run_id!r} cannot be resumed: its stored inputs no longer fit "
                f"{served.name}'s inputs ({exc.error_count()} errors; was the program "
                "changed?); run it again",
            ) from None
        taken = await self.pending.take(run_id)
        if taken is None:  # another request took it since
            raise await self._not_waiting(served, run_id, owner)
        pause = ConfirmationRequired.from_dict(taken.pause)
        # the arguments are the waiting run's inputs: the pause holds their hashes under its
        # seal (media by content), so inputs changed since do not resume
        return Resume(taken, arguments, ResumeState(pause, answers[pause.confirmation_id]))

    async def paused(self, served: ServedProgram, run_id: str, owner: str | None) -> dict[str, Any]:
        """Returns the body that shows the paused run ``run_id`` to the key ``owner``.

        Raises:
            NotResumable: no run of this key waits under that id (404), taken or not.
        """
        waiting = await self._waiting(served, run_id, owner)
        if waiting is None:
            message = f"no run {run_id!r} of {served.name} waits for approval"
            raise NotResumable(404, "not_found", message)
        pause = ConfirmationRequired.from_dict(waiting.pause)
        return {
            "run_id": waiting.run_id,
            "status": "paused",
            "program": served.name,
            "pending": [pending_call(pause)],
        }

    async def _waiting(
        self, served: ServedProgram, run_id: str, owner: str | None
    ) -> PendingRun | None:
        """Returns the run of ``served`` that waits under ``run_id`` for ``owner``, if any."""
        waiting = await self.pending.get(run_id)
        if waiting is None or waiting.program != served.name or not _sees(owner, waiting.owner):
            return None
        return waiting

    async def _not_waiting(
        self, served: ServedProgram, run_id: str, owner: str | None
    ) -> NotResumable:
        gone = await self.pending.gone(run_id)
        why = gone.why if gone is not None and _sees(owner, gone.owner) else None
        if why == "resumed":
            message = f"run {run_id!r} was resumed already; a paused run is resumed once"
            return NotResumable(409, "already_resumed", message)
        if why == "expired":
            message = (
                f"run {run_id!r} waited longer than this server keeps paused runs "
                f"({self.pending_ttl:g} s) and expired; run the program again"
            )
            return NotResumable(410, "expired", message)
        message = f"no run {run_id!r} of {served.name} waits for approval"
        return NotResumable(404, "not_found", message)

    @property
    def pending_ttl(self) -> float:
        """Seconds a paused run waits in the store before it expires."""
        return float(getattr(self.pending, "ttl", self.options.pending_ttl))

    # -- bodies -------------------------------------------------------------------------

    async def finish(
        self, served: ServedProgram, arguments: dict[str, Any], outcome: Outcome
    ) -> tuple[str, dict[str, Any]]:
        """Returns how a run ended (``output``, ``paused`` or ``rejected``) and its JSON body;
        a paused run is kept in the pending store first.

        Raises:
            PendingRunTooLarge: the paused run's state is over the store's limit.
        """
        if outcome.pause is not None:
            return "paused", await self.paused_body(served, arguments, outcome.pause, outcome)
        if outcome.rejected is not None:
            return "rejected", rejected_body(outcome.run_id, outcome.rejected, outcome.usage)
        return "output", self.result_body(outcome)

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
        """Keeps a paused run in the pending store; returns the JSON body that tells of it.

        Raises:
            PendingRunTooLarge: its state is over the store's limit.
            PendingStoreFull: the store, or the key's share of it, is full (logged: the
                run's pause is not kept).
        """
        inputs = json_data(arguments, content=True)  # media as their bytes, to run on again
        run = PendingRun(outcome.run_id, served.name, inputs, pause.to_dict(), owner=outcome.owner)
        try:
            await self.pending.put(run)
        except PendingStoreFull as full:
            logger.warning("paused run %s of %s not kept: %s", run.run_id, served.name, full)
            raise
        return {
            "run_id": outcome.run_id,
            "status": "paused",
            "program": served.name,
            "pending": [pending_call(pause)],
            "usage": outcome.usage.as_dict(),
        }


class _Admitted:
    """`RunService.admitted`: a class rather than a generator-made context, which cost every
    request two generators; one per service, as it keeps nothing of a run."""

    __slots__ = ("service",)

    def __init__(self, service: RunService) -> None:
        self.service = service

    async def __aenter__(self) -> None:
        if self.service.draining:
            raise Draining
        await self.service.admission.enter()

    async def __aexit__(self, *exc_info: object) -> None:
        self.service.admission.leave()


def _config(resources: Any) -> ResourceConfig:
    return resources if isinstance(resources, ResourceConfig) else ResourceConfig(resources)


def check_shares(resources: Any, workers: int) -> None:
    """Refuses resources that ``workers`` processes cannot split: a `ResourceManager` (its
    limiters are made already), or an endpoint whose ``max_concurrent`` is below
    ``workers`` (each process needs one slot at least, and together they would pass it).
    An in-process model (``local``) is not split: each worker loads its own.

    Raises:
        ConfigError: naming the endpoints, and what to change.
    """
    if isinstance(resources, ResourceManager):
        raise ConfigError(
            f"{workers} workers cannot share a ResourceManager's limits; give the server a "
            "ResourceConfig (or its mapping or file) and each worker makes its share"
        )
    config = _config(resources)
    endpoints = {c.name: c for alias in config.aliases() for c in config.fallbacks(alias)}
    small = too_small_to_share(list(endpoints.values()), workers)
    if small:
        raise ConfigError(
            f"{workers} workers each hold 1/{workers} of every endpoint's limits, and "
            f"{', '.join(small)} cannot be split that way; lower --workers, or raise their "
            f"max_concurrent to {workers} or more in the resources file if the server takes "
            "that many calls at once"
        )


def _in_reply(event: StreamEvent, reply: tuple[Module, str] | None) -> bool:
    """Whether ``event`` is text of the chat reply's module and field, or a restart of that
    module, which takes its text back (see `stream`)."""
    if reply is None or getattr(event, "module", None) is not reply[0]:
        return False
    return (
        isinstance(event, StreamRestart)
        or not reply[1]
        or getattr(event, "field_name", None) == reply[1]
    )


def _state_of(resources: Any) -> StateURL | None:
    """The state store the resources name (a resources file's ``[state] url``), if any; none
    for a manager (its cache is made already) or no resources at all (a service whose
    programs call no model, as some tests make)."""
    if isinstance(resources, ResourceManager) or (isinstance(resources, Mapping) and not resources):
        return None
    return _config(resources).state


def _pending_store(options: ServeOptions, state: str | StateURL | None) -> PendingStore:
    """Returns the store the options name: the state store ``state``, the file
    ``pending_db``, or memory."""
    ttl, size = options.pending_ttl, options.max_pending_bytes
    runs, per_key = options.max_pending_runs, options.max_pending_per_key
    if state is not None:
        from plait.serve.pending_state import StatePendingStore  # import time: only with a store

        return StatePendingStore(
            state, ttl=ttl, max_state_bytes=size, max_runs=runs, max_per_owner=per_key
        )
    if options.pending_db is not None:
        return SQLitePendingStore(
            options.pending_db, ttl=ttl, max_state_bytes=size, max_runs=runs, max_per_owner=per_key
        )
    return MemoryPendingStore(runs, ttl=ttl, max_state_bytes=size, max_per_owner=per_key)


def _sees(owner: str | None, runs_owner: str | None) -> bool:
    """Whether the key ``owner`` may see a run of ``runs_owner``: its own, or one kept with
    no owner (started on a server without keys, or by a plait that kept none)."""
    return runs_owner is None or runs_owner == owner


def rejected_body(run_id: str, rejected: ConfirmationRejected, usage: UsageMeter) -> dict[str, Any]:
    """Returns the JSON body of a run the person's "no" stopped."""
    return {
        "run_id": run_id,
        "status": "rejected",
        "message": rejected.message,
        "call_id": rejected.confirmation_id,
        "usage": usage.as_dict(),
    }


def _check_answers(run: PendingRun, answers: dict[str, Any]) -> None:
    """Refuses answers for calls that are not pending, or missing the pending call's.

    Raises:
        NotResumable: 422, naming the calls.
    """
    pending = {str(run.pause.get("confirmation_id"))}
    unknown = sorted(set(answers) - pending)
    missing = sorted(pending - set(answers))
    if unknown:
        message = (
            f"answers.{unknown[0]}: not a pending call of run {run.run_id!r} (answered but "
            f"not pending: {', '.join(unknown)}; pending: {', '.join(sorted(pending))})"
        )
        raise NotResumable(422, "invalid_input", message)
    if missing:
        message = (
            f"answers: no answer for the pending call(s) {', '.join(missing)} of run "
            f'{run.run_id!r}; answer each with "yes", "no" (or a reason) or edited arguments'
        )
        raise NotResumable(422, "invalid_input", message)


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
