# size: ProgramSearch with GridSearch and its report and checkpoint; issue 35 splits them into a folder.
"""Program search: optimizers that try whole candidate programs and keep the best on validation.

Where `SFAOptimizer` and `TextGradOptimizer` rewrite parameters step by step
from feedback, these optimizers build *candidate programs* (deep copies with
other demos, instructions or settings), evaluate every candidate on a
validation set, and apply the best one to the program:

    report = await BootstrapFewShot(metric).compile(program, trainset=train, valset=val)
    report.best.score, report.table()          # the trials, best first
    report.improved, report.reason             # what was kept, and why, in words
    program.state.best_params, program.is_compiled()

One calling convention for every search: the constructor takes the metric
first, then the search's own options; ``compile(program, trainset=...,
valset=...)`` (``train_set=`` / ``val_set=`` work too) returns
a `SearchReport`. Like a module call, ``compile`` is awaited inside a running
event loop and runs to completion in a script with no loop running.

Shared here (`ProgramSearch`), so every such optimizer behaves alike:

* candidates are evaluated **concurrently**, all through one resource manager,
  so the endpoints' limits hold across the whole search;
* the program as it was is always trial 0 (a candidate identical to it is not
  evaluated again), and a candidate is chosen only if
  its validation score is at least trial 0's (a search never ends below its
  start on validation) and, by default, only if it beats trial 0 on clearly
  more validation examples than it loses (a one-sided sign test at
  ``significance`` 0.1). Why: on 30 validation examples, candidates that
  differ only by noise differ by several examples. Measured on SmolLM2-135M,
  BBH boolean_expressions: 17 random balanced demo sets scored 0.33 to 0.77
  on validation, and their validation score did not predict their test score
  (the 0.77 ones scored 0.56 to 0.59 on test, the zero-shot program 0.64);
* among those, the choice is by a *balanced* score when the targets are
  labels (the mean over target values of each value's mean score), then by
  the plain score, then the earlier trial. Why: on 30 validation items a
  candidate that always answers the majority label scores the majority share
  (0.70 on BBH boolean_expressions' validation split, 0.52 on its test split);
  balanced, it scores 0.5 and does not win;
* the report says why the program was kept or changed, from the evidence:
  the labels the program predicts, wins and losses against trial 0 example by
  example, the sign test (`SearchReport.reason`, also logged);
* every trial is recorded in ``program.state`` (`ModuleState`): trials, best score,
  best parameters; ``is_compiled()`` once a search has changed the program;
* the calls the search made are counted (`SearchReport.calls`).

`GridSearch` / `optimize_grid` (every combination of module settings) live
here; demo optimizers are in `plait.optimization.search.demos`, the reflective
evolutionary search in `plait.optimization.search.reflective`.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import logging
import math
import os
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait._together import together
from plait.execution.settings import check_served, resources_of
from plait.module import Module
from plait.optimization.evaluation import (
    EvaluationResult,
    Metric,
    _sole_value,
    evaluate,
    examples_of,
)
from plait.optimization.events import learning_step, observed_run, tell_decision, updates_told
from plait.parameter import Parameter
from plait.resources.usage import active_budgets

__all__ = [
    "GridSearch",
    "ProgramSearch",
    "SearchReport",
    "Trial",
    "balanced_score",
    "optimize_grid",
    "sign_test",
]

logger = logging.getLogger("plait.optimization")

_ESTIMATING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "plait_search_estimating", default=False
)
"""True while an estimate builds a search's candidates from its checkpoint (no call sent)."""


class _NeedsCalls(Exception):
    """A step the candidates come from is not in the checkpoint: they cannot be built
    without calls (only raised while `_ESTIMATING`)."""


# ----------------------------------------------------------------- records
@dataclass
class Trial:
    """One candidate program evaluated on the validation set."""

    number: int
    """0 is the program as it was; candidates count from 1."""
    params: dict[str, Any]
    """What distinguishes the candidate (settings, demo counts, an instruction …)."""
    score: float
    """Mean validation score."""
    selection: float
    """The score the choice is made on (balanced over target labels, or the mean)."""
    calls: int = 0
    """Model calls its evaluation made."""
    cost: float = 0.0
    seconds: float = 0.0
    """Wall time of its evaluation (candidates run concurrently, so these overlap)."""
    note: str = ""
    parameters: dict[str, Any] = field(default_factory=dict, repr=False)
    """The candidate's ``state_dict`` (what `apply` loads)."""
    settings: dict[str, Any] = field(default_factory=dict, repr=False)
    """Module settings by ``path.attribute`` (what `apply` sets)."""
    scores: list[float] = field(default_factory=list, repr=False)
    """Its score on each validation example, in order (a Pareto frontier needs them)."""
    answers: dict[str, int] = field(default_factory=dict, repr=False)
    """How often it answered each label, when the validation targets are labels."""
    unevaluated: int = 0
    """Validation examples the search's budget left undone; such a trial is never chosen."""
    undone: list[int] = field(default_factory=list, repr=False)
    """Their positions in the validation set (what a resumed search evaluates)."""

    def row(self) -> dict[str, Any]:
        """Returns the trial as one row of a trials table (no parameter values)."""
        return {
            "number": self.number,
            "params": self.params,
            "score": self.score,
            "selection": self.selection,
            "calls": self.calls,
            "cost": self.cost,
            "seconds": round(self.seconds, 3),
            "note": self.note,
        }


@dataclass
class SearchReport:
    """What one program search did."""

    optimizer: str
    trials: list[Trial]
    best: Trial
    """The trial the program holds now: the one applied, or trial 0 when the search
    kept the program (a candidate may score higher without winning clearly)."""
    start: Trial
    """Trial 0: the program as it was."""
    calls: int = 0
    """Model calls the whole search made (bootstrapping and proposals included)."""
    seconds: float = 0.0
    reason: str = ""
    """Why ``best`` was kept, in words a user can act on (see `explain`)."""
    stopped_by_budget: bool = False
    """Whether the budget (``max_calls``, ``max_tokens``, ``max_cost``) cut the search
    short; ``best`` is then the best of the trials evaluated in full."""
    spent: dict[str, Any] = field(default_factory=dict)
    """Calls, tokens and cost spent, when the search had a budget."""
    left_undone: str = ""
    """What the budget left undone, in words (empty when nothing was)."""
    resumed_calls: int = 0
    """Calls of the work taken from the checkpoint instead of being sent again."""

    @property
    def improved(self) -> bool:
        """Whether a candidate other than the start was applied."""
        return self.best.number != 0

    def table(self) -> Any:
        """Returns the trials, best score first: a pandas DataFrame, or a list of dicts."""
        rows = sorted((t.row() for t in self.trials), key=lambda r: (-r["score"], r["number"]))
        try:
            import pandas
        except ImportError:
            return rows
        return pandas.DataFrame(rows)


def balanced_score(result: EvaluationResult) -> float:
    """Returns the mean over target values of each value's mean score (macro average)."""
    if not result.rows:
        return float(result)
    return _balanced([row.target for row in result.rows], result.scores)


def _balanced(targets: Sequence[Any], scores: Sequence[float]) -> float:
    """Returns the mean over target values of each value's mean score."""
    groups: dict[str, list[float]] = defaultdict(list)
    for target, score in zip(targets, scores, strict=True):
        groups[_label(target)].append(score)
    return sum(sum(g) / len(g) for g in groups.values()) / len(groups)


def _label(target: Any) -> str:
    """Returns a target as a label: text as it is, a row of one field by its value, else JSON."""
    if isinstance(target, Mapping) and len(target) == 1:
        target = next(iter(target.values()))
    if isinstance(target, str):
        return target
    return json.dumps(target, sort_keys=True, default=str)


def _label_like(pairs: Sequence[tuple[Any, Any]]) -> bool:
    """Whether targets repeat like labels (at most half as many values as examples)."""
    values = {_label(target) for _, target in pairs}
    return 1 < len(values) <= len(pairs) / 2


# ------------------------------------------------------------------- base
@dataclass
class Candidate:
    """A program to try, and what to record about it."""

    program: Module
    params: dict[str, Any]
    note: str = ""
    settings: dict[str, Any] = field(default_factory=dict)


# size: the base of every search: its run, report and checkpoint; split in issue 35.
class ProgramSearch:
    """Base of optimizers that evaluate candidate programs and apply the best (see module docs).

    Subclasses implement `_candidates`; `compile` does the rest.

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
    """

    _checkpointed: tuple[str, ...] = ()
    """The options, besides the metric, balance and significance, that decide what
    the search does: a checkpoint holds the work of these settings only."""

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
    ) -> None:
        from plait.resources.usage import Budget

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
        from plait.execution.run import awaitable_or_result

        train = _either("trainset", trainset, "train_set", train_set)
        val = _either("valset", valset, "val_set", val_set)
        compiling = self._compile(program, train, val, resources)
        return awaitable_or_result(observed_run(self, program, compiling, _summary))

    async def _compile(
        self, program: Module, train_set: Any, val_set: Any, resources: Any
    ) -> SearchReport:
        """The body of `compile`."""
        from plait.resources.usage import Budget, budgeted, metered

        resources = resources_of(program, resources, who=type(self).__name__, takes="compile()")
        train = examples_of(train_set) if train_set is not None else []
        val = examples_of(val_set) if val_set is not None else train
        if not val:
            name = type(self).__name__
            raise ValueError(f"{name}.compile needs a non-empty valset or trainset")
        started = time.perf_counter()
        self._open_checkpoint(program, train, val)  # may take the program back to its start
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

    # --------------------------------------------------------- checkpoint
    def _open_checkpoint(
        self,
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
        from plait.optimization.search.checkpoint import SearchCheckpoint, digest, program_digest

        metric = getattr(self.metric, "__name__", type(self.metric).__name__)
        options = {name: getattr(self, name) for name in self._checkpointed}
        settings = {"metric": metric, "balance": self.balance, "significance": self.significance}
        of = {
            "program": program_digest(program),
            "trainset": digest(train),
            "valset": digest(val),
            "settings": digest({**settings, **options}),
        }
        self._saved = SearchCheckpoint.open(
            self.checkpoint, type(self).__name__, of, self._read_state, len(val)
        )
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
                f"{self.checkpoint} holds a {type(self).__name__} search of another program; "
                "use another checkpoint file, or delete it to start over"
            )
        logger.info(
            "%s: the program its checkpoint's search left is taken back to trial 0",
            type(self).__name__,
        )
        return program

    def _read_state(self, state: dict[str, Any], read: Any) -> None:
        """Checks the search's own part of a checkpoint (a `search_checkpoint.Reader` complains).

        The base knows no steps of its own; a search that keeps some overrides this.
        """
        for key in state.get("steps", {}):
            read.fail(f"state.steps.{key}", f"is not a step of {type(self).__name__}")

    async def _remembered(self, key: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """Returns the JSON result of one step of the search, from the checkpoint when it has it.

        A step finished while no budget had refused a call is written with the
        calls it made; one the budget may have cut short is not, so a rerun
        does it again.
        """
        from plait.resources.usage import metered

        held = self._held_step(key)
        if held is not None:
            return held["value"]
        self._before_calls()
        with metered() as meter:
            value = await make()
        if not budget_spent():
            self._saved.add_step(key, value, meter.calls)
        return value

    def _held_step(self, key: str) -> dict[str, Any] | None:
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
        self, number: int, candidate: Candidate, val: list[tuple[Any, Any]], resources: Any
    ) -> Trial:
        """Returns a candidate's trial: from the checkpoint when it holds it, else evaluated
        (and then written there, if its evaluation finished)."""
        from plait.optimization.search.checkpoint import trial_key

        key = trial_key(candidate.program.state_dict(), candidate.settings)
        saved = self._saved.reuse(key, number, candidate.params, candidate.note)
        if saved is not None and not saved.unevaluated:
            return saved
        trial = await self._evaluate_one(number, candidate, val, resources, saved)
        self._saved.add(trial)
        return trial

    def estimate(
        self,
        program: Module,
        trainset: Any = None,
        valset: Any = None,
        *,
        resources: Any = None,
        sample: int = 2,
        train_set: Any = None,
        val_set: Any = None,
    ) -> Any:
        """Estimates the calls, tokens and dollars `compile` would spend, before it runs.

        From this search's schedule (its settings and the data sizes) and one run
        of the program measured on ``sample`` validation examples, which run for
        real (`plait.optimization.costs`); a search that makes calls outside the
        program makes one of its proposals for real too, on a copy
        (`_sampled_proposal`). Awaited inside a running event
        loop, run to completion in a script, like `compile`.

        Returns:
            A `CostEstimate`: low / expected / high calls, tokens and cost per
            phase; ``print(estimate)`` shows the table.
        """
        from plait.execution.run import awaitable_or_result
        from plait.optimization.costs import check_sample

        check_sample(sample)
        train = _either("trainset", trainset, "train_set", train_set)
        val = _either("valset", valset, "val_set", val_set)
        return awaitable_or_result(self._estimate(program, train, val, resources, sample))

    async def _estimate(
        self, program: Module, train_set: Any, val_set: Any, resources: Any, sample: int
    ) -> Any:
        """The body of `estimate`."""
        from plait.optimization import costs
        from plait.resources import ResourceManager
        from plait.resources.usage import Budget, metered

        resources = resources_of(program, resources, who=type(self).__name__, takes="estimate()")
        train = examples_of(train_set) if train_set is not None else []
        val = examples_of(val_set) if val_set is not None else train
        if not val:
            raise ValueError(f"{type(self).__name__}.estimate needs a non-empty valset or trainset")
        program = self._open_checkpoint(program, train, val, in_place=False)
        self._check_own_aliases(program, resources)
        proposal, proposed = None, 0
        if sample > 0:
            with metered() as meter, costs.quiet():
                proposal = await self._sampled_proposal(program, train, val, resources, sample)
            proposed = meter.calls
        phases = [
            self._start_phase(program, val),
            *await self._schedule(program, train, val, proposal),
        ]
        demos = math.ceil(max(phase.demos for phase in phases))
        size, spent = await costs.measure(program, val, resources, sample, train, demos)
        spent += proposed
        return costs.from_schedule(
            f"{type(self).__name__} on {len(train)} training / {len(val)} validation examples",
            phases,
            size,
            ResourceManager.shared(resources),
            sample_calls=spent,
            budget=Budget.of(*self._limits()),  # a resumed ReflectiveSearch: what is left
        )

    def _start_phase(self, program: Module, val: list[tuple[Any, Any]]) -> Any:
        """The schedule's first phase: trial 0 on the validation set (none when checkpointed)."""
        from plait.optimization.costs import Phase, Range

        n = self._left_to_evaluate(self._start_candidate(program), len(val))
        return Phase("trial 0: the program as it was", runs=Range(n, n, n))

    def _left_to_evaluate(self, candidate: Candidate, n: int) -> int:
        """Returns how many of the ``n`` validation examples a candidate's evaluation has
        left, after what the checkpoint holds of it (for estimates)."""
        return self._left_of([candidate], n)

    def _left_of(self, candidates: Sequence[Candidate], n: int) -> int:
        """Returns the validation runs ``candidates`` have left after what the checkpoint
        holds of them (a candidate there twice takes its trials in turn, as `compile` does)."""
        from plait.optimization.search.checkpoint import trial_key

        taken: Counter[str] = Counter()
        left = 0
        for candidate in candidates:
            key = trial_key(candidate.program.state_dict(), candidate.settings)
            held = self._saved.reusable.get(key, [])
            left += held[taken[key]].unevaluated if taken[key] < len(held) else n
            taken[key] += 1
        return left

    async def _candidate_runs(
        self, program: Module, train: list[tuple[Any, Any]], n: int, count: int
    ) -> int:
        """Returns the validation runs of the ``count`` candidates `compile` evaluates after
        trial 0, less what the checkpoint holds of them; all ``count`` × ``n`` when they
        come from steps (a bootstrap pass, proposals) the checkpoint does not hold whole,
        as only calls can tell what they are then. For estimates: sends no call."""
        token = _ESTIMATING.set(True)
        try:
            candidates = self._distinct(program, await self._candidates(program, train, None))
        except _NeedsCalls:
            return count * n
        finally:
            _ESTIMATING.reset(token)
        return self._left_of(candidates, n)

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
        """Returns the trial to apply (see the module docs): the start, or a clear winner."""
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


def budget_spent() -> bool:
    """Whether a budget open around the search has refused a call (it stops then)."""
    return any(budget.stopped for budget in active_budgets())


def sign_test(scores: Sequence[float], baseline: Sequence[float]) -> float:
    """Returns the one-sided sign-test p-value that ``scores`` beat ``baseline`` example by example.

    Ties are dropped; with ``w`` wins in ``n`` untied examples it is
    P(at least ``w`` heads in ``n`` fair coin flips). 1.0 when nothing differs.
    """
    wins = sum(a > b for a, b in zip(scores, baseline, strict=True))
    losses = sum(a < b for a, b in zip(scores, baseline, strict=True))
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


def explain(
    trials: Sequence[Trial], start: Trial, best: Trial, significance: float | None = None
) -> str:
    """Returns why a search kept ``best``, from the evidence, in words a user can act on.

    An applied candidate is explained by its wins and losses against trial 0.
    When the program was kept, the first of these that holds is the reason:
    no candidate differed from it; it was already right everywhere; it (and
    every candidate) answers one label for every example, which demos and
    settings do not fix; no candidate won more examples than it lost; the
    best one's lead could be noise (sign test); it scored lower; it gained
    only where the balanced score does not count it.
    """
    n = len(start.scores)
    if best is not start:
        wins, losses = _wins_losses(best, start)
        p = sign_test(best.scores, start.scores)
        return (
            f"trial {best.number} won on {wins} and lost on {losses} of {n} validation examples "
            f"(sign test p = {p:.2g}); validation {start.score:.3g} -> {best.score:.3g}"
        )
    if start.unevaluated:
        return (
            "the budget was spent before the program as it was (trial 0) was evaluated in "
            "full: no baseline to compare candidates with"
        )
    candidates = [t for t in trials if t is not start and not t.unevaluated]
    if not candidates:
        return (
            "the search found no candidate that differs from the program as it is (trial 0): "
            "nothing to compare"
        )
    if n and all(score >= 1.0 for score in start.scores):
        return (
            f"the program is already right on every validation example ({n} of {n}): "
            "nothing to improve on this validation set"
        )
    only = _one_label(start)
    if only is not None and all(_one_label(t) is not None for t in candidates):
        label, count = only
        return (
            f"the program predicts one label for every example ({label!r}, {count} of {n}), "
            "and so does every candidate: demos and settings cannot help until the model "
            "separates labels; try clearer instructions or a stronger model"
        )
    leader = max(candidates, key=lambda t: (_margin(t, start), t.score, -t.number))
    wins, losses = _wins_losses(leader, start)
    if wins <= losses:
        return (
            f"no candidate won on more validation examples than it lost (best +{wins}/-{losses} "
            f"of {n}); a larger validation set could decide"
        )
    p = sign_test(leader.scores, start.scores)
    if significance is not None and p > significance:
        return (
            f"no candidate won clearly: the best (trial {leader.number}) won on {wins} and lost "
            f"on {losses} of {n} validation examples (+{wins}/-{losses}, sign test p = {p:.2g} "
            f"> {significance:g}); a larger validation set could decide"
        )
    if leader.score < start.score:
        return (
            f"trial {leader.number} won on more validation examples (+{wins}/-{losses} of {n}) "
            f"but scored lower on the whole ({leader.score:.3g} < {start.score:.3g})"
        )
    return (
        f"trial {leader.number} won on more validation examples (+{wins}/-{losses} of {n}) but "
        f"its score balanced across labels was not higher ({leader.selection:.3g} vs "
        f"{start.selection:.3g}): it gained on the most common label only"
    )


def _tell_budget(report: SearchReport, budget: Any) -> None:
    """Notes on ``report`` what the search spent and, if its budget stopped it, what it left."""
    report.spent = budget.spent()
    if not budget.stopped:
        return
    report.stopped_by_budget = True
    partial = [t.number for t in report.trials if t.unevaluated]
    undone = (
        f"{len(partial)} trial(s) not evaluated in full (trials {', '.join(map(str, partial))}), "
        "never chosen"
        if partial
        else "no trial was left half-evaluated; the steps after the last one were not run"
    )
    report.left_undone = f"{budget.refused} call(s) refused ({budget.refusal}); {undone}"
    report.reason = f"stopped by the budget: {report.left_undone}; {report.reason}"


CHOICE_RULE = (
    "a candidate may replace the program if it scores at least as well on validation and "
    "beats it on the sign test (p <= significance); the highest balanced score among those wins"
)
"""The rule `ProgramSearch` decides by, as decisions tell it."""


def _tell_decisions(
    trials: Sequence[Trial], start: Trial, best: Trial, significance: float | None
) -> None:
    """Tells callbacks, for each candidate, whether it replaced the program and why."""
    for trial in trials:
        if trial is not start:
            tell_decision(trial, _verdict(trial, start, best, significance))


def _verdict(trial: Trial, start: Trial, best: Trial, significance: float | None) -> dict[str, Any]:
    """Returns the evidence of one candidate's decision against trial 0."""
    wins, losses = _wins_losses(trial, start)
    p = sign_test(trial.scores, start.scores)
    if trial is best:
        why = "chosen"
    elif trial.score < start.score - 1e-12:
        why = "scored below the program as it was"
    elif significance is not None and p > significance:
        why = f"not a clear winner: sign test p = {p:.2g} > {significance:g}"
    else:
        why = f"trial {best.number} was chosen: a higher balanced score, or as high and earlier"
    return {
        "candidate": trial.number,
        "against": start.number,
        "accepted": trial is best,
        "wins": wins,
        "losses": losses,
        "n": len(start.scores),
        "p_value": p,
        "significance": significance,
        "old_score": start.score,
        "new_score": trial.score,
        "rule": CHOICE_RULE,
        "reason": why,
    }


def _summary(report: SearchReport) -> dict[str, Any]:
    """Returns what a search's ``on_optimize_end`` gets: its outcome as data."""
    return {
        "start_score": report.start.score,
        "best_score": report.best.score,
        "best_trial": report.best.number,
        "improved": report.improved,
        "trials": len(report.trials),
        "calls": report.calls,
        "seconds": report.seconds,
        "reason": report.reason,
    }


def _wins_losses(trial: Trial, start: Trial) -> tuple[int, int]:
    """Returns on how many validation examples ``trial`` scored above and below ``start``."""
    pairs = list(zip(trial.scores, start.scores, strict=True))
    return sum(a > b for a, b in pairs), sum(a < b for a, b in pairs)


def _margin(trial: Trial, start: Trial) -> int:
    wins, losses = _wins_losses(trial, start)
    return wins - losses


def _one_label(trial: Trial) -> tuple[str, int] | None:
    """Returns ``(label, count)`` when the trial answered one label for every example."""
    if len(trial.answers) != 1:
        return None
    label, count = next(iter(trial.answers.items()))
    return (label, count) if count == len(trial.scores) else None


def _answer_counts(result: EvaluationResult) -> dict[str, int]:
    """Returns how often each label was answered (an output read as its target is)."""
    answers = Counter(
        _label(_read_as_target(row.output, row.target)) for row in result.rows if row.error is None
    )
    return dict(answers.most_common())


def _read_as_target(output: Any, target: Any) -> Any:
    """Returns the part of ``output`` its target holds: a row's fields, or a sole value."""
    if isinstance(output, Mapping) and isinstance(target, Mapping):
        return {key: output.get(key) for key in target}
    return _sole_value(output, target)


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


def _either(name: str, value: Any, other_name: str, other: Any) -> Any:
    """Returns the dataset given under ``name`` or its other spelling ``other_name``."""
    if value is not None and other is not None:
        raise TypeError(f"compile() takes {name}= or {other_name}=, not both")
    return value if value is not None else other


def apply(program: Module, trial: Trial) -> None:
    """Loads a trial's parameter values and settings into ``program`` (told as updates)."""
    with updates_told(program):
        program.load_state_dict(trial.parameters)
    for key, value in trial.settings.items():
        _set_setting(program, key, value)


def _record(program: Module, report: SearchReport) -> None:
    state = program.state
    state.trials.extend({**t.row(), "optimizer": report.optimizer} for t in report.trials)
    state.best_score = report.best.score
    state.best_params = report.best.params
    state.best_trial = report.best.number
    state.compiled = state.compiled or report.improved
    state.optimizer = report.optimizer


# ------------------------------------------------------------------- grid
DEFAULT_GRID: dict[str, list[Any]] = {"temperature": [0.0, 0.3, 0.7]}
"""What a grid search without ``parameters`` tries: greedy, low and high sampling temperature."""


class GridSearch(ProgramSearch):
    """Tries every combination of module settings on a dev set; applies the best.

    Each key of ``parameters`` names a setting and maps to the values to try:

    * ``"temperature"`` — every module in the program with that attribute
      (``"stage1.temperature"``: only the module at that path);
    * a parameter's name (``"instructions"``, ``"system_prompt"``): its text
      variants, set on every module that has such a learnable parameter;
    * ``"demos"`` with integers: keep only the first n demos;
    * ``"alias"``: which endpoint (model) the calls go to.

    Every combination is a deep copy of the program, and all of them are
    evaluated concurrently; a combination that is the program as it is (its
    current settings) is trial 0, not evaluated twice. Without ``parameters``
    the grid is `DEFAULT_GRID` (temperature 0.0, 0.3, 0.7). With
    ``checkpoint`` (a JSON file, as every search takes) each finished trial is
    written at once (atomically, never through a symbolic link), trial 0
    included, and a rerun with the same file, program, dev set and grid skips
    the trials already done; of a trial a budget cut short, the examples it
    evaluated are kept, so a rerun with a larger budget evaluates the others.

    Example::

        report = await program.optimize_grid(
            dev, exact_match, {"temperature": [0.0, 0.7], "instructions": [A, B]},
            resources=config,
        )
        program.state.best_params    # {'temperature': 0.0, 'instructions': B}

    Args:
        metric, balance, max_concurrent, checkpoint: as `ProgramSearch`.
        parameters: setting name → list of values (the older order
            ``GridSearch(parameters, metric)`` works too).

    Raises:
        ValueError: an empty grid, or a name no module of the program has.
    """

    _checkpointed = ("parameters",)

    def __init__(
        self,
        metric: Metric | None = None,
        parameters: Mapping[str, Iterable[Any]] | None = None,
        **options: Any,
    ) -> None:
        if isinstance(metric, Mapping):  # the older order: GridSearch(parameters, metric)
            metric, parameters = parameters, metric
        super().__init__(metric, **options)
        self.default_grid = parameters is None
        if parameters is None:
            parameters = DEFAULT_GRID
        if not isinstance(parameters, Mapping) or not parameters:
            raise ValueError(
                "GridSearch needs parameters: a dict of setting name -> values to try, "
                "e.g. {'temperature': [0.0, 0.7]}"
            )
        self.parameters = {name: list(values) for name, values in parameters.items()}
        empty = [name for name, values in self.parameters.items() if not values]
        if empty:
            raise ValueError(f"GridSearch: no values to try for {', '.join(empty)}")

    def combinations(self) -> list[dict[str, Any]]:
        """Returns every combination of the grid, in order."""
        names = list(self.parameters)
        return [
            dict(zip(names, values, strict=True))
            for values in itertools.product(*self.parameters.values())
        ]

    async def _candidates(
        self, program: Module, train: list[tuple[Any, Any]], resources: Any
    ) -> list[Candidate]:
        self._check_keys(program)
        return [self._candidate(program, c) for c in self.combinations()]

    def _start_candidate(self, program: Module) -> Candidate:
        """The program as it is, with its values of the settings the grid varies."""
        self._check_keys(program)
        return Candidate(program, {}, "as it was", settings=self._current_settings(program))

    async def _schedule(
        self,
        program: Module,
        train: list[tuple[Any, Any]],
        val: list[tuple[Any, Any]],
        proposal: Any = None,
    ) -> list[Any]:
        from plait.optimization.costs import Phase, Range

        self._check_keys(program)
        candidates = self._distinct(
            program, [self._candidate(program, c) for c in self.combinations()]
        )
        counts = [self._left_to_evaluate(c, len(val)) for c in candidates]
        left = sum(count > 0 for count in counts)
        runs = sum(counts)
        resumed = (
            f", {len(candidates) - left} done in the checkpoint" if left < len(candidates) else ""
        )
        return [Phase(f"{left} grid trials{resumed}", runs=Range(runs, runs, runs))]

    def _current_settings(self, program: Module) -> dict[str, Any]:
        """Returns the program's values of the plain settings the grid varies, by path."""
        paths = {id(m): path for path, m in program.named_modules()}
        current: dict[str, Any] = {}
        for name in self.parameters:
            for module, attribute in _targets(program, name):
                value = module.__dict__[attribute]
                if not isinstance(value, Parameter):
                    path = paths[id(module)]
                    current[f"{path}.{attribute}" if path else attribute] = value
        return current

    def _check_keys(self, program: Module) -> None:
        """Raises ValueError for a grid key the program does not have (naming those it has)."""
        try:
            for name in self.parameters:
                _targets(program, name)
        except ValueError as exc:
            if not self.default_grid:
                raise
            raise ValueError(
                f"{exc}. Without parameters, optimize_grid tries {DEFAULT_GRID}; pass "
                "parameters={...} naming settings the program has"
            ) from None

    @staticmethod
    def _candidate(program: Module, combo: dict[str, Any]) -> Candidate:
        """Returns a copy of ``program`` with one combination of the grid set."""
        copy = program.copy()
        settings: dict[str, Any] = {}
        for name, value in combo.items():
            settings.update(_apply_setting(copy, name, value))
        return Candidate(copy, combo, settings=settings)


def _targets(program: Module, name: str) -> list[tuple[Module, str]]:
    """Returns the (module, attribute) pairs a grid key sets.

    Raises:
        ValueError: no module of the program has that setting; lists those it has.
    """
    path, _, attribute = name.rpartition(".")
    modules = dict(program.named_modules())
    if path:
        if path not in modules:
            raise ValueError(f"grid key {name!r}: the program has no module {path!r}")
        scope = [modules[path]]
    else:
        scope = list(modules.values())
    found = [(m, attribute) for m in scope if _has_setting(m, attribute)]
    if not found:
        known = sorted(
            {k for m in modules.values() for k in vars(m) if _has_setting(m, k)}
            | {n for m in modules.values() for n in m._parameters}
        )
        raise ValueError(
            f"grid key {name!r}: no module of {type(program).__name__} has a setting or "
            f"parameter {attribute!r}; it has: {', '.join(known) or 'none'}"
        )
    return found


def _has_setting(module: Module, attribute: str) -> bool:
    if attribute.startswith("_"):
        return False
    value = module.__dict__.get(attribute)
    if isinstance(value, Parameter):
        return True
    return attribute in module.__dict__ and isinstance(value, str | int | float | bool | type(None))


def _apply_setting(program: Module, name: str, value: Any) -> dict[str, Any]:
    """Sets grid key ``name`` to ``value`` on every module it targets.

    Returns the plain settings set, by ``path.attribute``; parameter values
    travel in the candidate's ``state_dict`` instead.
    """
    paths = {id(m): path for path, m in program.named_modules()}
    applied: dict[str, Any] = {}
    for module, attribute in _targets(program, name):
        current = module.__dict__[attribute]
        if isinstance(current, Parameter):
            keep = attribute == "demos" and isinstance(value, int) and not isinstance(value, bool)
            current.value = current.value[: max(value, 0)] if keep else value
        else:
            setattr(module, attribute, value)
            path = paths[id(module)]
            applied[f"{path}.{attribute}" if path else attribute] = value
    return applied


def _set_setting(program: Module, key: str, value: Any) -> None:
    path, _, attribute = key.rpartition(".")
    setattr(dict(program.named_modules())[path], attribute, value)


def optimize_grid(
    module: Module,
    devset: Any,
    metric: Metric | None = None,
    parameters: Mapping[str, Iterable[Any]] | None = None,
    *,
    resources: Any = None,
    checkpoint: str | os.PathLike[str] | None = None,
    balance: bool | str = "auto",
    significance: float | None = 0.1,
    max_concurrent: int | None = None,
    max_calls: int | None = None,
    max_tokens: int | None = None,
    max_cost: float | None = None,
) -> Any:
    """Tries every combination of ``parameters`` on ``devset`` and keeps the best.

    Also ``module.optimize_grid(devset, metric, parameters)``; the short form
    ``module.optimize_grid(devset, metric)`` tries `DEFAULT_GRID` (temperature
    0.0, 0.3, 0.7). See `GridSearch` for what the keys may name.
    ``module.state`` then holds the trials, ``best_score`` and ``best_params``;
    ``is_compiled()`` is true once a search has changed the module.

    Like a module call, it is awaited inside a running event loop and runs to
    completion in a script with no loop running.

    Returns:
        The `SearchReport` every program search returns: ``table()`` (the
        trials, best first), ``improved``, ``best`` and ``reason``.
    """
    search = GridSearch(
        metric,
        parameters,
        checkpoint=checkpoint,
        balance=balance,
        significance=significance,
        max_concurrent=max_concurrent,
        max_calls=max_calls,
        max_tokens=max_tokens,
        max_cost=max_cost,
    )
    return search.compile(module, valset=devset, resources=resources)
