"""The old path `plait.optimization.losses`, kept so that its imports go on working.

Its names live in `plait.optimization.training` now: `losses` and `judges`.
"""

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
