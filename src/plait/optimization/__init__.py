"""The learning layer: losses, backward through tapes, optimizers and training loops."""

from plait.optimization.backward import BackwardReport, backward
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

__all__ = [
    "BackwardReport",
    "BootstrapFewShot",
    "CompositeLoss",
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
    "load_state",
    "optimize_grid",
    "sign_test",
]
