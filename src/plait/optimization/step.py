"""The old path `plait.optimization.step`, kept so that its imports go on working.

Its names live in `plait.optimization.training.step` now.
"""

from plait.optimization.training.step import (
    PROGRAM_PATH,
    TrainingStep,
    on_examples,
)

__all__ = [
    "PROGRAM_PATH",
    "TrainingStep",
    "on_examples",
]
