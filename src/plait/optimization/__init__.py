"""The learning layer: evaluation and metrics, feedback learning, and program search.

The layout:

* ``evaluation.py`` (`evaluate`, `run_dataset`), ``results.py`` (`EvaluationResult`),
  ``metrics.py`` (metric factories): running a program over a dataset and scoring it;
* ``training/`` — feedback learning: losses, backward through tapes, optimizers on a
  small base, the `Trainer` (see its ``__init__``);
* ``search/`` — program search: `ProgramSearch`, whose override points `SearchOverrides`
  declares, and one file per search (see its ``__init__``);
* ``costs/`` — cost estimates of an evaluation, a search or a Trainer, before it runs;
* ``events.py`` — the learning steps told to callbacks; ``serialization.py`` — saving and
  loading learned parameters as JSON.

The modules ``fewshot``, ``reflective``, ``search_checkpoint``, ``trainer``, ``optimizers``,
``losses``, ``backward``, ``step`` and ``updates`` here are the old paths of code that
moved into those folders; they only re-export it.

Names load on first use, so that ``plait.evaluate`` (which lives here) does not
pull in every optimizer and its structured types; `backward` is imported now (through
its old path, which a user may import too) because the submodule of the same name would
otherwise shadow the function once loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait import _lazy
from plait.optimization.backward import BackwardReport, backward

if TYPE_CHECKING:
    from plait.optimization.costs import CostEstimate, estimate
    from plait.optimization.search.base import ProgramSearch
    from plait.optimization.search.bootstrap import BootstrapFewShot
    from plait.optimization.search.demos import balanced_sample, demo_modules
    from plait.optimization.search.grid import GridSearch, optimize_grid
    from plait.optimization.search.labeled import LabeledFewShot
    from plait.optimization.search.random_search import RandomSearch
    from plait.optimization.search.reflective import ReflectiveSearch
    from plait.optimization.search.report import SearchReport, Trial, balanced_score, sign_test
    from plait.optimization.serialization import load_state
    from plait.optimization.training.judges import (
        LLMJudge,
        LLMPreferenceLoss,
        LLMRankingLoss,
        LLMRubricLoss,
    )
    from plait.optimization.training.losses import (
        CompositeLoss,
        HumanFeedbackLoss,
        Loss,
        RankingFeedback,
        VerifierLoss,
    )
    from plait.optimization.training.optimizer import Optimizer, StepReport, UpdateRecord
    from plait.optimization.training.report import TrainReport
    from plait.optimization.training.sfa import SFAOptimizer
    from plait.optimization.training.step import TrainingStep
    from plait.optimization.training.textgrad import TextGradOptimizer
    from plait.optimization.training.trainer import Trainer

# name -> module that defines it; imported when first asked for.
_HOMES = {
    "CostEstimate": "plait.optimization.costs",
    "estimate": "plait.optimization.costs",
    "BootstrapFewShot": "plait.optimization.search.bootstrap",
    "LabeledFewShot": "plait.optimization.search.labeled",
    "RandomSearch": "plait.optimization.search.random_search",
    "balanced_sample": "plait.optimization.search.demos",
    "demo_modules": "plait.optimization.search.demos",
    "CompositeLoss": "plait.optimization.training.losses",
    "HumanFeedbackLoss": "plait.optimization.training.losses",
    "LLMJudge": "plait.optimization.training.judges",
    "LLMPreferenceLoss": "plait.optimization.training.judges",
    "LLMRankingLoss": "plait.optimization.training.judges",
    "LLMRubricLoss": "plait.optimization.training.judges",
    "Loss": "plait.optimization.training.losses",
    "RankingFeedback": "plait.optimization.training.losses",
    "VerifierLoss": "plait.optimization.training.losses",
    "Optimizer": "plait.optimization.training.optimizer",
    "SFAOptimizer": "plait.optimization.training.sfa",
    "StepReport": "plait.optimization.training.optimizer",
    "TextGradOptimizer": "plait.optimization.training.textgrad",
    "UpdateRecord": "plait.optimization.training.optimizer",
    "ReflectiveSearch": "plait.optimization.search.reflective",
    "GridSearch": "plait.optimization.search.grid",
    "ProgramSearch": "plait.optimization.search.base",
    "SearchReport": "plait.optimization.search.report",
    "Trial": "plait.optimization.search.report",
    "balanced_score": "plait.optimization.search.report",
    "optimize_grid": "plait.optimization.search.grid",
    "sign_test": "plait.optimization.search.report",
    "load_state": "plait.optimization.serialization",
    "TrainingStep": "plait.optimization.training.step",
    "Trainer": "plait.optimization.training.trainer",
    "TrainReport": "plait.optimization.training.report",
}

__all__ = [
    "BackwardReport",
    "BootstrapFewShot",
    "CompositeLoss",
    "CostEstimate",
    "GridSearch",
    "HumanFeedbackLoss",
    "LLMJudge",
    "LLMPreferenceLoss",
    "LLMRankingLoss",
    "LLMRubricLoss",
    "LabeledFewShot",
    "Loss",
    "Optimizer",
    "ProgramSearch",
    "RandomSearch",
    "RankingFeedback",
    "ReflectiveSearch",
    "SFAOptimizer",
    "SearchReport",
    "StepReport",
    "TextGradOptimizer",
    "TrainReport",
    "Trainer",
    "TrainingStep",
    "Trial",
    "UpdateRecord",
    "VerifierLoss",
    "backward",
    "balanced_sample",
    "balanced_score",
    "demo_modules",
    "estimate",
    "load_state",
    "optimize_grid",
    "sign_test",
]


__getattr__, __dir__ = _lazy.exports("plait.optimization", _HOMES, globals(), __all__)
