"""The old path `plait.optimization.search_checkpoint`, kept so that its imports go on working.

Its names live in `plait.optimization.search.checkpoint` now.
"""

from plait.optimization.search.checkpoint import (
    REMEDY,
    Reader,
    SearchCheckpoint,
    digest,
    program_digest,
    trial_key,
)

__all__ = [
    "REMEDY",
    "Reader",
    "SearchCheckpoint",
    "digest",
    "program_digest",
    "trial_key",
]
