"""Prediction: read-only outputs by attribute and key, with usage, raw text and messages."""

import copy
import pickle

import pytest

from plait import Prediction
from plait.backends.types import Message, Usage


def make() -> Prediction:
    return Prediction(
        {"answer": "Paris", "confidence": 0.9},
        usage=Usage(3, 2),
        raw='{"answer": "Paris", "confidence": 0.9}',
        messages=[Message("user", "q")],
    )


def test_fields_by_attribute_key_and_iteration():
    pred = make()
    assert pred.answer == "Paris" and pred["confidence"] == 0.9
    assert list(pred) == ["answer", "confidence"] and len(pred) == 2
    assert pred.to_dict() == {"answer": "Paris", "confidence": 0.9}
    assert pred == {"answer": "Paris", "confidence": 0.9}
    assert (pred.usage.total_tokens, pred.raw[:10], pred.messages) == (
        5,
        '{"answer":',
        (Message("user", "q"),),
    )
    assert repr(pred) == "Prediction(answer='Paris', confidence=0.9)"


def test_keyword_construction_and_defaults():
    pred = Prediction(answer="x")
    assert pred.answer == "x" and pred.usage == Usage() and pred.raw == "" and pred.messages == ()


def test_unknown_field_lists_the_fields():
    with pytest.raises(AttributeError, match="no field 'anser'; its fields: answer, confidence"):
        make().anser  # noqa: B018
    with pytest.raises(KeyError):
        make()["anser"]


def test_read_only():
    pred = make()
    with pytest.raises(AttributeError, match="read-only"):
        pred.answer = "Rome"
    with pytest.raises(AttributeError, match="read-only"):
        del pred.raw
    with pytest.raises(TypeError):
        pred["answer"] = "Rome"  # type: ignore[index]


def test_a_field_named_like_an_attribute_is_reachable_by_key():
    pred = Prediction({"usage": "high", "raw": "r"})
    assert pred["usage"] == "high" and isinstance(pred.usage, Usage)


def test_copies_and_pickles():
    pred = make()
    for clone in (copy.copy(pred), copy.deepcopy(pred), pickle.loads(pickle.dumps(pred))):
        assert clone == pred and clone.usage == pred.usage and clone.messages == pred.messages
