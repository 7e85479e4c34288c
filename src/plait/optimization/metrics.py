"""Metric factories: ``metric_exact_match()`` and friends, configured once, called per row.

Each factory returns a metric ``metric(prediction, expected)``, the shape
`plait.evaluate` (and the optimizers' evaluations) call with a program's
output and an example's target. A metric may compare one field of a
structured output: ``field="answer"`` reads ``prediction.answer`` (or
``prediction["answer"]``) and, when the target is a mapping with that key,
``expected["answer"]`` — so a target can be the whole data row. Without
``field``, a prediction with one field (a `Prediction` of a one-output
signature) is compared by that field's value against a bare target, as
`plait.optimization.evaluation.exact_match` does::

    exact = metric_exact_match(field="sentiment", ignore_case=True)
    exact(Prediction(sentiment="Positive"), {"text": "Great!", "sentiment": "positive"})  # True

    await evaluate(classifier, rows, metric_exact_match(field="sentiment"))
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from plait.optimization.evaluation import Metric, _sole_value

__all__ = ["metric_contains", "metric_exact_match", "metric_f1", "metric_field_match"]


def metric_exact_match(
    field: str | None = None, ignore_case: bool = False, normalize: bool = True
) -> Metric:
    """Returns a metric that is True when the prediction's text equals the expected text.

    Args:
        field: compare this field of a structured prediction (and of the
            expected row, when it is a mapping with that key).
        ignore_case: compare without regard to case.
        normalize: trim both ends and collapse runs of white space first.
    """

    def exact_match(prediction: Any, expected: Any) -> bool:
        got, want = _values(prediction, expected, field)
        return _text(got, normalize, ignore_case) == _text(want, normalize, ignore_case)

    exact_match.field = field  # type: ignore[attr-defined]
    return exact_match


def metric_contains(
    pattern: str, field: str | None = None, ignore_case: bool = False, fixed: bool = True
) -> Metric:
    """Returns a metric that is True when the prediction's text contains ``pattern``.

    Args:
        pattern: the text to look for; a regular expression when ``fixed`` is False.
        field: look in this field of a structured prediction.
        ignore_case: match without regard to case.
        fixed: ``pattern`` is plain text (True) or a regular expression.

    The expected value is not used (the pattern is the expectation).
    """
    flags = re.IGNORECASE if ignore_case else 0
    compiled = re.compile(re.escape(pattern) if fixed else pattern, flags)

    def contains(prediction: Any, expected: Any = None) -> bool:
        got = _field(prediction, field, "prediction")
        return compiled.search(_text(got, False, False)) is not None

    contains.field = field  # type: ignore[attr-defined]
    return contains


def metric_f1(field: str | None = None, normalize: bool = True) -> Metric:
    """Returns a metric scoring the word overlap of prediction and expected text (0 to 1).

    The harmonic mean of precision and recall over word counts (a bag of
    words); ``normalize`` lower-cases and drops punctuation first. Two empty
    texts score 1.0, one empty text 0.0.
    """

    def f1(prediction: Any, expected: Any) -> float:
        got, want = _values(prediction, expected, field)
        predicted, reference = _words(got, normalize), _words(want, normalize)
        if not predicted and not reference:
            return 1.0
        common = sum(min(predicted.count(w), reference.count(w)) for w in set(predicted))
        if common == 0:
            return 0.0
        precision, recall = common / len(predicted), common / len(reference)
        return 2 * precision * recall / (precision + recall)

    f1.field = field  # type: ignore[attr-defined]
    return f1


def metric_field_match(fields: Sequence[str], require_all: bool = True) -> Metric:
    """Returns a metric that is True when the named fields of prediction and expected are equal.

    Args:
        fields: the field names to compare (values compared with ``==``).
        require_all: all fields must match (True), or any one (False).

    Raises:
        ValueError: ``fields`` is empty or a string.
    """
    if isinstance(fields, str) or not fields:
        raise ValueError(
            f"metric_field_match needs a non-empty list of field names, got {fields!r}"
        )
    names = list(fields)

    def field_match(prediction: Any, expected: Any) -> bool:
        matches = (
            _field(prediction, name, "prediction") == _field(expected, name, "expected")
            for name in names
        )
        return all(matches) if require_all else any(matches)

    return field_match


# ------------------------------------------------------------------ helpers
def _values(prediction: Any, expected: Any, field: str | None) -> tuple[Any, Any]:
    if field is None:  # a one-field prediction against a bare target: that field's value
        return _sole_value(prediction, expected), _sole_value(expected, prediction)
    got = _field(prediction, field, "prediction")
    if isinstance(expected, Mapping) or (_is_record(expected) and hasattr(expected, field)):
        return got, _field(expected, field, "expected")
    return got, expected  # a bare target is the field's expected value


def _is_record(value: Any) -> bool:
    """Whether fields may be read from ``value`` as attributes (a model, not text or a number)."""
    return not isinstance(value, str | bytes | int | float | bool) and value is not None


def _field(value: Any, field: str | None, what: str) -> Any:
    """Returns ``value[field]`` (or ``value.field``); ``value`` itself when ``field`` is None.

    Raises:
        KeyError: the field is missing; the message names it and what is there.
    """
    if field is None:
        return value
    if isinstance(value, Mapping):
        if field in value:
            return value[field]
        known = ", ".join(map(str, value)) or "none"
        raise KeyError(f"the {what} has no field {field!r}; its fields: {known}")
    if _is_record(value) and hasattr(value, field):
        return getattr(value, field)
    raise KeyError(
        f"the {what} is {type(value).__name__}, which has no field {field!r}; "
        "pass field=None to compare the whole value"
    )


def _text(value: Any, normalize: bool, ignore_case: bool) -> str:
    text = value if isinstance(value, str) else str(value)
    if normalize:
        text = " ".join(text.split())
    return text.lower() if ignore_case else text


_PUNCTUATION = re.compile(r"[^\w\s]")


def _words(value: Any, normalize: bool) -> list[str]:
    text = value if isinstance(value, str) else str(value)
    if normalize:
        text = _PUNCTUATION.sub(" ", text.lower())
    return text.split()
