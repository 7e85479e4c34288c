"""A program search's side of its checkpoint: what it resumes from, and what it writes.

`CheckpointedSearch` is the part of `ProgramSearch` that opens the search's
checkpoint (`plait.optimization.search.checkpoint`: a file, or a key of a state
store) before any call,
takes a candidate's trial from it instead of evaluating it again (`_evaluated`),
and keeps a step of the search's own (`_remembered`: a bootstrap pass, a proposal).
While an estimate builds a search's candidates from the checkpoint, a step the
checkpoint does not hold stops the building (`_NeedsCalls`) instead of sending calls.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from plait.module import Module
from plait.optimization.checkpoint_place import CheckpointPlace
from plait.optimization.search.checkpoint import (
    SearchCheckpoint,
    digest,
    program_digest,
    trial_key,
)
from plait.optimization.search.report import Trial, _set_setting
from plait.resources.usage import active_budgets, metered

if TYPE_CHECKING:
    from plait.optimization.search.base import Candidate, SearchParts

logger = logging.getLogger("plait.optimization")

_ESTIMATING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "plait_search_estimating", default=False
)
"""True while an estimate builds a search's candidates from its checkpoint (no call sent)."""


class _NeedsCalls(Exception):
    """A step the candidates come from is not in the checkpoint: they cannot be built
    without calls (only raised while `_ESTIMATING`)."""


def budget_spent() -> bool:
    """Whether a budget open around the search has refused a call (it stops then)."""
    return any(budget.stopped for budget in active_budgets())


class CheckpointedSearch:
    """The checkpoint of a `ProgramSearch` (its mixin: the search's own parts are `SearchParts`)."""

    def _open_checkpoint(
        self: SearchParts,
        program: Module,
        train: list[tuple[Any, Any]],
        val: list[tuple[Any, Any]],
        *,
        in_place: bool = True,
    ) -> Module:
        """Reads and checks the checkpoint (before any call) into ``self._saved``.

        Returns the program to search from: ``program``, or, when it is the one this
        checkpoint's search left, that program taken back to trial 0 (itself, or a copy
        when not ``in_place``).
        """
        metric = getattr(self.metric, "__name__", type(self.metric).__name__)
        options = {name: getattr(self, name) for name in self._checkpointed}
        settings = {"metric": metric, "balance": self.balance, "significance": self.significance}
        of = {
            "program": program_digest(program),
            "trainset": digest(train),
            "valset": digest(val),
            "settings": digest({**settings, **options}),
        }
        name = type(self).__name__
        place = CheckpointPlace(
            self.checkpoint,
            state=self.state,
            key=f"search/{name}/{digest([of['trainset'], of['valset'], of['settings']])}",
        )
        self._saved = SearchCheckpoint.open(place, name, of, self._read_state, len(val))
        start = self._saved.start
        if start is None:
            return program
        program = program if in_place else program.copy()
        try:
            program.load_state_dict(start.parameters)
            for key, value in start.settings.items():
                _set_setting(program, key, value)
        except (KeyError, TypeError, ValueError):
            pass  # not this program's trial 0: refused below
        if program_digest(program) != self._saved.of["program"]:
            raise ValueError(
                f"{place.name} holds a {name} search of another program; {self._saved.remedy}"
            )
        logger.info(
            "%s: the program its checkpoint's search left is taken back to trial 0",
            type(self).__name__,
        )
        return program

    async def _remembered(self: SearchParts, key: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """Returns the JSON result of one step of the search, from the checkpoint when it has it.

        A step finished while no budget had refused a call is written with the
        calls it made; one the budget may have cut short is not, so a rerun
        does it again.
        """
        held = self._held_step(key)
        if held is not None:
            return held["value"]
        self._before_calls()
        with metered() as meter:
            value = await make()
        if not budget_spent():
            self._saved.add_step(key, value, meter.calls)
        return value

    def _held_step(self: SearchParts, key: str) -> dict[str, Any] | None:
        """Returns a step the checkpoint holds (`SearchCheckpoint.step`: taken, so it counts
        as resumed); while an estimate builds the candidates, only looked at, and one it
        does not hold stops the building."""
        if not _ESTIMATING.get():
            return self._saved.step(key)
        held = self._saved.saved_steps.get(key)
        if held is None:
            raise _NeedsCalls(key)
        return held

    @staticmethod
    def _before_calls() -> None:
        """Called where a step is about to send calls: while an estimate builds the
        candidates, they cannot be known without those calls, and the building stops."""
        if _ESTIMATING.get():
            raise _NeedsCalls

    async def _evaluated(
        self: SearchParts,
        number: int,
        candidate: Candidate,
        val: list[tuple[Any, Any]],
        resources: Any,
    ) -> Trial:
        """Returns a candidate's trial: from the checkpoint when it holds it, else evaluated
        (and then written there, if its evaluation finished)."""
        key = trial_key(candidate.program.state_dict(), candidate.settings)
        saved = self._saved.reuse(key, number, candidate.params, candidate.note)
        if saved is not None and not saved.unevaluated:
            return saved
        trial = await self._evaluate_one(number, candidate, val, resources, saved)
        self._saved.add(trial)
        return trial
