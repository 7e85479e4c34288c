"""What a usable update is: the optimizers' reply schemas, records, and the checks.

An optimizer's proposal for a parameter is applied only if `check_update`
accepts it: not empty, not unchanged, not absurdly long (over 3 × the old
length + 400 characters), keeping every ``{placeholder}`` of the old value
(and adding none to a template), of the same JSON type for JSON-data
parameters, and within the edit size ``conservatism`` allows.

The conservatism rule: ``conservatism`` c in [0, 1] is told to the model in
words (0: rewrite freely, 1: minimal edits) and enforced on the result: the
share of words changed, ``1 - difflib.SequenceMatcher(old words, new
words).ratio()``, may be at most ``1 - 0.9 * c`` (c = 0: anything; the default
0.5: 55 %; c = 1: 10 %). Words, not characters: a prompt is prose, and
one reworded sentence should count as one change.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationError

__all__ = [
    "FeedbackSummary",
    "ParameterUpdate",
    "StepReport",
    "UpdateRecord",
    "allowed_change",
    "as_text",
    "change_ratio",
    "check_update",
    "clip_middle",
    "kind_of",
    "parse_leniently",
    "placeholders",
]


class FeedbackSummary(BaseModel):
    """What the aggregation call of `SFAOptimizer` returns."""

    summary: str = Field(max_length=400)
    changes: list[Annotated[str, Field(max_length=300)]] = Field(max_length=5)


class ParameterUpdate(BaseModel):
    """What an update call returns.

    The rationale comes first on purpose: a grammar-constrained small model
    writes the keys in schema order, and reasoning before the value helps it.
    Measured on SmolLM2-135M: with ``new_value`` first it answered a bare
    "True"/"False" 3 times of 3; with ``rationale`` first, usable instructions
    2 times of 4.
    """

    rationale: str = Field(max_length=400)
    new_value: str


# ------------------------------------------------------------------ records
@dataclass
class UpdateRecord:
    """What an optimizer did with one parameter in one step (JSON-compatible)."""

    step: int
    """The optimizer step (1 for the first ``step()``)."""
    parameter: str
    """The parameter's name, as the optimizer knows it."""
    status: str = "rejected"
    """``accepted``, ``rejected`` (no usable reply), ``reverted`` (validation fell), ``skipped``."""
    reason: str = ""
    """Why it was rejected, reverted or skipped."""
    old: Any = None
    """The value before the step."""
    new: Any = None
    """The value proposed (applied only when accepted)."""
    feedback: str = ""
    """A summary of the feedback the update answered."""
    changes: list[str] = field(default_factory=list)
    """The changes the update was asked to make (SFA's aggregation)."""
    rationale: str = ""
    """The model's reason for the new value."""
    attempts: int = 0
    """Model calls made for this update (aggregation included)."""
    level: int | None = None
    """The graph level the parameter was updated at (None: no graph order was known)."""


@dataclass
class StepReport:
    """What one ``optimizer.step()`` did."""

    step: int
    updates: list[UpdateRecord] = field(default_factory=list)
    """One record per parameter that had feedback, in update order."""
    levels: list[list[str]] = field(default_factory=list)
    """Parameter names updated together, upstream levels first."""
    score_before: float | None = None
    """The validation score before the step (with a ``validate`` hook)."""
    score_after: float | None = None
    """The validation score after the updates (None when nothing was applied)."""
    reverted: bool = False
    """Whether the step's updates were undone because the validation score fell."""

    @property
    def accepted(self) -> list[str]:
        """Names of the parameters whose new value was kept."""
        return [r.parameter for r in self.updates if r.status == "accepted"]

    @property
    def rejected(self) -> list[str]:
        """Names of the parameters whose update was rejected."""
        return [r.parameter for r in self.updates if r.status == "rejected"]


# ------------------------------------------------------------------- checks
_PLACEHOLDER = re.compile(r"(?<!\{)\{[A-Za-z_][A-Za-z0-9_]*(?:![rsa])?(?::[^{}]*)?\}(?!\})")


def placeholders(text: str) -> set[str]:
    """Returns the ``{name}`` format fields in ``text`` (doubled braces are not fields)."""
    return set(_PLACEHOLDER.findall(text))


def change_ratio(old: str, new: str) -> float:
    """Returns the share of words changed between ``old`` and ``new`` (0: same, 1: all)."""
    a, b = old.split(), new.split()
    if not a and not b:
        return 0.0
    return 1.0 - difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def allowed_change(conservatism: float) -> float:
    """Returns the largest `change_ratio` an update may have at ``conservatism``."""
    return 1.0 - 0.9 * conservatism


def check_update(old: Any, proposed: str, conservatism: float) -> tuple[Any, str | None]:
    """Returns ``(new_value, None)`` for a usable proposal, or ``(None, reason)``.

    A string parameter takes the proposed text (stripped, unless the old
    value had surrounding whitespace); a JSON-data parameter (demos, a list)
    takes the proposed text parsed as JSON of the same type.
    """
    text = proposed if isinstance(proposed, str) else str(proposed)
    if not text.strip():
        return None, "the new value is empty"
    if isinstance(old, str):
        old_text = old
        value: Any = text.strip() if old == old.strip() else text
    else:
        old_text = as_text(old)
        try:
            value = json.loads(text)
        except ValueError:
            return None, f"the new value is not valid JSON (the parameter holds a {kind_of(old)})"
        if type(value) is not type(old):
            return (
                None,
                f"the new value is a {kind_of(value)}; the parameter holds a {kind_of(old)}",
            )
    new_text = value if isinstance(value, str) else as_text(value)
    if new_text.strip() == old_text.strip():
        return None, "the new value is the same as the old one"
    limit = 3 * len(old_text) + 400
    if len(new_text) > limit:
        return None, (
            f"the new value has {len(new_text)} characters, more than the limit of {limit} "
            "(3 × the old length + 400)"
        )
    if isinstance(old, str):
        old_fields, new_fields = placeholders(old), placeholders(new_text)
        lost = sorted(old_fields - new_fields)
        if lost:
            return None, f"placeholder(s) {', '.join(lost)} of the old value are missing"
        added = sorted(new_fields - old_fields)
        if old_fields and added:
            return None, f"it adds placeholder(s) {', '.join(added)} that the program never fills"
    ratio, bound = change_ratio(old_text, new_text), allowed_change(conservatism)
    if ratio > bound + 1e-9:
        return None, (
            f"it changes {ratio:.0%} of the words; conservatism {conservatism:g} allows "
            f"at most {bound:.0%}"
        )
    return value, None


def kind_of(value: Any) -> str:
    return {dict: "JSON object", list: "JSON list", str: "string"}.get(
        type(value), type(value).__name__
    )


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=1, default=str)


def clip_middle(text: str, limit: int) -> str:
    """Cuts the middle of ``text``: a backward message ends with its verdict, which must stay."""
    if len(text) <= limit:
        return text
    half = max(limit // 2 - 10, 1)
    return f"{text[:half]} …[{len(text) - 2 * half} characters cut]… {text[-half:]}"


def parse_leniently(text: str, target: Any) -> Any:
    """Parses JSON that has raw control characters in its strings (small models write them)."""
    try:
        return target.model_validate(json.loads(text.strip(), strict=False))
    except (ValueError, ValidationError):
        return None
