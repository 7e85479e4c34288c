"""How the local backend plans a request, without the model: label choices in particular."""

from __future__ import annotations

import enum
import json
from typing import Literal

import pytest

from plait import InputField, OutputField, Signature
from plait.backends.local._prompt import ChatTurns, LabelChoice, build_plan
from plait.backends.types import Message, Request, ResponseSchema, ToolCall
from plait.execution.structured import output_type_for


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


class Verdict(Signature):
    """Say whether the sentence is plausible."""

    sentence: str = InputField()
    answer: Literal["yes", "no"] = OutputField()


def request_for(schema: dict) -> Request:
    return Request(
        messages=(Message("user", "hi"),), response_schema=ResponseSchema("choice", schema)
    )


@pytest.mark.parametrize(
    ("target", "key", "values"),
    [
        (Literal["True", "False"], "value", ("True", "False")),
        (Colour, "value", ("red", "green")),
        (Literal[1, 2, 3], "value", (1, 2, 3)),
        (Verdict.output_model(), "answer", ("yes", "no")),
    ],
)
def test_a_schema_of_one_enum_field_is_decoded_as_a_bare_label(target, key, values) -> None:
    plan = build_plan(request_for(output_type_for(target).schema.schema), seed=0)
    assert plan.mode == "label"
    assert plan.labels == LabelChoice(key, values)
    assert "response_format" not in plan.options
    first = values[0]
    text, calls = plan.read_reply(first if isinstance(first, str) else json.dumps(first))
    assert calls == () and json.loads(text) == {key: first}
    # The wrapped reply parses as the type asked for.
    if target is not Verdict.output_model():
        assert output_type_for(target).parse(text) == (Colour(first) if target is Colour else first)


def test_other_schemas_keep_the_json_grammar() -> None:
    for target in (str, list[str], dict[str, int]):
        plan = build_plan(request_for(output_type_for(target).schema.schema), seed=0)
        assert plan.mode == "schema" and "response_format" in plan.options
    two_fields = {
        "type": "object",
        "properties": {"a": {"enum": ["x"]}, "b": {"enum": ["y"]}},
        "required": ["a", "b"],
    }
    assert build_plan(request_for(two_fields), seed=0).mode == "schema"
    optional = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}}
    assert build_plan(request_for(optional), seed=0).mode == "schema"


def test_label_grammar_escapes_quotes_backslashes_and_controls() -> None:
    choice = LabelChoice("value", ('say "hi"', "a\\b", "tab\there"))
    assert choice.grammar() == r'root ::= "say \"hi\"" | "a\\b" | "tab\x09here"'


def test_a_cut_off_label_is_given_back_as_text_that_fails_validation() -> None:
    plan = build_plan(request_for(output_type_for(Literal["True", "False"]).schema.schema), seed=0)
    text, _ = plan.read_reply("Tr")
    assert json.loads(text) == {"value": "Tr"}


def test_a_count_may_follow_a_few_words_and_end_with_one_mark() -> None:
    counts = LabelChoice("value", tuple(str(n) for n in range(21)))
    assert counts.counts
    grammar = counts.grammar()
    assert grammar.startswith('root ::= lead? ("0" | "1" |') and grammar.endswith(
        '"20") [^0-9]?\nlead ::= [^0-9\\n]{1,60}'
    )
    assert json.loads(counts.as_json("There are 3.")) == {"value": "3"}
    assert json.loads(counts.as_json("10")) == {"value": "10"}
    numbers = LabelChoice("value", (1, 2, 3))
    assert json.loads(numbers.as_json("It is 2\n")) == {"value": 2}
    assert json.loads(numbers.as_json("It is")) == {"value": "It is"}  # cut off: fails validation
    # Word labels stay bare: no lead-in that could hide a label among words.
    assert not LabelChoice("value", ("True", "False")).counts
    assert LabelChoice("value", ("True", "False")).grammar() == 'root ::= "True" | "False"'


def test_turns_a_chat_format_does_not_show_become_user_turns() -> None:
    call = ToolCall("call_1", "weather", '{"city": "Oslo"}')
    conversation = (
        Message("system", "Answer in French."),
        Message("user", "Weather in Oslo?"),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", "snow", tool_call_id="call_1", name="weather"),
    )
    plan = build_plan(Request(messages=conversation), seed=0)
    shown = plan.chat_messages(ChatTurns(system=False, tool_results=False))
    assert [m["role"] for m in shown] == ["user", "assistant", "user"]
    assert shown[0]["content"] == "Answer in French.\n\nWeather in Oslo?"
    assert shown[2]["content"] == "Tool result: snow"
    assert plan.chat_messages(ChatTurns()) == [  # a format that shows them all
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Weather in Oslo?"},
        shown[1],
        {"role": "tool", "content": "snow", "tool_call_id": "call_1"},
    ]
