"""Learning steps told to callbacks: runs, rounds, candidates, proposals, decisions, updates.

The searches, the optimizers and the `Trainer` call these helpers at each
step, one call per step, so a callback (the OpenTelemetry one, the run
report's `LearningLog`, a user's own) sees why a search did what it did.
The hooks and what they receive are listed in `plait.callbacks`.

An optimisation run makes its program's callbacks the active ones
(`observed_run`), so everything inside it — evaluations, proposals and the
model calls they make — is told to the same callbacks and nests under the
step that made it. With no callback listening, a step costs one context
lookup, and nothing is hashed or copied.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from plait import _context
from plait.callbacks import ReportedCall, active_callbacks, callbacks_for, tell

__all__ = [
    "Rounds",
    "learning_step",
    "observed_run",
    "rounds_of",
    "tell_decision",
    "tell_update",
    "updates_told",
]

R = TypeVar("R")


async def observed_run(
    optimizer: Any, program: Any, work: Awaitable[R], summary: Callable[[R], dict[str, Any]]
) -> R:
    """Awaits ``work`` as one optimisation run of ``optimizer`` on ``program``, told to callbacks.

    The program's callbacks (the active ones plus its own) are the active
    ones inside, so every step and call of the run is told to them;
    ``summary`` turns the run's report into the data ``on_optimize_end`` gets.
    """
    callbacks = callbacks_for(program)
    if not callbacks:
        return await work
    inputs = {"optimizer": type(optimizer).__name__, "program": type(program).__name__}
    with ReportedCall("optimize", optimizer, inputs, callbacks) as call:
        token = _context.CALLBACKS.set(callbacks)
        try:
            result = await work
        finally:
            _context.CALLBACKS.reset(token)
        call.outputs = summary(result)
    return result


def learning_step(kind: str, instance: Any, inputs: dict[str, Any]) -> ReportedCall:
    """Returns a ``with`` block told to the active callbacks as one step of ``kind``.

    ``kind`` is ``round``, ``candidate``, ``proposal`` or ``backward``; the
    block sets ``outputs`` to the step's results as data.
    """
    return ReportedCall(kind, instance, inputs, active_callbacks())


def tell_decision(instance: Any, evidence: dict[str, Any]) -> None:
    """Tells the active callbacks of an accept/reject decision and its evidence."""
    tell("decision", instance, evidence, active_callbacks())


def tell_update(parameter: Any, name: str, old: Any, new: Any) -> None:
    """Tells the active callbacks that parameter ``name`` changed from ``old`` to ``new``."""
    callbacks = active_callbacks()
    if not callbacks:
        return
    inputs = {"parameter": name, **_fingerprint("old", old), **_fingerprint("new", new)}
    tell("update", parameter, {**inputs, "old": old, "new": new}, callbacks)


@contextlib.contextmanager
def updates_told(program: Any) -> Iterator[None]:
    """Tells an update for each parameter of ``program`` whose value the block changed."""
    if not active_callbacks():
        yield
        return
    before = {name: param.value for name, param in program.named_parameters()}
    yield
    for name, param in program.named_parameters():
        if name in before and param.value != before[name]:
            tell_update(param, name, before[name], param.value)


def _fingerprint(which: str, value: Any) -> dict[str, Any]:
    """Returns the size and a short hash of a value: what shows a change without its text."""
    # import time: pydantic, only when a callback listens
    from plait.optimization.training.updates import as_text

    text = as_text(value)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return {f"{which}_chars": len(text), f"{which}_sha256": digest}


class Rounds:
    """The rounds of one loop, told as steps: `start` ends the round before it.

    A loop keeps its shape: ``rounds.start(round=n)`` at the top of each
    round, ``rounds.end(...)`` with its results where it has them.
    """

    def __init__(self, owner: Any) -> None:
        self._owner = owner
        self._round: ReportedCall | None = None

    def start(self, **inputs: Any) -> None:
        """Ends the round in progress and starts the next (everything after it nests in it)."""
        self.end()
        self._round = learning_step("round", self._owner, inputs).__enter__()

    def end(self, **outputs: Any) -> None:
        """Ends the round in progress, if any, with ``outputs``."""
        self._close(None, outputs)

    def _close(self, exception: BaseException | None, outputs: dict[str, Any]) -> None:
        current, self._round = self._round, None
        if current is None:
            return
        current.outputs = outputs or None
        current.__exit__(type(exception) if exception else None, exception, None)


@contextlib.contextmanager
def rounds_of(owner: Any) -> Iterator[Rounds]:
    """Yields the `Rounds` of a loop; a round still open when it leaves ends with the loop."""
    rounds = Rounds(owner)
    try:
        yield rounds
    except BaseException as exc:
        rounds._close(exc, {})
        raise
    rounds.end()
