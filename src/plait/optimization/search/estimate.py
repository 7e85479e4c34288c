"""A program search's cost estimate: what `compile` would spend, before it runs.

`EstimatedSearch` is the part of `ProgramSearch` that answers ``search.estimate(...)``:
it takes the search's schedule (the phases its `_schedule` gives, after trial 0),
measures one run of the program on a sample (`plait.optimization.costs`), and leaves
out what the search's checkpoint already holds; the candidates a schedule counts are
built from the checkpoint without a call (`_candidate_runs`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from plait.execution.run import awaitable_or_result
from plait.execution.settings import resources_of
from plait.module import Module
from plait.optimization import costs
from plait.optimization.costs import Phase, Range, check_sample
from plait.optimization.evaluation import examples_of
from plait.optimization.search.checkpoint import trial_key
from plait.optimization.search.resume import _ESTIMATING, _NeedsCalls
from plait.resources import ResourceManager
from plait.resources.usage import Budget, metered

if TYPE_CHECKING:
    from plait.optimization.search.base import Candidate, SearchParts


class EstimatedSearch:
    """The estimate of a `ProgramSearch` (its mixin: the search's own parts are `SearchParts`)."""

    def estimate(
        self: SearchParts,
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
        check_sample(sample)
        train = _either("trainset", trainset, "train_set", train_set)
        val = _either("valset", valset, "val_set", val_set)
        return awaitable_or_result(self._estimate(program, train, val, resources, sample))

    async def _estimate(
        self: SearchParts,
        program: Module,
        train_set: Any,
        val_set: Any,
        resources: Any,
        sample: int,
    ) -> Any:
        """The body of `estimate`."""
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

    def _start_phase(self: SearchParts, program: Module, val: list[tuple[Any, Any]]) -> Any:
        """The schedule's first phase: trial 0 on the validation set (none when checkpointed)."""
        n = self._left_to_evaluate(self._start_candidate(program), len(val))
        return Phase("trial 0: the program as it was", runs=Range(n, n, n))

    def _left_to_evaluate(self: SearchParts, candidate: Candidate, n: int) -> int:
        """Returns how many of the ``n`` validation examples a candidate's evaluation has
        left, after what the checkpoint holds of it (for estimates)."""
        return self._left_of([candidate], n)

    def _left_of(self: SearchParts, candidates: Sequence[Candidate], n: int) -> int:
        """Returns the validation runs ``candidates`` have left after what the checkpoint
        holds of them (a candidate there twice takes its trials in turn, as `compile` does)."""
        taken: Counter[str] = Counter()
        left = 0
        for candidate in candidates:
            key = trial_key(candidate.program.state_dict(), candidate.settings)
            held = self._saved.reusable.get(key, [])
            left += held[taken[key]].unevaluated if taken[key] < len(held) else n
            taken[key] += 1
        return left

    async def _candidate_runs(
        self: SearchParts, program: Module, train: list[tuple[Any, Any]], n: int, count: int
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


def _either(name: str, value: Any, other_name: str, other: Any) -> Any:
    """Returns the dataset given under ``name`` or its other spelling ``other_name``."""
    if value is not None and other is not None:
        raise TypeError(f"compile() takes {name}= or {other_name}=, not both")
    return value if value is not None else other
