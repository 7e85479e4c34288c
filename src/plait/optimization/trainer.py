"""The old path `plait.optimization.trainer`, kept so that its imports go on working.

Its names live in `plait.optimization.training.trainer` now.
"""

from plait.optimization.training.trainer import (
    NOTHING_VALIDATED,
    Trainer,
    TrainReport,
)

__all__ = [
    "NOTHING_VALIDATED",
    "TrainReport",
    "Trainer",
]
