"""The old path `plait.optimization.fewshot`, kept so that its imports go on working.

Its names live in `plait.optimization.search` now: `labeled`, `bootstrap`,
`random_search` and `demos`.
"""

from plait.optimization.search.bootstrap import BootstrapFewShot
from plait.optimization.search.demos import balanced_sample, demo_modules
from plait.optimization.search.labeled import LabeledFewShot
from plait.optimization.search.random_search import RandomSearch

__all__ = [
    "BootstrapFewShot",
    "LabeledFewShot",
    "RandomSearch",
    "balanced_sample",
    "demo_modules",
]
