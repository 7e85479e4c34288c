"""The old path `plait.optimization.fewshot`, kept so that its imports go on working.

Its names live in `plait.optimization.search.demos` now.
"""

from plait.optimization.search.demos import (
    BootstrapFewShot,
    LabeledFewShot,
    RandomSearch,
    balanced_sample,
    demo_modules,
)

__all__ = [
    "BootstrapFewShot",
    "LabeledFewShot",
    "RandomSearch",
    "balanced_sample",
    "demo_modules",
]
