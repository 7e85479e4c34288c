"""Structured outputs: type → JSON schema on the wire → validated, typed result (one re-ask)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from pydantic import BaseModel

import plait.functional as F
from plait import LLMInference, Module, ResourceManager, ValueKind, run
from plait.errors import StructuredOutputError
from plait.execution.llm_call import call_llm
from plait.execution.structured import output_type_for

from .support import Ask, user_of


class Verdict(BaseModel):
    label: Literal["spam", "ham"]
    confidence: float


@dataclass
class Point:
    x: int
    y: int


# --------------------------------------------------------------- schemas


def test_object_types_go_on_the_wire_as_they_are():
    verdict = output_type_for(Verdict)
    assert not verdict.wrapped
    assert verdict.schema.name == "Verdict"
    assert verdict.schema.schema["properties"]["label"]["enum"] == ["spam", "ham"]
    assert set(verdict.schema.schema["required"]) == {"label", "confidence"}

    point = output_type_for(Point)
    assert not point.wrapped and point.schema.schema["type"] == "object"


@pytest.mark.parametrize("target", [list[str], Literal["a", "b"], int])
def test_other_types_are_wrapped_in_an_object(target):
    output = output_type_for(target)
    assert output.wrapped
    schema = output.schema.schema
    assert schema["type"] == "object" and schema["required"] == ["value"]
    assert all(ch.isalnum() or ch in "_-" for ch in output.schema.name)


def test_parse_accepts_the_wrapper_the_bare_value_and_code_fences():
    tags = output_type_for(list[str])
    assert tags.parse('{"value": ["a", "b"]}') == ["a", "b"]
    assert tags.parse('["a", "b"]') == ["a", "b"]
    assert tags.parse('Here:\n```json\n{"value": ["c"]}\n```') == ["c"]
    assert output_type_for(Point).parse('{"x": 1, "y": 2}') == Point(1, 2)


def test_parse_errors_say_what_was_wrong_and_where():
    verdict = output_type_for(Verdict)
    with pytest.raises(StructuredOutputError, match="not valid JSON for Verdict") as info:
        verdict.parse("I think it is spam")
    assert (info.value.raw, info.value.target) == ("I think it is spam", "Verdict")

    with pytest.raises(StructuredOutputError, match=r"does not match Verdict: label: Input"):
        verdict.parse('{"label": "eggs", "confidence": 0.5}')
    with pytest.raises(StructuredOutputError, match=r"confidence: Field required"):
        verdict.parse('{"label": "spam"}')


def test_a_type_without_a_json_schema_is_refused():
    class Opaque:
        pass

    with pytest.raises(TypeError, match=r"response_format Opaque cannot be described"):
        output_type_for(Opaque)


# ------------------------------------------------------ through the server

REPLIES = {
    "Verdict": '{"label": "spam", "confidence": 0.9}',
    "Point": '{"x": 3, "y": 4}',
}


def schema_responder(body: dict[str, Any]) -> str:
    """Answers valid JSON for the schema the request carries."""
    spec = body["response_format"]["json_schema"]
    if spec["name"] in REPLIES:
        return REPLIES[spec["name"]]
    value = spec["schema"]["properties"]["value"]
    if value.get("type") == "array":
        return json.dumps({"value": ["red", "green"]})
    return json.dumps({"value": value["enum"][-1]})  # a Literal


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (Verdict, Verdict(label="spam", confidence=0.9)),
        (Point, Point(3, 4)),
        (list[str], ["red", "green"]),
        (Literal["low", "high"], "high"),
    ],
)
async def test_typed_results_through_the_server(server, manager, target, expected):
    server.responder = schema_responder

    out = await run(Ask(response_format=target), "classify this", resources=manager)

    assert out == expected and type(out) is type(expected)
    body = server.stats.log[0].body
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == output_type_for(target).schema.schema


class Triage(Module):
    """A typed result flows into an op and into the next call."""

    def __init__(self) -> None:
        super().__init__()
        self.classify = LLMInference(alias="llm", response_format=Verdict)
        self.reply = LLMInference(alias="llm")

    def forward(self, email: str) -> dict[str, Any]:
        verdict = self.classify(email)
        label = F.select(verdict, "label")
        return {"label": label, "reply": self.reply(f"Write a {label} reply to: {email}")}


async def test_a_typed_result_feeds_ops_and_later_calls(server, manager):
    def responder(body: dict[str, Any]) -> str:
        if "response_format" in body:
            return REPLIES["Verdict"]
        return "echo: " + user_of(body)

    server.responder = responder

    out = await run(Triage(), "win money", resources=manager)

    assert out == {"label": "spam", "reply": "echo: Write a spam reply to: win money"}


def replies_in_turn(*texts: str):
    answers = iter(texts)

    def responder(body: dict[str, Any]) -> str:
        return next(answers)

    return responder


async def test_an_invalid_reply_is_re_asked_once_with_the_error(server, manager):
    server.responder = replies_in_turn("Spam, surely.", REPLIES["Verdict"])
    module = LLMInference(alias="llm", response_format=Verdict)

    value = await call_llm(module, "win money", manager)

    assert (value.kind, value.payload) == (
        ValueKind.STRUCTURED,
        Verdict(label="spam", confidence=0.9),
    )
    assert value.meta["reasked"] is True
    first, second = (r.body for r in server.stats.log)
    assert second["messages"][: len(first["messages"])] == first["messages"]
    assistant, feedback = second["messages"][len(first["messages"]) :]
    assert assistant == {"role": "assistant", "content": "Spam, surely."}
    assert feedback["role"] == "user"
    assert "reply is not valid JSON for Verdict" in feedback["content"]
    assert second["response_format"] == first["response_format"]
    # usage of both requests is counted in the result
    assert value.meta["output_tokens"] == 2 + len(REPLIES["Verdict"].split())


async def test_a_reply_still_invalid_after_the_re_ask_fails_naming_alias_and_type(server, manager):
    server.responder = replies_in_turn('{"label": "eggs", "confidence": 1}', "still not JSON")

    with pytest.raises(StructuredOutputError, match=r"alias 'llm'.*not a valid Verdict") as info:
        await run(Ask(response_format=Verdict), "win money", resources=manager)

    cause = info.value
    assert cause.__notes__ == ["ask failed"]
    assert isinstance(cause, StructuredOutputError)
    assert (cause.target, cause.raw) == ("Verdict", "still not JSON")
    assert "label: Input should be 'spam' or 'ham'" in user_of(server.stats.log[1].body)
    assert server.stats.requests == 2


# ------------------------------------------------------ the embedded model


class City(BaseModel):
    name: str
    country: str


@pytest.mark.slow
async def test_the_local_model_returns_a_validated_object():
    program = Ask(response_format=City, temperature=0.0, max_tokens=32)
    async with ResourceManager({"llm": {"provider": "local"}}) as manager:
        out = await run(program, "Name a city in France.", resources=manager)
        usage = manager.usage()["llm"]

    assert isinstance(out, City)
    assert out.name and out.country
    assert 0 < usage.output_tokens <= 2 * 32  # at most one re-ask
