"""The old path `plait.optimization.updates`, kept so that its imports go on working.

Its names live in `plait.optimization.training.updates` now.
"""

from plait.optimization.training.updates import (
    FeedbackSummary,
    ParameterUpdate,
    StepReport,
    UpdateRecord,
    allowed_change,
    allowed_words,
    as_text,
    change_ratio,
    changed_words,
    check_update,
    clip_middle,
    copied_name,
    copied_run,
    kind_of,
    parse_leniently,
    placeholders,
    update_model_for,
)

__all__ = [
    "FeedbackSummary",
    "ParameterUpdate",
    "StepReport",
    "UpdateRecord",
    "allowed_change",
    "allowed_words",
    "as_text",
    "change_ratio",
    "changed_words",
    "check_update",
    "clip_middle",
    "copied_name",
    "copied_run",
    "kind_of",
    "parse_leniently",
    "placeholders",
    "update_model_for",
]
