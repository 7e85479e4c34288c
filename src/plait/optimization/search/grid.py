"""GridSearch: every combination of module settings, evaluated concurrently; the best is kept.

Also `optimize_grid` (and ``module.optimize_grid``), its short form.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Mapping
from typing import Any

from plait.module import Module
from plait.optimization.costs import Phase, Range
from plait.optimization.evaluation import (
    Metric,
)
from plait.optimization.search.base import Candidate, ProgramSearch
from plait.parameter import Parameter

__all__ = ["DEFAULT_GRID", "GridSearch", "optimize_grid"]


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


def optimize_grid(
    module: Module,
    devset: Any,
    metric: Metric | None = None,
    parameters: Mapping[str, Iterable[Any]] | None = None,
    *,
    resources: Any = None,
    checkpoint: str | os.PathLike[str] | None = None,
    state: str | os.PathLike[str] | None = None,
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
        state=state,
        balance=balance,
        significance=significance,
        max_concurrent=max_concurrent,
        max_calls=max_calls,
        max_tokens=max_tokens,
        max_cost=max_cost,
    )
    return search.compile(module, valset=devset, resources=resources)
