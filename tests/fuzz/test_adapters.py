"""Model replies read by the JSON and chat-marker adapters and by typed outputs.

Whatever a model writes, `Predict.parse_response` gives the typed outputs or
a `StructuredOutputError` (which `Predict` shows the model in its re-ask),
the adapters' ``stream_fields`` give the fields of a reply still arriving,
and a typed reply (`output_type_for(T).parse`, what ``LLMInference`` with a
``response_format`` uses) gives a ``T`` or a `StructuredOutputError`.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel

import plait.functional as F
from plait.backends.types import Response
from plait.errors import StructuredOutputError
from plait.execution.structured import output_type_for
from plait.modules import Predict
from plait.optimization.updates import check_update, parse_leniently
from plait.signatures import (
    ChatAdapter,
    InputField,
    JSONAdapter,
    OutputField,
    PlainAdapter,
    Signature,
)

from .support import documents, fuzz, mutated_bytes, outcome


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


class Point(BaseModel):
    x: int
    y: int


class Extract(Signature):
    """Extract what the text says."""

    text: str = InputField()
    mood: Mood = OutputField()
    tags: list[str] = OutputField()
    point: Point = OutputField()
    ratio: float = OutputField()


SIGNATURES: list[Any] = [
    "question -> answer",
    "question -> answer: int",
    "text -> label: Literal['positive', 'negative']",
    "question -> reasoning, answer: list[str]",
    Extract,
]
ADAPTERS = [JSONAdapter(), ChatAdapter(), PlainAdapter()]
PREDICTS = [Predict(signature, adapter=adapter) for signature in SIGNATURES for adapter in ADAPTERS]

VALID_DATA = {
    "answer": "42",
    "label": "positive",
    "reasoning": "because",
    "mood": "happy",
    "tags": ["a", "b"],
    "point": {"x": 1, "y": 2},
    "ratio": 0.5,
}
VALID_CHAT = (
    "[[ ## reasoning ## ]]\nbecause\n\n[[ ## answer ## ]]\n- a\n- b\n\n"
    '[[ ## mood ## ]]\nHappy.\n\n[[ ## point ## ]]\n{"x": 1, "y": 2}\n\n'
    "[[ ## completed ## ]]"
)
CHAT_FRAGMENTS = (b"[[ ## ", b" ## ]]", b"[[ ## answer ## ]]", b"```json\n", b"```", b"{", b"}")


def as_text(data: bytes) -> str:
    """Returns bytes as a reply's text; bytes that are not UTF-8 become lone surrogates."""
    return data.decode("utf-8", "surrogateescape")


REPLIES = st.one_of(
    st.text(max_size=300),
    documents(VALID_DATA).map(as_text),
    documents(VALID_DATA).map(lambda data: f"Sure!\n```json\n{as_text(data)}\n```\nDone."),
    mutated_bytes(VALID_CHAT.encode(), CHAT_FRAGMENTS).map(as_text),
)
"""What a model may write: anything, or something near a JSON or chat-marker reply."""


@fuzz(600)
@given(predict=st.sampled_from(PREDICTS), text=REPLIES)
@example(predict=PREDICTS[0], text='{"answer": ' + "[" * 100_000)
def test_any_reply_gives_outputs_or_a_structured_output_error(predict: Predict, text: str) -> None:
    adapter = type(predict.adapter).__name__
    outcome(adapter, lambda: predict.parse_response(Response(text=text)))


@fuzz(300)
@given(adapter=st.sampled_from([JSONAdapter(), ChatAdapter()]), text=REPLIES, cut=st.integers(0))
def test_any_reply_still_arriving_gives_its_fields(
    adapter: JSONAdapter | ChatAdapter, text: str, cut: int
) -> None:
    partial = text[: cut % (len(text) + 1)]
    fields = outcome(
        f"{type(adapter).__name__} stream fields", lambda: adapter.stream_fields(partial)
    )
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items())


TARGETS: list[Any] = [Point, list[str], Literal["yes", "no"], int, dict[str, float], Mood]


@fuzz(400)
@given(target=st.sampled_from(TARGETS), text=REPLIES)
def test_any_reply_gives_the_typed_value_or_a_structured_output_error(
    target: Any, text: str
) -> None:
    outcome("typed reply", lambda: output_type_for(target).parse(text))


# -- what the fuzzing found, pinned ---------------------------------------------------------

NESTED = "[" * 100_000
"""JSON nested far past the interpreter's recursion limit (a reply stuck in a loop)."""


@pytest.mark.parametrize(
    ("signature", "adapter", "reply"),
    [
        ("question -> answer: int", JSONAdapter(), '{"answer": ' + NESTED),
        ("question -> answer: list[str]", JSONAdapter(), NESTED),
        ("question -> answer: int", ChatAdapter(), "[[ ## answer ## ]]\n" + NESTED),
        ("question -> reasoning, answer", ChatAdapter(), 'Here: {"reasoning": ' + NESTED + "}"),
    ],
    ids=["json object", "json bare value", "chat section", "chat fallback to json"],
)
def test_a_reply_nested_too_deeply_is_a_structured_output_error(
    signature: str, adapter: Any, reply: str
) -> None:
    predict = Predict(signature, adapter=adapter)
    with pytest.raises(StructuredOutputError, match="answer"):
        predict.parse_response(Response(text=reply))


def test_a_typed_reply_nested_too_deeply_is_a_structured_output_error() -> None:
    with pytest.raises(StructuredOutputError, match="nested too deeply"):
        output_type_for(Point).parse(NESTED)


class Proposal(BaseModel):
    instruction: str


OLD_VALUES: list[Any] = ["Answer briefly.", ["demo one", "demo two"], {"k": 1}]


@fuzz(300)
@given(old=st.sampled_from(OLD_VALUES), text=REPLIES)
def test_any_optimizer_proposal_is_taken_or_refused_with_a_reason(old: Any, text: str) -> None:
    value, reason = outcome("optimizer proposal", lambda: check_update(old, text, 0.0))
    assert (value is None) != (reason is None)
    parsed = outcome("optimizer proposal", lambda: parse_leniently(text, Proposal))
    assert parsed is None or isinstance(parsed, Proposal)


def test_an_optimizer_proposal_nested_too_deeply_is_refused() -> None:
    assert check_update(["demo"], NESTED, 0.0) == (
        None,
        "the new value is not valid JSON (the parameter holds a JSON list)",
    )
    assert parse_leniently('{"instruction": ' + NESTED, Proposal) is None


def test_f_parse_structured_of_text_nested_too_deeply_says_no_json_was_found() -> None:
    value = F.parse_structured(NESTED)
    assert value.is_error
    assert isinstance(value.payload, ValueError)
    assert "no JSON object or array found" in str(value.payload)
