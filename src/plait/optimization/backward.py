"""The old path `plait.optimization.backward`, kept so that its imports go on working.

Its names live in `plait.optimization.training.backward` now.
"""

from plait.optimization.training.backward import (
    BackwardReport,
    backward,
    node_levels,
)

__all__ = [
    "BackwardReport",
    "backward",
    "node_levels",
]
