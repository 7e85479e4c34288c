"""Human in the loop (seed 003 "Confirmation"): pause before a tool, resume where it stopped.

The scripted model asks for a tool call, then answers from the tool result;
each test asserts on the requests the server saw, so "without re-asking the
model for the steps already taken" is checked, not assumed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from plait import (
    ConfirmationRequired,
    LLMInference,
    Module,
    Predict,
    Prediction,
    ReAct,
    ResourceConfig,
    ResumeState,
    ToolCallEvent,
    ToolResultEvent,
    confirm_first,
    tool,
)
from plait.errors import PlaitError
from plait.testing import ScriptedServer

from .scripted import all_text


def make_agent(notes: Path) -> ReAct:
    @tool(require_confirmation=True)
    def write_note(text: str) -> str:
        """Writes a note to the notes file (a side effect)."""
        with notes.open("a") as file:
            file.write(text + "\n")
        return f"saved: {text}"

    @tool
    def clock() -> str:
        """Returns the time."""
        return "12:00"

    return ReAct("request -> answer", tools=[write_note, clock])


def agent_responder(body: dict[str, Any]) -> Any:
    """First turn: call write_note (and clock); then answer from what the tools said."""
    tool_turns = [m for m in body["messages"] if m["role"] == "tool"]
    if not tool_turns:
        return {
            "content": "I will save it.",
            "tool_calls": [
                {"name": "write_note", "arguments": {"text": "buy milk"}},
                {"name": "clock", "arguments": {}},
            ],
        }
    results = " / ".join(m["content"] for m in tool_turns)
    return json.dumps({"answer": results})


def config_of(server: ScriptedServer) -> ResourceConfig:
    return ResourceConfig({"*": server.endpoint(max_retries=0)})


async def pause(agent: ReAct, server: ScriptedServer) -> ConfirmationRequired:
    with pytest.raises(ConfirmationRequired) as paused:
        await agent.bind(config_of(server))(request="note: buy milk")
    return paused.value


async def test_a_tool_needing_confirmation_pauses_and_yes_runs_it_without_reasking(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "notes.txt"
    async with ScriptedServer(responder=agent_responder) as server:
        agent = make_agent(notes)
        pending = await pause(agent, server)
        assert pending.tool_name == "write_note" and pending.arguments == {"text": "buy milk"}
        assert "write_note" in pending.question and not notes.exists()
        assert server.stats.requests == 1

        result = await agent(request="note: buy milk", resume_state=ResumeState(pending, "yes"))
    assert notes.read_text() == "buy milk\n"
    assert result.answer == "saved: buy milk / 12:00"
    assert server.stats.requests == 2  # the first turn was not asked again
    assert [step.tool for step in result.trajectory] == ["write_note", "clock"]


async def test_no_is_shown_to_the_model_as_the_tool_result(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    async with ScriptedServer(responder=agent_responder) as server:
        agent = make_agent(notes)
        pending = await pause(agent, server)
        result = await agent(
            request="note: buy milk", resume_state=ResumeState(pending, "no, not today")
        )
        last = server.stats.log[-1].body
    assert not notes.exists()
    assert "declined" in result.answer and "not today" in all_text(last)
    assert result.trajectory[0].ok is False


async def test_edited_arguments_run_instead_of_the_models(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    async with ScriptedServer(responder=agent_responder) as server:
        agent = make_agent(notes)
        pending = await pause(agent, server)
        await agent(
            request="note: buy milk",
            resume_state=ResumeState(pending, '{"text": "buy oat milk"}'),
        )
    assert notes.read_text() == "buy oat milk\n"


def repeating_responder(body: dict[str, Any]) -> Any:
    """A model stuck on one call (as SmolLM2 is): every turn with tools asks for it again."""
    if body.get("tools"):
        return {"tool_calls": [{"name": "write_note", "arguments": {"text": "buy milk"}}]}
    return json.dumps({"answer": "done"})  # the extraction call, made without tools


@pytest.mark.parametrize(
    ("answer", "saved", "told"),
    [("yes", "buy milk\n", "already ran"), ("no", None, "already declined")],
)
async def test_a_call_the_person_already_answered_is_not_asked_about_or_run_again(
    tmp_path: Path, answer: str, saved: str | None, told: str
) -> None:
    notes = tmp_path / "notes.txt"
    async with ScriptedServer(responder=repeating_responder) as server:
        agent = ReAct("request -> answer", tools=make_agent(notes).tools.values(), max_iters=3)
        pending = await pause(agent, server)
        result = await agent(request="note: buy milk", resume_state=ResumeState(pending, answer))
        last_turn = server.stats.log[-2].body  # the last turn with tools, before the extraction
    assert (notes.read_text() if notes.exists() else None) == saved  # once, or never
    assert [step.tool for step in result.trajectory] == ["write_note"] * 3
    repeats = result.trajectory[1:]
    assert all(not step.ok and step.error == "repeated" for step in repeats)
    assert told in repeats[0].result and told in all_text(last_turn)  # the model is told why
    assert result.answer == "done"


async def test_the_pause_travels_as_json_and_resumes_in_a_fresh_agent(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    async with ScriptedServer(responder=agent_responder) as server:
        pending = await pause(make_agent(notes), server)
        stored = ResumeState(pending, "yes").to_json()  # e.g. kept by a web server
        json.loads(stored)

        fresh = make_agent(notes).bind(config_of(server))  # another request, another process
        result = await fresh(resume_state=ResumeState.from_json(stored))  # inputs come along
    assert result.answer == "saved: buy milk / 12:00" and server.stats.requests == 2
    with pytest.raises(ValueError, match="not a plait"):
        ConfirmationRequired.from_json('{"question": "x"}')


async def test_streaming_ends_with_a_non_final_prediction_then_resumes_streaming(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "notes.txt"
    async with ScriptedServer(responder=agent_responder) as server:
        agent = make_agent(notes).bind(config_of(server))
        events = [event async for event in agent.astream(request="note: buy milk")]
        pending = events[-1]
        assert isinstance(pending, Prediction) and pending.is_final is False
        assert [call.name for call in pending.native_tool_calls] == ["write_note", "clock"]
        assert isinstance(pending.confirmation, ConfirmationRequired)

        resumed = [
            event
            async for event in agent.astream(
                request="note: buy milk", resume_state=ResumeState(pending.confirmation, "yes")
            )
        ]
    calls = [e.tool_name for e in resumed if isinstance(e, ToolCallEvent)]
    results = [e.content for e in resumed if isinstance(e, ToolResultEvent)]
    assert calls == ["write_note"] and results == ["saved: buy milk"]  # clock ran before the pause
    assert resumed[-1].is_final and resumed[-1].answer == "saved: buy milk / 12:00"


async def test_a_resume_state_that_no_module_claims_is_an_error(tmp_path: Path) -> None:
    async with ScriptedServer(responder=agent_responder) as server:
        pending = await pause(make_agent(tmp_path / "n.txt"), server)
        other = LLMInference("llm").bind(config_of(server))
        with pytest.raises(PlaitError, match="no module of this program resumed it"):
            await other("x", resume_state=ResumeState(pending, "yes"))


class Wrapper(Module):
    """A composite around the agent: the pause and the resume pass through it."""

    def __init__(self, notes: Path) -> None:
        super().__init__()
        self.agent = make_agent(notes)

    def forward(self, request: str) -> Any:
        return self.agent(request=request)


async def test_a_pause_inside_a_composite_program_resumes_through_it(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    async with ScriptedServer(responder=agent_responder) as server:
        program = Wrapper(notes).bind(config_of(server))
        with pytest.raises(ConfirmationRequired) as paused:
            await program("note: buy milk")
        assert paused.value.context["module"] == "agent"
        result = await program("note: buy milk", resume_state=ResumeState(paused.value, "yes"))
    assert result.answer.startswith("saved: buy milk") and notes.exists()


async def test_confirm_first_marks_a_function_as_needing_approval(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"

    @confirm_first
    def write_note(text: str) -> str:
        """Writes a note."""
        notes.write_text(text)
        return "done"

    with pytest.raises(ConfirmationRequired, match="write_note"):
        write_note(text="x")  # called directly, outside any approval
    agent = ReAct("request -> answer", tools=[write_note])
    assert agent.tools["write_note"].require_confirmation
    async with ScriptedServer(responder=agent_responder) as server:
        with pytest.raises(ConfirmationRequired):
            await agent.bind(config_of(server))(request="note")
    assert not notes.exists()


async def test_predict_with_tools_and_no_auto_execution_does_one_step() -> None:
    @tool
    def lookup(city: str) -> int:
        """Population of a city."""
        return 2_100_000

    replies = iter(
        [
            {"content": "", "tool_calls": [{"name": "lookup", "arguments": {"city": "Paris"}}]},
            '{"answer": "2100000"}',
        ]
    )
    async with ScriptedServer(responder=lambda body: next(replies)) as server:
        step = Predict("question -> answer", tools=[lookup]).bind(config_of(server))
        first = await step(question="How many people live in Paris?", auto_execute_tools=False)
        assert first.is_final is False and first.native_tool_calls[0].name == "lookup"
        body = server.stats.log[0].body
        assert [t["function"]["name"] for t in body["tools"]] == ["lookup"]
        second = await step(question="How many people live in Paris?", auto_execute_tools=False)
    assert second.is_final and second.answer == "2100000"
