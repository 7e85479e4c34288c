"""Program search (being split into this folder)."""

from plait.optimization.search.base import (
    Candidate,
    GridSearch,
    ProgramSearch,
    SearchReport,
    Trial,
    balanced_score,
    optimize_grid,
    sign_test,
)

__all__ = [
    "GridSearch",
    "ProgramSearch",
    "SearchReport",
    "Trial",
    "balanced_score",
    "optimize_grid",
    "sign_test",
]
