"""Program search: optimizers that try whole candidate programs and keep the best on validation.

Where `SFAOptimizer` and `TextGradOptimizer` rewrite parameters step by step
from feedback, these optimizers build *candidate programs* (deep copies with
other demos, instructions or settings), evaluate every candidate on a
validation set, and apply the best one to the program:

    report = await BootstrapFewShot(metric).compile(program, train, val, resources=config)
    report.best.score, report.table()          # the trials, best first
    program.state.best_params, program.is_compiled()

Shared here (`ProgramSearch`), so every such optimizer behaves alike:

* candidates are evaluated **concurrently**, all through one resource manager,
  so the endpoints' limits hold across the whole search;
* the program as it was is always trial 0, and a candidate is chosen only if
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
* every trial is recorded in ``program.state`` (seed 002): trials, best score,
  best parameters, ``is_compiled()``;
* the calls the search made are counted (`SearchReport.calls`).

`GridSearch` / `optimize_grid` (every combination of module settings) live
here; demo optimizers are in `plait.optimization.fewshot`, the reflective
evolutionary search in `plait.optimization.reflective`.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import math
import os
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from plait import _files
from plait.errors import PlaitError
from plait.evaluation import EvaluationResult, Metric, evaluate, examples_of
from plait.execution.checkpoint_codec import CheckpointError
from plait.execution.settings import find_resources
from plait.module import Module
from plait.parameter import Parameter

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

_GRID = "plait.grid/1"
"""The format of a grid search checkpoint."""


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
    """The trial applied to the program (trial 0 when nothing beat the start)."""
    start: Trial
    """Trial 0: the program as it was."""
    calls: int = 0
    """Model calls the whole search made (bootstrapping and proposals included)."""
    seconds: float = 0.0

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
    groups: dict[str, list[float]] = defaultdict(list)
    for row in result.rows:
        groups[_label(row.target)].append(row.score or 0.0)
    if not groups:
        return float(result)
    return sum(sum(g) / len(g) for g in groups.values()) / len(groups)


def _label(target: Any) -> str:
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


class ProgramSearch:
    """Base of optimizers that evaluate candidate programs and apply the best (see module docs).

    Subclasses implement `_candidates`; `compile` does the rest.

    Args:
        metric: ``metric(output, target)`` → bool, number or Feedback; default exact match.
        balance: choose by the balanced score: True, False, or ``"auto"``
            (when the validation targets repeat like labels).
        significance: the largest sign-test p-value at which a candidate may
            replace the program (None: any candidate at least as good may).
        max_concurrent: most LLM calls in flight per evaluation (endpoint limits apply too).
    """

    def __init__(
        self,
        metric: Metric | None = None,
        *,
        balance: bool | str = "auto",
        significance: float | None = 0.1,
        max_concurrent: int | None = None,
    ) -> None:
        if balance not in (True, False, "auto"):
            raise ValueError(f"balance must be True, False or 'auto', got {balance!r}")
        if significance is not None and not 0 < significance <= 1:
            raise ValueError(f"significance must be in (0, 1] or None, got {significance!r}")
        self.metric = metric
        self.balance = balance
        self.significance = significance
        self.max_concurrent = max_concurrent

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    async def compile(
        self,
        program: Module,
        train_set: Any = None,
        val_set: Any = None,
        *,
        resources: Any = None,
    ) -> SearchReport:
        """Searches, applies the best candidate to ``program`` in place, and returns the report.

        Args:
            program: the program to improve (its parameters and settings change).
            train_set: examples the optimizer learns from (demos, feedback).
            val_set: examples candidates are chosen on (default: ``train_set``).
            resources: ResourceConfig / ResourceManager / mapping (default: the
                program's bound resources, or those of ``ExecutionSettings``).

        Raises:
            PlaitError: no resources were found.
            ValueError: an empty or malformed dataset.
        """
        from plait.resources.usage import metered

        resources = self._resources(program, resources)
        train = examples_of(train_set) if train_set is not None else []
        val = examples_of(val_set) if val_set is not None else train
        if not val:
            name = type(self).__name__
            raise ValueError(f"{name}.compile needs a non-empty val_set or train_set")
        started = time.perf_counter()
        with metered() as meter:
            start = await self._evaluate_one(0, Candidate(program, {}, "as it was"), val, resources)
            trials = [start, *await self._search(program, train, val, resources, start)]
        best = self._choose(trials, start, self.significance)
        if best is not start:
            apply(program, best)
        report = SearchReport(
            type(self).__name__,
            trials,
            best,
            start,
            calls=meter.calls,
            seconds=time.perf_counter() - started,
        )
        _record(program, report)
        logger.info(
            "%s: %d trials, validation %.4g -> %.4g (trial %d), %d calls",
            type(self).__name__,
            len(trials),
            start.score,
            best.score,
            best.number,
            meter.calls,
        )
        return report

    async def _search(
        self,
        program: Module,
        train: list[tuple[Any, Any]],
        val: list[tuple[Any, Any]],
        resources: Any,
        start: Trial,
    ) -> list[Trial]:
        """Returns the candidates' trials (numbered from 1). Override this or `_candidates`."""
        candidates = await self._candidates(program, train, resources)
        return await self.evaluate_candidates(candidates, val, resources, first=1)

    async def _candidates(
        self, program: Module, train: list[tuple[Any, Any]], resources: Any
    ) -> list[Candidate]:
        """Returns the candidate programs to try (deep copies of ``program``). Override this."""
        raise NotImplementedError(f"{type(self).__name__} must implement _candidates")

    # ------------------------------------------------------------ helpers
    def _resources(self, program: Module, resources: Any) -> Any:
        found = find_resources(resources, bound=program._bound_resources, module=program)
        if found is None:
            raise PlaitError(
                f"{type(self).__name__} has no resources: pass resources= to compile(), bind "
                "the program, or run inside `async with ExecutionSettings(resources=...)`"
            )
        return found

    async def evaluate_candidates(
        self,
        candidates: Sequence[Candidate],
        val: list[tuple[Any, Any]],
        resources: Any,
        first: int,
    ) -> list[Trial]:
        """Evaluates every candidate on ``val``, all concurrently; returns their trials in order."""
        return list(
            await asyncio.gather(
                *(
                    self._evaluate_one(first + i, candidate, val, resources)
                    for i, candidate in enumerate(candidates)
                )
            )
        )

    async def _evaluate_one(
        self, number: int, candidate: Candidate, val: list[tuple[Any, Any]], resources: Any
    ) -> Trial:
        started = time.perf_counter()
        result = await evaluate(
            candidate.program,
            val,
            self.metric,
            resources=resources,
            max_concurrent=self.max_concurrent,
            progress=False,
        )
        balance = _label_like(val) if self.balance == "auto" else bool(self.balance)
        return Trial(
            number=number,
            params=candidate.params,
            score=float(result),
            selection=balanced_score(result) if balance else float(result),
            calls=result.calls,
            cost=result.cost,
            seconds=time.perf_counter() - started,
            note=candidate.note,
            parameters=candidate.program.state_dict(),
            settings=dict(candidate.settings),
            scores=result.scores,
        )

    @staticmethod
    def _choose(trials: Sequence[Trial], start: Trial, significance: float | None = None) -> Trial:
        """Returns the trial to apply (see the module docs): the start, or a clear winner."""
        eligible = [
            t
            for t in trials
            if t is start
            or (
                t.score >= start.score - 1e-12
                and (significance is None or sign_test(t.scores, start.scores) <= significance)
            )
        ]
        return max(eligible, key=lambda t: (t.selection, t.score, -t.number))


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


def apply(program: Module, trial: Trial) -> None:
    """Loads a trial's parameter values and settings into ``program``."""
    program.load_state_dict(trial.parameters)
    for key, value in trial.settings.items():
        _set_setting(program, key, value)


def _record(program: Module, report: SearchReport) -> None:
    state = program.state
    state.trials.extend({**t.row(), "optimizer": report.optimizer} for t in report.trials)
    state.best_score = report.best.score
    state.best_params = report.best.params
    state.best_trial = report.best.number
    state.compiled = True
    state.optimizer = report.optimizer


# ------------------------------------------------------------------- grid
class GridSearch(ProgramSearch):
    """Tries every combination of module settings on a dev set; applies the best (seed 002).

    Each key of ``parameters`` names a setting and maps to the values to try:

    * ``"temperature"`` — every module in the program with that attribute
      (``"stage1.temperature"``: only the module at that path);
    * a parameter's name (``"instructions"``, ``"system_prompt"``): its text
      variants, set on every module that has such a learnable parameter;
    * ``"demos"`` with integers: keep only the first n demos;
    * ``"alias"``: which endpoint (model) the calls go to.

    Every combination is a deep copy of the program, and all of them are
    evaluated concurrently. With ``checkpoint`` (a JSON file) each finished
    trial is written at once (atomically, never through a symbolic link), and
    a rerun with the same file, dev set and grid skips the trials already done.

    Example::

        table = await program.optimize_grid(
            dev, exact_match, {"temperature": [0.0, 0.7], "instructions": [A, B]},
            resources=config,
        )
        program.state.best_params    # {'temperature': 0.0, 'instructions': B}

    Args:
        parameters: setting name → list of values.
        metric, balance, max_concurrent: as `ProgramSearch`.
        checkpoint: a JSON file that makes the search resumable.

    Raises:
        ValueError: an empty grid, or a name no module of the program has.
        CheckpointError: (from ``compile``) the checkpoint is a symbolic link,
            not a regular file, or not JSON.
    """

    def __init__(
        self,
        parameters: Mapping[str, Iterable[Any]],
        metric: Metric | None = None,
        *,
        checkpoint: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(metric, **options)
        if not isinstance(parameters, Mapping) or not parameters:
            raise ValueError(
                "GridSearch needs parameters: a dict of setting name -> values to try, "
                "e.g. {'temperature': [0.0, 0.7]}"
            )
        self.parameters = {name: list(values) for name, values in parameters.items()}
        empty = [name for name, values in self.parameters.items() if not values]
        if empty:
            raise ValueError(f"GridSearch: no values to try for {', '.join(empty)}")
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None

    def combinations(self) -> list[dict[str, Any]]:
        """Returns every combination of the grid, in order."""
        names = list(self.parameters)
        return [
            dict(zip(names, values, strict=True))
            for values in itertools.product(*self.parameters.values())
        ]

    async def _search(
        self,
        program: Module,
        train: list[tuple[Any, Any]],
        val: list[tuple[Any, Any]],
        resources: Any,
        start: Trial,
    ) -> list[Trial]:
        for name in self.parameters:
            _targets(program, name)  # raises for a name the program does not have
        combos = self.combinations()
        key = self._key(val)
        done = self._done(program, key)
        trials: list[Trial | None] = [done.get(_combo_key(c)) for c in combos]
        todo = [(i, c) for i, c in enumerate(combos) if trials[i] is None]
        if len(todo) < len(combos):
            logger.info("GridSearch: %d of %d trials resumed", len(combos) - len(todo), len(combos))

        async def run(index: int, combo: dict[str, Any]) -> None:
            candidate = program.copy()
            settings: dict[str, Any] = {}
            for name, value in combo.items():
                settings.update(_apply_setting(candidate, name, value))
            trial = await self._evaluate_one(
                index + 1, Candidate(candidate, combo, settings=settings), val, resources
            )
            trials[index] = trial
            self._save(key, trials)

        await asyncio.gather(*(run(i, c) for i, c in todo))
        return [t for t in trials if t is not None]

    def _key(self, val: list[tuple[Any, Any]]) -> str:
        metric = getattr(self.metric, "__name__", type(self.metric).__name__)
        data = json.dumps([val, metric], default=str, sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()[:16]

    def _done(self, program: Module, key: str) -> dict[str, Trial]:
        if self.checkpoint is None:
            return {}
        remedy = "delete it to start over, or use another checkpoint file"
        data = _files.read_json(self.checkpoint, error=CheckpointError, remedy=remedy)
        if data is None:
            return {}
        if not isinstance(data, dict) or (data.get("format"), data.get("key")) != (_GRID, key):
            raise ValueError(
                f"{self.checkpoint} holds another grid search (another dev set or metric); "
                "use another checkpoint file, or delete it to start over"
            )
        trials = [Trial(**t) for t in data["trials"] if t is not None]
        return {_combo_key(t.params): t for t in trials}

    def _save(self, key: str, trials: list[Trial | None]) -> None:
        if self.checkpoint is None:
            return
        data = {
            "format": _GRID,
            "key": key,
            "trials": [asdict(t) if t is not None else None for t in trials],
        }
        with _files.replacing(self.checkpoint, error=CheckpointError) as file:
            json.dump(data, file, default=str, indent=1)


def _combo_key(combo: Mapping[str, Any]) -> str:
    return json.dumps(combo, sort_keys=True, default=str)


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


async def optimize_grid(
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
) -> Any:
    """Tries every combination of ``parameters`` on ``devset`` and keeps the best (seed 002).

    Also ``await module.optimize_grid(devset, metric, parameters)``. See
    `GridSearch` for what the keys may name. ``module.state`` then holds the
    trials, ``best_score``, ``best_params`` and ``is_compiled()`` is true.

    Returns:
        The trials table, best first: a pandas DataFrame when pandas is
        installed, else a list of dicts.
    """
    if parameters is None:
        raise ValueError("optimize_grid needs parameters, e.g. {'temperature': [0.0, 0.3, 0.7]}")
    search = GridSearch(
        parameters,
        metric,
        checkpoint=checkpoint,
        balance=balance,
        significance=significance,
        max_concurrent=max_concurrent,
    )
    report = await search.compile(module, None, devset, resources=resources)
    return report.table()
