"""The old path `plait.optimization.optimizers`, kept so that its imports go on working.

Its names live in `plait.optimization.training.optimizer` now.
"""

from plait.optimization.training.optimizer import (
    Optimizer,
    SFAOptimizer,
    StepReport,
    TextGradOptimizer,
    UpdateRecord,
    change_ratio,
    check_update,
)

__all__ = [
    "Optimizer",
    "SFAOptimizer",
    "StepReport",
    "TextGradOptimizer",
    "UpdateRecord",
    "change_ratio",
    "check_update",
]
