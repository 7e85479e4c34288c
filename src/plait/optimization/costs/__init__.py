"""Cost estimates (being split into this folder)."""

from plait.optimization.costs.estimate import (
    CostEstimate,
    Phase,
    Proposal,
    Range,
    Variant,
    _Size,
    check_sample,
    estimate,
    feedback_items,
    from_schedule,
    mean_call,
    measure,
    measure_variant,
    quiet,
    repeat_feedback,
    sample_twice,
)

__all__ = [
    "CostEstimate",
    "Phase",
    "Proposal",
    "Range",
    "Variant",
    "check_sample",
    "estimate",
    "from_schedule",
    "measure",
    "measure_variant",
    "quiet",
]
