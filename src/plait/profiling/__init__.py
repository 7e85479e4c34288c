"""The public home of `plait.report.profiling`, where the observability layer keeps it.

``from plait.profiling import profile`` (and the rest of its `__all__`) keeps
working for programs written before profiling joined the observability
layer's folder.
"""

from plait.report.profiling import (
    TIMELINE_STEP,
    ItemOutcome,
    NodeClock,
    NodeTiming,
    Profiler,
    RequestTiming,
    profile,
)

__all__ = [
    "TIMELINE_STEP",
    "ItemOutcome",
    "NodeClock",
    "NodeTiming",
    "Profiler",
    "RequestTiming",
    "profile",
]
