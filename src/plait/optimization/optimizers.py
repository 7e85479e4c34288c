"""The old path `plait.optimization.optimizers`, kept so that its imports go on working.

Its names live in `plait.optimization.training` now: `optimizer` (the base), `sfa`
and `textgrad`.
"""

from plait.optimization.training.optimizer import (
    Optimizer,
    StepReport,
    UpdateRecord,
    change_ratio,
    check_update,
)
from plait.optimization.training.sfa import SFAOptimizer
from plait.optimization.training.textgrad import TextGradOptimizer

__all__ = [
    "Optimizer",
    "SFAOptimizer",
    "StepReport",
    "TextGradOptimizer",
    "UpdateRecord",
    "change_ratio",
    "check_update",
]
