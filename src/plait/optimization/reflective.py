"""The old path `plait.optimization.reflective`, kept so that its imports go on working.

Its names live in `plait.optimization.search.reflective` now.
"""

from plait.optimization.search.reflective import (
    ReflectiveSearch,
)

__all__ = [
    "ReflectiveSearch",
]
