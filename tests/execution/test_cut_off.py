"""A reply cut off at max_tokens fails its own step, naming the field, the limit and the fix.

The scripted server answers with ``finish_reason: "length"`` and the unfinished text a
model leaves when its limit strikes: inside a forced tool call's argument, inside a typed
reply's field.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from modules.scripted import bodies, scripted
from plait import LLMInference, Predict, ReAct, run, tool
from plait.errors import ReplyCutOffError, StructuredOutputError
from plait.execution.cut_off import open_field


@tool
def search(query: str, limit: int = 3) -> str:
    """Searches the notes."""
    return f"found {limit} notes about {query}"


def rambling_call(body: dict[str, Any]) -> dict[str, Any]:
    """A small model that rambles inside the forced call's argument until cut off."""
    arguments = '{"limit": 2, "query": "the user wants to know about the thing and also'
    call = {"id": "call_1", "name": "search", "arguments": arguments}
    return {"tool_calls": [call], "finish_reason": "length", "usage": {"completion_tokens": 32}}


async def test_an_agent_fails_at_the_turn_whose_forced_tool_call_was_cut_off() -> None:
    async with scripted(rambling_call) as (server, manager):
        agent = ReAct(
            "question -> answer", tools=[search], first_tool_choice="search", max_tokens=32
        ).bind(manager)
        with pytest.raises(ReplyCutOffError) as caught:
            await agent(question="What do my notes say?")
    error = caught.value
    assert (error.tool, error.field, error.limit) == ("search", "query", 32)
    message = str(error)
    assert message.startswith("ReAct (question -> answer): the reply was cut off")
    assert "max_tokens=32 (32 tokens)" in message
    assert "argument 'query' of a call of tool 'search'" in message
    assert "raise max_tokens above 32" in message and "Field(max_length=" in message
    assert "the user wants" not in message  # plait's own words only
    assert len(bodies(server)) == 1  # no extraction call made from the remains


def rambling_text(body: dict[str, Any]) -> dict[str, Any]:
    """The same, from a server that gives an unfinished forced call back as text."""
    return {"content": '{"query": "the user wants to know', "finish_reason": "length"}


async def test_a_forced_call_returned_as_unfinished_text_is_named_as_that_tools() -> None:
    async with scripted(rambling_text) as (_, manager):
        agent = ReAct(
            "question -> answer", tools=[search], first_tool_choice="search", max_tokens=8
        ).bind(manager)
        with pytest.raises(ReplyCutOffError, match="argument 'query' of a call of tool 'search'"):
            await agent(question="What do my notes say?")


class Ticket(BaseModel):
    title: str
    summary: str


def cut_in_summary(body: dict[str, Any]) -> dict[str, Any]:
    text = '{"title": "Printer", "summary": "It all began on a Tuesday when'
    return {"content": text, "finish_reason": "length"}


async def test_a_typed_reply_cut_off_names_the_field_after_the_re_ask() -> None:
    async with scripted(cut_in_summary) as (server, manager):
        program = LLMInference("llm", response_format=Ticket, max_tokens=40)
        with pytest.raises(ReplyCutOffError, match="field 'summary'") as caught:
            await run(program, "the printer is broken", resources=manager)
    assert isinstance(caught.value, StructuredOutputError)  # still caught as before
    assert caught.value.limit == 40 and "alias 'llm'" in str(caught.value)
    second = bodies(server)[1]["messages"][-1]["content"]
    assert "keep it shorter" in second and "Field(" not in second  # the model is told briefly


async def test_a_signature_field_cut_off_in_predict_is_named() -> None:
    async with scripted(cut_in_summary) as (_, manager):
        predict = Predict("report -> title, summary").bind(manager)
        with pytest.raises(ReplyCutOffError) as caught:
            await predict(report="broken")
    assert caught.value.field == "summary"
    assert "the provider's default max_tokens" in str(caught.value)


def test_only_known_names_are_named() -> None:
    assert open_field('{"a": {"b": "unfini', {"a", "b"}) == "a.b"
    assert open_field('{"a": "done", "b": [1, {"c": "x', {"a", "b", "c"}) == "b.c"
    assert open_field('{"a": "x\\" y", "secret": "pro', {"a"}) == ""
    assert open_field('{"a": "done", ', {"a"}) == ""
    assert open_field("[[ ## answer ## ]]\nIt was", {"answer"}) == "answer"
    assert open_field("plain text", {"answer"}) == ""
