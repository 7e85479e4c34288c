"""Adapters: the exact messages they write, and how they read replies (strictly and leniently)."""

import enum
from typing import Literal

import pytest
from pydantic import BaseModel

from plait.backends.types import Message, Response
from plait.errors import StructuredOutputError
from plait.signatures import (
    Adapter,
    ChatAdapter,
    InputField,
    JSONAdapter,
    OutputField,
    PlainAdapter,
    Signature,
    format_value,
)


class Rate(Signature):
    """Rate how well the answer fits the question."""

    question: str = InputField(description="What was asked")
    answer: str = InputField()
    verdict: Literal["good", "bad"] = OutputField(description="The judgement")
    score: int = OutputField()


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


class Point(BaseModel):
    x: int
    y: int


class Typed(Signature):
    """Extract."""

    text: str = InputField()
    mood: Mood = OutputField()
    tags: list[str] = OutputField()
    point: Point = OutputField()
    ratio: float = OutputField()


DEMOS = [
    {"question": "2+2?", "answer": "4", "verdict": "good", "score": 5},
    {"question": "no outputs: skipped"},
]
HISTORY = [
    Message("system", "You are strict."),
    Message("user", "hello"),
    Message("assistant", "hi"),
]
INPUTS = {"question": "Capital of France?", "answer": "Paris"}


def transcript(messages: tuple[Message, ...]) -> str:
    return "\n".join(f"--- {m.role}\n{m.content}" for m in messages)


def reply(text: str) -> Response:
    return Response(text=text)


def test_both_adapters_satisfy_the_protocol():
    assert isinstance(JSONAdapter(), Adapter)
    assert isinstance(ChatAdapter(), Adapter)


# ------------------------------------------------------------------ JSON
def test_json_adapter_messages_with_demos_and_history():
    messages = JSONAdapter().format(Rate, INPUTS, demos=DEMOS, history=HISTORY)
    assert (
        transcript(messages)
        == """\
--- system
You are strict.

Rate how well the answer fits the question.

Input fields:
- question (str): What was asked
- answer (str)

Output fields:
- verdict (one of: good, bad): The judgement
- score (int)

Reply with a JSON object with the keys: "verdict", "score".
--- user
question: 2+2?
answer: 4
--- assistant
{"verdict": "good", "score": 5}
--- user
hello
--- assistant
hi
--- user
question: Capital of France?
answer: Paris"""
    )


def test_json_adapter_formats_structured_inputs_as_json():
    sig = Signature.from_string("items: list[int], note -> total: int")
    (_, user) = JSONAdapter().format(sig, {"items": [1, 2], "note": "sum"})
    assert user.content == "items: [1, 2]\nnote: sum"
    assert format_value(Mood.HAPPY) == "happy"
    assert format_value(Point(x=1, y=2)) == '{"x": 1, "y": 2}'


def test_json_adapter_asks_for_the_output_schema():
    schema = JSONAdapter().response_schema(Rate)
    assert schema.name == "RateOutput"
    assert schema.schema["required"] == ["verdict", "score"]
    assert schema.schema["properties"]["verdict"]["enum"] == ["good", "bad"]


def test_json_adapter_parses_typed_outputs():
    text = (
        '{"mood": "sad", "tags": ["a", "b"], "point": {"x": 1, "y": "2"}, "ratio": 0.5, "extra": 1}'
    )
    out = JSONAdapter().parse(Typed, reply(text))
    assert out == {"mood": Mood.SAD, "tags": ["a", "b"], "point": Point(x=1, y=2), "ratio": 0.5}


@pytest.mark.parametrize(
    "text",
    [
        '{"verdict": "good", "score": 4}',
        '```json\n{"verdict": "good", "score": "4"}\n```',
        'Sure! Here it is: {"verdict": "Good.", "score": 4} Hope that helps.',
    ],
)
def test_json_adapter_is_lenient_about_fences_prose_and_case(text):
    assert JSONAdapter().parse(Rate, reply(text)) == {"verdict": "good", "score": 4}


def test_json_adapter_takes_a_bare_value_for_one_output_field():
    sig = Signature.from_string("q -> answer: int")
    assert JSONAdapter().parse(sig, reply("42")) == {"answer": 42}
    assert JSONAdapter().parse(sig, reply('{"answer": 7}')) == {"answer": 7}
    text_sig = Signature.from_string("q -> answer")
    assert JSONAdapter().parse(text_sig, reply("Paris, France")) == {"answer": "Paris, France"}


def test_json_adapter_errors_name_the_field():
    adapter = JSONAdapter()
    with pytest.raises(
        StructuredOutputError, match="field `score`: Input should be a valid integer"
    ) as info:
        adapter.parse(Rate, reply('{"verdict": "good", "score": "high"}'))
    assert info.value.target == "Rate" and "high" in info.value.raw
    with pytest.raises(StructuredOutputError, match="field `verdict` is missing"):
        adapter.parse(Rate, reply('{"score": 1}'))
    with pytest.raises(StructuredOutputError, match="field `point` at y: Input should be"):
        adapter.parse(
            Typed, reply('{"mood": "sad", "tags": [], "point": {"x": 1, "y": "?"}, "ratio": 1}')
        )
    with pytest.raises(StructuredOutputError, match="not a JSON object with the fields `verdict`"):
        adapter.parse(Rate, reply("good, 4"))
    with pytest.raises(StructuredOutputError, match="is a JSON list"):
        adapter.parse(Rate, reply("[1, 2]"))


# ------------------------------------------------------------------ chat
def test_chat_adapter_messages_with_demos_and_history():
    messages = ChatAdapter().format(Rate, INPUTS, demos=DEMOS[:1], history=HISTORY[1:])
    assert ChatAdapter().response_schema(Rate) is None
    assert (
        transcript(messages)
        == """\
--- system
Rate how well the answer fits the question.

Input fields:
- question (str): What was asked
- answer (str)

Output fields:
- verdict (one of: good, bad): The judgement
- score (int)

Reply with each output field under its header, in this order, then end with [[ ## completed ## ]]:

[[ ## verdict ## ]]
{verdict: one of good, bad}

[[ ## score ## ]]
{score: int}

[[ ## completed ## ]]
--- user
[[ ## question ## ]]
2+2?

[[ ## answer ## ]]
4
--- assistant
[[ ## verdict ## ]]
good

[[ ## score ## ]]
5

[[ ## completed ## ]]
--- user
hello
--- assistant
hi
--- user
[[ ## question ## ]]
Capital of France?

[[ ## answer ## ]]
Paris

Respond with [[ ## verdict ## ]], [[ ## score ## ]], then [[ ## completed ## ]]."""
    )


def test_chat_adapter_parses_marked_sections():
    text = "[[ ## verdict ## ]]\nGood\n\n[[## score ##]]\n 4 \n\n[[ ## completed ## ]]"
    assert ChatAdapter().parse(Rate, reply(text)) == {"verdict": "good", "score": 4}


def test_chat_adapter_reads_json_lists_lines_and_models():
    text = (
        "[[ ## mood ## ]]\nHappy\n[[ ## tags ## ]]\n- red\n- blue\n"
        '[[ ## point ## ]]\n```json\n{"x": 1, "y": 2}\n```\n[[ ## ratio ## ]]\n0.25'
    )
    out = ChatAdapter().parse(Typed, reply(text))
    assert out == {
        "mood": Mood.HAPPY,
        "tags": ["red", "blue"],
        "point": Point(x=1, y=2),
        "ratio": 0.25,
    }
    comma = text.replace("- red\n- blue", "red, blue")
    assert ChatAdapter().parse(Typed, reply(comma))["tags"] == ["red", "blue"]


def test_chat_adapter_one_field_without_markers_is_the_whole_text():
    sig = Signature.from_string("question -> answer")
    assert ChatAdapter().parse(sig, reply("  Paris is the capital.  ")) == {
        "answer": "Paris is the capital."
    }
    number = Signature.from_string("question -> count: int")
    assert ChatAdapter().parse(number, reply("3")) == {"count": 3}


def test_chat_adapter_accepts_a_json_object_reply():
    assert ChatAdapter().parse(Rate, reply('{"verdict": "bad", "score": 1}')) == {
        "verdict": "bad",
        "score": 1,
    }


def test_chat_adapter_errors_name_the_missing_or_invalid_field():
    with pytest.raises(StructuredOutputError, match=r"no section for field\(s\) `score`"):
        ChatAdapter().parse(Rate, reply("[[ ## verdict ## ]]\ngood"))
    with pytest.raises(
        StructuredOutputError, match="field `verdict`: Input should be 'good' or 'bad'"
    ):
        ChatAdapter().parse(Rate, reply("[[ ## verdict ## ]]\nmeh\n[[ ## score ## ]]\n2"))


# ------------------------------------------------------------------ plain
class Judge(Signature):
    """Evaluate the boolean expression."""

    expression: str = InputField()
    answer: Literal["True", "False"] = OutputField()


class Sort(Signature):
    """Sort the words."""

    words: str = InputField()
    sorted_words: str = OutputField()


def test_plain_adapter_sends_bare_text_and_bare_demo_replies():
    adapter = PlainAdapter()
    assert isinstance(adapter, Adapter)
    messages = adapter.format(
        Judge,
        {"expression": "not True is"},
        demos=[{"expression": "True and True is", "answer": "True"}],
    )
    assert messages == (
        Message("system", "Evaluate the boolean expression."),
        Message("user", "True and True is"),
        Message("assistant", "True"),
        Message("user", "not True is"),
    )
    # A choice keeps its schema (the local backend decodes the bare label); text has none.
    assert adapter.response_schema(Judge).schema["properties"]["answer"]["enum"] == [
        "True",
        "False",
    ]
    assert adapter.response_schema(Sort) is None
    assert adapter.parse(Judge, Response(text="False")) == {"answer": "False"}
    assert adapter.parse(Judge, Response(text='{"answer": "True"}')) == {"answer": "True"}
    assert adapter.parse(Sort, Response(text="a b c")) == {"sorted_words": "a b c"}


def test_plain_adapter_handles_other_signatures_as_json():
    plain, json_adapter = PlainAdapter(), JSONAdapter()
    inputs = {"question": "q", "answer": "a"}
    assert plain.format(Rate, inputs) == json_adapter.format(Rate, inputs)
    assert plain.response_schema(Rate) == json_adapter.response_schema(Rate)
