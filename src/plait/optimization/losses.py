"""The old path `plait.optimization.losses`, kept so that its imports go on working.

Its names live in `plait.optimization.training.losses` now.
"""

from plait.optimization.training.losses import (
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

__all__ = [
    "CompositeLoss",
    "HumanFeedbackLoss",
    "LLMJudge",
    "LLMPreferenceLoss",
    "LLMRankingLoss",
    "LLMRubricLoss",
    "Loss",
    "RankingFeedback",
    "VerifierLoss",
]
