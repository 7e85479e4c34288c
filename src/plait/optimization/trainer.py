"""The old path `plait.optimization.trainer`, kept so that its imports go on working.

Its names live in `plait.optimization.training` now: `trainer` and `report`.
"""

from plait.optimization.training.report import NOTHING_VALIDATED, TrainReport
from plait.optimization.training.trainer import Trainer

__all__ = [
    "NOTHING_VALIDATED",
    "TrainReport",
    "Trainer",
]
