"""The learning layer: losses, backward through tapes, optimizers and training loops."""

from plait.optimization.backward import BackwardReport, backward
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
from plait.optimization.serialization import load_state
from plait.optimization.step import TrainingStep
from plait.optimization.trainer import Trainer, TrainReport

__all__ = [
    "BackwardReport",
    "CompositeLoss",
    "HumanFeedbackLoss",
    "LLMJudge",
    "LLMPreferenceLoss",
    "LLMRankingLoss",
    "LLMRubricLoss",
    "Loss",
    "Optimizer",
    "RankingFeedback",
    "SFAOptimizer",
    "StepReport",
    "TextGradOptimizer",
    "TrainReport",
    "Trainer",
    "TrainingStep",
    "UpdateRecord",
    "VerifierLoss",
    "backward",
    "load_state",
]
