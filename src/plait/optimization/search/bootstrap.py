"""BootstrapFewShot: demos from the program's own successful runs, balanced across labels."""

from __future__ import annotations

import random
from typing import Any

from plait.module import Module
from plait.optimization.costs import Phase, Range
from plait.optimization.evaluation import Metric
from plait.optimization.search.base import Candidate, ProgramSearch
from plait.optimization.search.demos import (
    Example,
    _bootstrap_runs,
    _describe,
    _labeled_pool,
    _pick,
    _read_pool,
    _remembered_pool,
    _require_steps,
    _with_demos,
)

__all__ = ["BootstrapFewShot"]


class BootstrapFewShot(ProgramSearch):
    """Demos from the program's own successful runs on the training set, balanced across labels.

    The program runs on every training example (concurrently); each step's
    call on an example the metric accepts becomes a demo for that step. Where
    the good runs lack a label (a model that always answers "True" has good
    runs only on True examples) or are too few, labeled examples that fit the
    step's fields fill in (``fill_labeled``), so the set stays balanced.

    Args:
        metric: decides which runs are good; default exact match.
        max_demos: demos per step.
        threshold: the score a run needs to count as good.
        fill_labeled: fill a short demo set with labeled examples.
        seed: the sampling seed.
        balance, max_concurrent, checkpoint: as `ProgramSearch` (the checkpoint
            also keeps the bootstrap pass).
    """

    _checkpointed = ("max_demos", "threshold", "fill_labeled", "seed")

    def __init__(
        self,
        metric: Metric | None = None,
        *,
        max_demos: int = 4,
        threshold: float = 1.0,
        fill_labeled: bool = True,
        seed: int = 0,
        **options: Any,
    ) -> None:
        super().__init__(metric, **options)
        if max_demos < 1:
            raise ValueError(f"BootstrapFewShot needs max_demos >= 1, got {max_demos}")
        self.max_demos = max_demos
        self.threshold = threshold
        self.fill_labeled = fill_labeled
        self.seed = seed

    async def _schedule(
        self, program: Module, train: list[Example], val: list[Example], proposal: Any = None
    ) -> list[Any]:
        m = _bootstrap_runs(self, train)
        n = await self._candidate_runs(program, train, len(val), 1)
        return [
            Phase(f"bootstrap: the program on {m} training examples", runs=Range(m, m, m)),
            Phase(
                f"1 candidate with up to {self.max_demos} demos",
                runs=Range(n, n, n),
                demos=self.max_demos,
            ),
        ]

    async def _candidates(
        self, program: Module, train: list[Example], resources: Any
    ) -> list[Candidate]:
        _require_steps(program, type(self).__name__)
        if not train:
            raise ValueError("BootstrapFewShot needs a non-empty train_set")
        pool = await _remembered_pool(self, program, train, resources, self.threshold)
        rng = random.Random(self.seed)
        labeled = _labeled_pool(program, train) if self.fill_labeled else None
        chosen = _pick(pool, program, self.max_demos, rng, fallback=labeled)
        note = f"bootstrapped from {sum(len(v) for v in pool.values())} good runs"
        return [Candidate(_with_demos(program, chosen), _describe(chosen), note)]

    def _read_state(self, state: dict[str, Any], read: Any) -> None:
        for key, step in state.get("steps", {}).items():
            if key != "bootstrap":
                read.fail(f"state.steps.{key}", "is not a step of BootstrapFewShot")
            _read_pool(step["value"], read, f"state.steps.{key}.value")
