"""The learning layer: evaluation and metrics, losses, backward through tapes, optimizers,
program searches and training loops.

Names load on first use, so that ``plait.evaluate`` (which lives here) does not
pull in every optimizer and its structured types; `backward` is imported now because
the submodule of the same name would otherwise shadow the function once loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait import _lazy
from plait.optimization.backward import BackwardReport, backward

if TYPE_CHECKING:
    from plait.optimization.costs import CostEstimate, estimate
    from plait.optimization.fewshot import (
        BootstrapFewShot,
        LabeledFewShot,
        RandomSearch,
        balanced_sample,
        demo_modules,
    )
    from plait.optimization.losses import (
        CompositeLoss,
        HumanFeedbackLoss,
        LLMJudge,
        LLMPreferenceLoss,
        LLMRankingLoss,
        LLMRubricLoss,
        Loss,
        RankingFeedback,
        VerifierLoss,
    )
    from plait.optimization.optimizers import (
        Optimizer,
        SFAOptimizer,
        StepReport,
        TextGradOptimizer,
        UpdateRecord,
    )
    from plait.optimization.reflective import ReflectiveSearch
    from plait.optimization.search import (
        GridSearch,
        ProgramSearch,
        SearchReport,
        Trial,
        balanced_score,
        optimize_grid,
        sign_test,
    )
    from plait.optimization.serialization import load_state
    from plait.optimization.step import TrainingStep
    from plait.optimization.trainer import Trainer, TrainReport

# name -> module that defines it; imported when first asked for.
_HOMES = {
    "CostEstimate": "plait.optimization.costs",
    "estimate": "plait.optimization.costs",
    "BootstrapFewShot": "plait.optimization.fewshot",
    "LabeledFewShot": "plait.optimization.fewshot",
    "RandomSearch": "plait.optimization.fewshot",
    "balanced_sample": "plait.optimization.fewshot",
    "demo_modules": "plait.optimization.fewshot",
    "CompositeLoss": "plait.optimization.losses",
    "HumanFeedbackLoss": "plait.optimization.losses",
    "LLMJudge": "plait.optimization.losses",
    "LLMPreferenceLoss": "plait.optimization.losses",
    "LLMRankingLoss": "plait.optimization.losses",
    "LLMRubricLoss": "plait.optimization.losses",
    "Loss": "plait.optimization.losses",
    "RankingFeedback": "plait.optimization.losses",
    "VerifierLoss": "plait.optimization.losses",
    "Optimizer": "plait.optimization.optimizers",
    "SFAOptimizer": "plait.optimization.optimizers",
    "StepReport": "plait.optimization.optimizers",
    "TextGradOptimizer": "plait.optimization.optimizers",
    "UpdateRecord": "plait.optimization.optimizers",
    "ReflectiveSearch": "plait.optimization.reflective",
    "GridSearch": "plait.optimization.search",
    "ProgramSearch": "plait.optimization.search",
    "SearchReport": "plait.optimization.search",
    "Trial": "plait.optimization.search",
    "balanced_score": "plait.optimization.search",
    "optimize_grid": "plait.optimization.search",
    "sign_test": "plait.optimization.search",
    "load_state": "plait.optimization.serialization",
    "TrainingStep": "plait.optimization.step",
    "Trainer": "plait.optimization.trainer",
    "TrainReport": "plait.optimization.trainer",
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
