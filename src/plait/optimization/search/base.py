"""The base of every program search: `ProgramSearch`, and the points a search overrides.

A search builds candidate programs and `ProgramSearch.compile` does the rest: trial 0,
evaluating every candidate concurrently, choosing by the rule in
`plait.optimization.search.report`, applying the winner, the hard budget and
``program.state``. What a search says of its own is declared in `SearchOverrides`.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from plait._together import together
from plait.execution.run import awaitable_or_result
from plait.execution.settings import check_served, resources_of
from plait.module import Module
from plait.optimization.evaluation import Metric, evaluate, examples_of
from plait.optimization.events import learning_step, observed_run
from plait.optimization.search.checkpoint import SearchCheckpoint
from plait.optimization.search.estimate import EstimatedSearch, _either
from plait.optimization.search.report import (
    SearchReport,
    Trial,
    _answer_counts,
    _balanced,
    _label_like,
    _summary,
    _tell_budget,
    _tell_decisions,
    apply,
    explain,
    sign_test,
)
from plait.optimization.search.resume import CheckpointedSearch
from plait.resources.state import StateURL
from plait.resources.usage import Budget, budgeted, metered

__all__ = ["Candidate", "ProgramSearch", "SearchOverrides"]

logger = logging.getLogger("plait.optimization")


@dataclass
class Candidate:
    """A program to try, and what to record about it."""

    program: Module
    params: dict[str, Any]
    note: str = ""
    settings: dict[str, Any] = field(default_factory=dict)


class SearchOverrides(Protocol):
    """The points a program search overrides; `ProgramSearch` has a default for each.

    A search implements `_candidates` (the copies to evaluate), or `_search` when its
    rounds depend on earlier results, and `_schedule` (what `estimate` counts). The
    others are for a search that needs them: calls of its own (`_own_calls`,
    `_sampled_proposal`), a trial 0 with settings (`_start_candidate`), steps kept in
    its checkpoint (`_read_state`), a budget of its own (`_limits`).
    """

    @property
    def _checkpointed(self) -> tuple[str, ...]:
        """The options its checkpoint is for (besides the metric, balance and significance)."""
        ...

    async def _candidates(
        self, program: Module, train: list[tuple[Any, Any]], resources: Any
    ) -> list[Candidate]:
        """Returns the candidate programs to try (deep copies of ``program``)."""
        ...

    async def _search(
        self,
        program: Module,
        train: list[tuple[Any, Any]],
        val: list[tuple[Any, Any]],
        resources: Any,
        start: Trial,
    ) -> list[Trial]:
        """Returns the candidates' trials (numbered from 1); the default evaluates `_candidates`."""
        ...

    async def _schedule(
        self,
        program: Module,
        train: list[tuple[Any, Any]],
        val: list[tuple[Any, Any]],
        proposal: Any = None,
    ) -> list[Any]:
        """Returns the phases after trial 0 that `estimate` counts (`costs.Phase`)."""
        ...

    async def _sampled_proposal(
        self,
        program: Module,
        train: list[tuple[Any, Any]],
        val: list[tuple[Any, Any]],
        resources: Any,
        sample: int,
    ) -> Any:
        """Makes one of the search's own proposals for real, for its estimate (default: none)."""
        ...

    def _start_candidate(self, program: Module) -> Candidate:
        """Returns trial 0's candidate: the program as it is."""
        ...

    def _own_calls(self, program: Module) -> list[tuple[str, str]]:
        """Returns the calls the search makes outside the program, as ``(who, alias)``."""
        ...

    def _read_state(self, state: dict[str, Any], read: Any) -> None:
        """Checks the search's own part of a checkpoint."""
        ...

    def _limits(self) -> tuple[Any, Any, Any]:
        """Returns this run's hard budget: ``max_calls``, ``max_tokens``, ``max_cost``."""
        ...


class SearchParts(SearchOverrides, Protocol):
    """What the parts of a `ProgramSearch` (its checkpoint, its estimate) use of each other."""

    metric: Metric | None
    balance: bool | str
    significance: float | None
    checkpoint: Path | None
    state: StateURL | None
    _saved: SearchCheckpoint

    def _check_own_aliases(self, program: Module, resources: Any) -> None: ...

    def _distinct(self, program: Module, candidates: Sequence[Candidate]) -> list[Candidate]: ...

    async def _evaluate_one(
        self,
        number: int,
        candidate: Candidate,
        val: list[tuple[Any, Any]],
        resources: Any,
        before: Trial | None = None,
    ) -> Trial: ...

    def _open_checkpoint(
        self,
        program: Module,
        train: list[tuple[Any, Any]],
        val: list[tuple[Any, Any]],
        *,
        in_place: bool = True,
    ) -> Module: ...

    def _held_step(self, key: str) -> dict[str, Any] | None: ...

    @staticmethod
    def _before_calls() -> None: ...

    async def _estimate(
        self, program: Module, train_set: Any, val_set: Any, resources: Any, sample: int
    ) -> Any: ...

    def _start_phase(self, program: Module, val: list[tuple[Any, Any]]) -> Any: ...

    def _left_to_evaluate(self, candidate: Candidate, n: int) -> int: ...

    def _left_of(self, candidates: Sequence[Candidate], n: int) -> int: ...


class ProgramSearch(CheckpointedSearch, EstimatedSearch):
    """Base of optimizers that evaluate candidate programs and apply the best (see the package).

    Subclasses implement `_candidates` (or `_search`) and `_schedule`; `compile` does the
    rest. The points a search overrides are declared in `SearchOverrides`; its checkpoint
    (`CheckpointedSearch`) and its estimate (`EstimatedSearch`) are parts of its own.

    Args:
        metric: ``metric(output, target)`` → bool, number or Feedback; default exact match.
            The first argument of every search.
        balance: choose by the balanced score: True, False, or ``"auto"``
            (when the validation targets repeat like labels).
        significance: the largest sign-test p-value at which a candidate may
            replace the program (None: any candidate at least as good may).
        max_concurrent: most LLM calls in flight per evaluation (endpoint limits apply too).
        max_calls, max_tokens, max_cost: a hard budget for the whole search
            (`plait.resources.usage.Budget`): every request is held against it
            before it is sent, so the search never passes it. Once it is spent
            the search stops; trials it left half-evaluated are never chosen,
            and the report says what was spent and left undone
            (``stopped_by_budget``, ``spent``, ``left_undone``).
        checkpoint: a JSON file that makes the search resumable
            (`plait.optimization.search.checkpoint`): what it finishes is
            written there at once, and a rerun with the same file (and, after
            a budget stop, a larger budget) sends only the work not finished.
            A file of another search, program, dataset or settings is refused.
        state: a state store URL (``postgresql://…`` or an SQLite path) that
            keeps the checkpoint when no ``checkpoint`` file is given: one key
            of its table ``learning``, named by the search's class, data and
            settings, so a rerun on any machine resumes
            (`plait.optimization.checkpoint_place`); a checkpoint there of
            another program is refused as a file's is.
    """

    _checkpointed: tuple[str, ...] = ()
    """The options, besides the metric, balance and significance, that decide what
    the search does: a checkpoint holds the work of these settings only."""
    _saved: SearchCheckpoint
    """The checkpoint of the running search (`_open_checkpoint`; one that keeps nothing
    without a file)."""

    def __init__(
        self,
        metric: Metric | None = None,
        *,
        balance: bool | str = "auto",
        significance: float | None = 0.1,
        max_concurrent: int | None = None,
        max_calls: int | None = None,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        checkpoint: str | os.PathLike[str] | None = None,
        state: str | os.PathLike[str] | StateURL | None = None,
    ) -> None:
        Budget.of(max_calls, max_tokens, max_cost)  # checks the limits now, not when compiled
        if balance not in (True, False, "auto"):
            raise ValueError(f"balance must be True, False or 'auto', got {balance!r}")
        if significance is not None and not 0 < significance <= 1:
            raise ValueError(f"significance must be in (0, 1] or None, got {significance!r}")
        if metric is not None and not callable(metric):
            raise TypeError(
                f"{type(self).__name__}: metric must be a function metric(output, target) "
                f"returning a bool, a number or a Feedback; got {metric!r:.80}"
            )
        self.metric = metric
        self.balance = balance
        self.significance = significance
        self.max_concurrent = max_concurrent
        self.max_calls = max_calls
        self.max_tokens = max_tokens
        self.max_cost = max_cost
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        self.state = StateURL.parse(state) if state is not None else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def compile(
        self,
        program: Module,
        trainset: Any = None,
        valset: Any = None,
        *,
        resources: Any = None,
        train_set: Any = None,
        val_set: Any = None,
    ) -> Any:
        """Searches, applies the best candidate to ``program`` in place, and returns the report.

        Inside a running event loop, await it (``report = await search.compile(...)``);
        in a script with no loop running it runs to completion and returns the
        `SearchReport`, as a module call does.

        Args:
            program: the program to improve (its parameters and settings change).
            trainset: examples the optimizer learns from (demos, feedback);
                ``train_set=`` is the same.
            valset: examples candidates are chosen on (default: ``trainset``);
                ``val_set=`` is the same.
            resources: ResourceConfig / ResourceManager / mapping (default: the
                program's bound resources, or those of ``ExecutionSettings``).

        Raises:
            PlaitError: no resources were found.
            TypeError: a dataset given under both of its names.
            ValueError: an empty or malformed dataset, or a checkpoint of
                another search, program, dataset or settings.
            CheckpointError: the checkpoint is a symbolic link, not a regular
                file, or not a search checkpoint as plait writes it.
        """
        train = _either("trainset", trainset, "train_set", train_set)
        val = _either("valset", valset, "val_set", val_set)
        compiling = self._compile(program, train, val, resources)
        return awaitable_or_result(observed_run(self, program, compiling, _summary))

    async def _compile(
        self, program: Module, train_set: Any, val_set: Any, resources: Any
    ) -> SearchReport:
        """The body of `compile`."""
        resources = resources_of(program, resources, who=type(self).__name__, takes="compile()")
        train = examples_of(train_set) if train_set is not None else []
        val = examples_of(val_set) if val_set is not None else train
        if not val:
            name = type(self).__name__
            raise ValueError(f"{name}.compile needs a non-empty valset or trainset")
        started = time.perf_counter()
        self._open_checkpoint(program, train, val)  # may take the program back to its start
        try:
            self._check_own_aliases(program, resources)
            budget = Budget.of(*self._limits())
            with metered() as meter, budgeted(budget):
                start = await self._start(program, val, resources)
                trials = [start, *await self._search(program, train, val, resources, start)]
            best = self._choose(trials, start, self.significance)
            _tell_decisions(trials, start, best, self.significance)
            if best is not start:
                apply(program, best)
            self._saved.leave(program)
        finally:
            await self._saved.place.aclose()  # the last checkpoint written, or told not
        report = SearchReport(
            type(self).__name__,
            trials,
            best,
            start,
            calls=meter.calls,
            seconds=time.perf_counter() - started,
            reason=explain(trials, start, best, self.significance),
            resumed_calls=self._saved.resumed_calls,
        )
        if budget is not None:
            _tell_budget(report, budget)
        _record(program, report)
        logger.info(
            "%s: %d trials, validation %.4g -> %.4g (trial %d), %d calls; %s",
            type(self).__name__,
            len(trials),
            start.score,
            best.score,
            best.number,
            meter.calls,
            report.reason,
        )
        return report

    async def _start(self, program: Module, val: list[tuple[Any, Any]], resources: Any) -> Trial:
        """Returns trial 0, the program as it was, evaluated (a checkpoint may already hold it)."""
        return await self._evaluated(0, self._start_candidate(program), val, resources)

    def _start_candidate(self, program: Module) -> Candidate:
        """Trial 0's candidate: the program itself, as it is."""
        return Candidate(program, {}, "as it was")

    def _own_calls(self, program: Module) -> list[tuple[str, str]]:
        """The calls this search makes outside the program, as ``(who, alias)``: none here;
        a search that proposes with a model of its own says so."""
        return []

    def _check_own_aliases(self, program: Module, resources: Any) -> None:
        """Raises before any call when the resources do not serve an alias of `_own_calls`."""
        name = type(self).__name__
        for who, alias in self._own_calls(program):
            check_served(resources, alias, who=f"{name}'s {who}", setting=f"{name}(alias=...)")

    def _limits(self) -> tuple[Any, Any, Any]:
        """This run's hard budget: ``max_calls``, ``max_tokens``, ``max_cost``."""
        return self.max_calls, self.max_tokens, self.max_cost

    def _read_state(self, state: dict[str, Any], read: Any) -> None:
        """Checks the search's own part of a checkpoint (a `checkpoint.Reader` complains).

        The base knows no steps of its own; a search that keeps some overrides this.
        """
        for key in state.get("steps", {}):
            read.fail(f"state.steps.{key}", f"is not a step of {type(self).__name__}")

    async def _sampled_proposal(
        self,
        program: Module,
        train: list[tuple[Any, Any]],
        val: list[tuple[Any, Any]],
        resources: Any,
        sample: int,
    ) -> Any:
        """Makes one of the search's proposals for real, for its estimate, and returns what it
        spent (a `plait.optimization.costs.Proposal`, or what the search's `_schedule`
        reads); None when the search makes no calls outside the program, or none is left
        to make. Leaves ``program`` as it is; what it logs as warnings is logged at debug
        level (`costs.quiet`: the run warns of its own).

        Override this in a search that proposes with calls of its own; the estimate
        counts its calls among the sample's (``val``'s first ``sample`` examples are
        the ones the estimate measures the program on).
        """
        return None

    async def _schedule(
        self,
        program: Module,
        train: list[tuple[Any, Any]],
        val: list[tuple[Any, Any]],
        proposal: Any = None,
    ) -> list[Any]:
        """Returns the phases (`plait.optimization.costs.Phase`) after trial 0, its proposals
        sized by ``proposal`` (`_sampled_proposal`'s, None without a sample). Override this."""
        raise NotImplementedError(f"{type(self).__name__} has no estimate of its schedule")

    async def _search(
        self,
        program: Module,
        train: list[tuple[Any, Any]],
        val: list[tuple[Any, Any]],
        resources: Any,
        start: Trial,
    ) -> list[Trial]:
        """Returns the candidates' trials (numbered from 1). Override this or `_candidates`."""
        candidates = self._distinct(program, await self._candidates(program, train, resources))
        return await self.evaluate_candidates(candidates, val, resources, first=1)

    async def _candidates(
        self, program: Module, train: list[tuple[Any, Any]], resources: Any
    ) -> list[Candidate]:
        """Returns the candidate programs to try (deep copies of ``program``). Override this."""
        raise NotImplementedError(f"{type(self).__name__} must implement _candidates")

    # ------------------------------------------------------------ helpers
    def _distinct(self, program: Module, candidates: Sequence[Candidate]) -> list[Candidate]:
        """Returns the candidates that differ from ``program`` as it is (that one is trial 0)."""
        kept = [c for c in candidates if not _unchanged(program, c)]
        if len(kept) < len(candidates):
            logger.info(
                "%s: %d candidate(s) identical to the program as it is (trial 0) not evaluated",
                type(self).__name__,
                len(candidates) - len(kept),
            )
        return kept

    async def evaluate_candidates(
        self,
        candidates: Sequence[Candidate],
        val: list[tuple[Any, Any]],
        resources: Any,
        first: int,
    ) -> list[Trial]:
        """Evaluates every candidate on ``val``, all concurrently; returns their trials in order.

        A candidate whose trial the checkpoint holds is not evaluated again.
        """
        return list(
            await together(
                *(
                    self._evaluated(first + i, candidate, val, resources)
                    for i, candidate in enumerate(candidates)
                )
            )
        )

    async def _evaluate_one(
        self,
        number: int,
        candidate: Candidate,
        val: list[tuple[Any, Any]],
        resources: Any,
        before: Trial | None = None,
    ) -> Trial:
        """Evaluates a candidate on ``val``; given ``before``, its trial a budget cut short,
        only the examples that one left undone, completing it."""
        started = time.perf_counter()
        told: dict[str, Any] = {"candidate": number if number >= 0 else None}  # < 0: numbered later
        told |= {"note": candidate.note, "params": candidate.params}
        todo = list(range(len(val))) if before is None else before.undone
        with learning_step("candidate", candidate.program, told) as step:
            result = await evaluate(
                candidate.program,
                [val[i] for i in todo],
                self.metric,
                resources=resources,
                max_concurrent=self.max_concurrent,
                progress=False,
            )
            step.outputs = {
                "score": float(result),
                "n": len(result.scores),
                "calls": result.calls,
                "cost": result.cost,
                "seconds": time.perf_counter() - started,
            }
            if result.unevaluated:  # its score counts them as 0: say it is not a whole one
                step.outputs["unevaluated"] = result.unevaluated
        labels = _label_like(val)
        balance = labels if self.balance == "auto" else bool(self.balance)
        scores = list(before.scores) if before is not None else [0.0] * len(val)
        for i, score in zip(todo, result.scores, strict=True):
            scores[i] = score
        answers = Counter(before.answers if before is not None else {})
        answers.update(_answer_counts(result) if labels else {})
        undone = [todo[row.index] for row in result.rows if row.refused]
        mean = sum(scores) / len(scores)
        earlier = before or Trial(0, {}, 0.0, 0.0)
        return Trial(
            number=number,
            params=candidate.params,
            score=mean,
            selection=_balanced([t for _, t in val], scores) if balance else mean,
            calls=earlier.calls + result.calls,
            cost=earlier.cost + result.cost,
            seconds=earlier.seconds + time.perf_counter() - started,
            note=candidate.note,
            parameters=candidate.program.state_dict(),
            settings=dict(candidate.settings),
            scores=scores,
            answers=dict(answers.most_common()),
            unevaluated=len(undone),
            undone=undone,
        )

    @staticmethod
    def _choose(trials: Sequence[Trial], start: Trial, significance: float | None = None) -> Trial:
        """Returns the trial to apply: the start, or a clear winner (see the package docs)."""
        if start.unevaluated:
            return start  # no baseline to compare with: the program stays as it was
        eligible = [
            t
            for t in trials
            if t is start
            or (
                not t.unevaluated
                and t.score >= start.score - 1e-12
                and (significance is None or sign_test(t.scores, start.scores) <= significance)
            )
        ]
        return max(eligible, key=lambda t: (t.selection, t.score, -t.number))


def _unchanged(program: Module, candidate: Candidate) -> bool:
    """Whether ``candidate`` is ``program`` as it is: the same parameter values and settings."""
    if candidate.program.state_dict() != program.state_dict():
        return False
    modules = dict(program.named_modules())
    for key, value in candidate.settings.items():
        path, _, attribute = key.rpartition(".")
        if getattr(modules[path], attribute) != value:
            return False
    return True


def _record(program: Module, report: SearchReport) -> None:
    state = program.state
    state.trials.extend({**t.row(), "optimizer": report.optimizer} for t in report.trials)
    state.best_score = report.best.score
    state.best_params = report.best.params
    state.best_trial = report.best.number
    state.compiled = state.compiled or report.improved
    state.optimizer = report.optimizer
