"""LabeledFewShot: training examples, balanced across labels, as every step's demos."""

from __future__ import annotations

import random
from typing import Any

from plait.module import Module
from plait.optimization.costs import Phase, Range
from plait.optimization.evaluation import Metric
from plait.optimization.search.base import Candidate, ProgramSearch
from plait.optimization.search.demos import (
    Example,
    _describe,
    _labeled_pool,
    _pick,
    _require_steps,
    _with_demos,
)

__all__ = ["LabeledFewShot"]


class LabeledFewShot(ProgramSearch):
    """Uses ``k`` training examples, balanced across labels, as every step's demos.

    A step gets demos only from examples that fit its fields (see the module
    docs); a program whose steps no example fits is an error.

    Args:
        metric, balance, max_concurrent: as `ProgramSearch`.
        k: demos per step, also as a keyword alone (``LabeledFewShot(k=16)``;
            the older order ``LabeledFewShot(k, metric)`` works too).
        seed: the sampling seed.
    """

    _checkpointed = ("k", "seed")

    def __init__(
        self, metric: Metric | None = None, k: int = 4, *, seed: int = 0, **options: Any
    ) -> None:
        if isinstance(metric, int) and not isinstance(metric, bool):  # LabeledFewShot(k, metric)
            metric, k = (k if callable(k) else None), metric
        super().__init__(metric, **options)
        if k < 1:
            raise ValueError(f"LabeledFewShot needs k >= 1, got {k}")
        self.k = k
        self.seed = seed

    async def _schedule(
        self, program: Module, train: list[Example], val: list[Example], proposal: Any = None
    ) -> list[Any]:
        n = await self._candidate_runs(program, train, len(val), 1)
        return [
            Phase(f"1 candidate with {self.k} labeled demos", runs=Range(n, n, n), demos=self.k)
        ]

    async def _candidates(
        self, program: Module, train: list[Example], resources: Any
    ) -> list[Candidate]:
        _require_steps(program, type(self).__name__)
        pool = {path: items for path, items in _labeled_pool(program, train).items() if items}
        if not pool:
            raise ValueError(
                f"LabeledFewShot: no training example fits the fields of any step of "
                f"{type(program).__name__}; give examples whose input and target are the step's "
                "field values (a mapping by field name), or use BootstrapFewShot"
            )
        chosen = _pick(pool, program, self.k, random.Random(self.seed))
        return [Candidate(_with_demos(program, chosen), _describe(chosen), "labeled demos")]
