"""What a usable update is: the optimizers' reply schemas, records, and the checks.

An optimizer's proposal for a parameter is applied only if `check_update`
accepts it: not empty, not unchanged, not absurdly long (over 3 × the old
length + 400 characters), keeping every ``{placeholder}`` of the old value
(and adding none to a template), of the same JSON type for JSON-data
parameters, not copying a run of feedback text into a prompt, and within the
edit size ``conservatism`` allows.

The conservatism rule: ``conservatism`` c in [0, 1] is told to the model in
words (0: rewrite freely, 1: minimal edits) and enforced on the result. The
words changed (`changed_words`: words replaced, inserted or deleted, a
replaced run counting as the longer of its two sides) may be at most

    max((1 - 0.9 c) × the longer text's words,  40 × (1 - c))

so c = 0 allows anything, the default c = 0.5 allows 55 % of the words or
20 words, whichever is more, and c = 1 allows 10 %. The floor in words is
what lets a short prompt be rewritten: with the share alone, a 9-word prompt
rewritten into a clearer 14-word one (87 % changed) was refused at 0.5, so
no instruction of a few words could ever improve. Long prompts keep the
share, so one step cannot replace most of a long prompt (drift), and the copy
checks stop the drift seen before: feedback text ("The output failed the
check. Expected ...") pasted into the prompt, either as a run of words or as
a name only the feedback has (``object_counting_correct``, ``Prediction(``):
a 135M model once wrote "The feedback failed object_counting_correct.
Expected: 2. Got: Prediction(answer='2.10.2013')" as its new instructions,
seven copied words in a row, one short of a run. Words, not characters: a
prompt is prose, and one reworded sentence should count as one change.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationError, create_model
from pydantic_core import to_jsonable_python

from plait._jsontext import loads

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


@functools.cache
def update_model_for(value_type: Any) -> type[BaseModel]:
    """Returns the reply model of an update call: `ParameterUpdate`, or one with a typed value.

    A parameter with a ``value_type`` (``list[Demo]``) is asked for
    ``{"rationale": str, "new_value": <value_type>}``, so the reply is data of
    the right shape rather than JSON written inside a string.
    """
    if value_type is None:
        return ParameterUpdate

    return create_model(
        "ParameterUpdate",
        rationale=(str, Field(max_length=400)),
        new_value=(value_type, ...),
    )


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


def changed_words(old: str, new: str) -> int:
    """Returns how many words an edit changed: replaced (the longer side), inserted or deleted."""
    a, b = old.split(), new.split()
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return sum(
        max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"
    )


WORD_FLOOR = 40
"""Words any edit may change at conservatism 0 (scaled by ``1 - c``); see the module docs."""


def allowed_change(conservatism: float) -> float:
    """Returns the largest share of the (longer text's) words an update may change."""
    return 1.0 - 0.9 * conservatism


def allowed_words(conservatism: float, old: str, new: str) -> float:
    """Returns how many words an edit from ``old`` to ``new`` may change at ``conservatism``."""
    longer = max(len(old.split()), len(new.split()))
    bound = max(allowed_change(conservatism) * longer, WORD_FLOOR * (1.0 - conservatism))
    return round(bound, 9)  # 40 × (1 - 0.9) is 3.9999…, and means 4


COPY_RUN = 8
"""Consecutive words of feedback that a new prompt may not repeat (unless the old one had them)."""


def _words(text: str) -> list[str]:
    return re.findall(r"[\w{}]+", text.casefold())


def copied_run(new: str, sources: Any, old: str = "", run: int = COPY_RUN) -> str | None:
    """Returns a run of ``run`` words that ``new`` repeats from one of ``sources``, if any.

    Runs the old value already had do not count: keeping a sentence is not copying it.
    """
    words = _words(new)
    if len(words) < run:
        return None
    seen = {tuple(w[i : i + run]) for w in map(_words, sources) for i in range(len(w) - run + 1)}
    kept = {tuple(w[i : i + run]) for w in [_words(old)] for i in range(len(w) - run + 1)}
    for i in range(len(words) - run + 1):
        piece = tuple(words[i : i + run])
        if piece in seen and piece not in kept:
            return " ".join(piece)
    return None


_NAME = re.compile(r"\b[A-Za-z]\w*_\w*|\b[A-Za-z]\w*\(")


def copied_name(new: str, sources: Any, old: str = "") -> str | None:
    """Returns a name that ``new`` takes from one of ``sources``, if any.

    A name is a word with an underscore (a metric's function name) or a word
    opening a call (``Prediction(``, an output's repr): code the feedback
    shows, never an instruction to a model. Names the old value had do not count.
    """
    found = set(_NAME.findall(new))
    if not found:
        return None
    seen = {name for text in sources for name in _NAME.findall(text)}
    kept = set(_NAME.findall(old))
    return next((name for name in sorted(found) if name in seen and name not in kept), None)


def check_update(
    old: Any, proposed: Any, conservatism: float, *, sources: Any = ()
) -> tuple[Any, str | None]:
    """Returns ``(new_value, None)`` for a usable proposal, or ``(None, reason)``.

    A string parameter takes the proposed text (stripped, unless the old
    value had surrounding whitespace); a JSON-data parameter (demos, a list)
    takes proposed JSON text parsed, or proposed data as it is, when it is
    of the same JSON type. ``sources`` are the feedback texts the proposal
    answered: a new prompt must not paste a run of `COPY_RUN` words from them.
    """
    if not isinstance(proposed, str) and not isinstance(old, str):
        value: Any = to_jsonable_python(proposed, fallback=str)  # models become dicts
        text = as_text(value)
    else:
        text = proposed if isinstance(proposed, str) else str(proposed)
        value = None
    if not text.strip() or value in ([], {}):
        return None, "the new value is empty"
    if isinstance(old, str):
        old_text = old
        value = text.strip() if old == old.strip() else text
    else:
        old_text = as_text(old)
        if value is None:
            try:
                value = loads(text)
            except ValueError:
                return (
                    None,
                    f"the new value is not valid JSON (the parameter holds a {kind_of(old)})",
                )
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
        reason = _prompt_problem(old, new_text, sources)
        if reason is not None:
            return None, reason
    changed, bound = (
        changed_words(old_text, new_text),
        allowed_words(conservatism, old_text, new_text),
    )
    if changed > bound:
        longer = max(len(old_text.split()), len(new_text.split()))
        return None, (
            f"it changes {changed} of {longer} words; conservatism {conservatism:g} allows "
            f"at most {int(bound)} ({allowed_change(conservatism):.0%} of the words, or "
            f"{WORD_FLOOR * (1 - conservatism):.0f} words)"
        )
    return value, None


def _prompt_problem(old: str, new_text: str, sources: Any) -> str | None:
    """Returns why a new prompt text is unusable (a placeholder lost or added, feedback
    pasted into it), or None (part of `check_update`)."""
    old_fields, new_fields = placeholders(old), placeholders(new_text)
    lost = sorted(old_fields - new_fields)
    if lost:
        return f"placeholder(s) {', '.join(lost)} of the old value are missing"
    added = sorted(new_fields - old_fields)
    if old_fields and added:
        return f"it adds placeholder(s) {', '.join(added)} that the program never fills"
    copied = copied_run(new_text, sources, old) or copied_name(new_text, sources, old)
    if copied is not None:
        return (
            f'it copies "{copied}" from the feedback; write what the step should do, '
            "not the feedback itself"
        )
    return None


_KIND_NAMES: dict[type, str] = {dict: "JSON object", list: "JSON list", str: "string"}
"""What a parameter's value is called in feedback, by its type (else the type's name)."""


def kind_of(value: Any) -> str:
    return _KIND_NAMES.get(type(value), type(value).__name__)


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
        return target.model_validate(loads(text.strip(), strict=False))
    except (ValueError, ValidationError):
        return None
