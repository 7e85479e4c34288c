"""Seed 003's own snippets for streaming, confirmation, callbacks and settings, run on plait.

Each snippet is the seed's, with only the changes plait's resources need, said in
a comment: ``lm=`` gets an endpoint of the scripted server instead of an OpenAI
key. A call made from synchronous code runs to completion there, as in udspy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import plait
from execution.support import server_in_thread
from plait import (
    BaseCallback,
    ConfirmationRequired,
    OutputStreamChunk,
    Predict,
    Prediction,
    ReAct,
    ResumeState,
    StreamEvent,
    ToolCallEvent,
    ToolResultEvent,
    confirm_first,
    emit_event,
    tool,
)
from plait.testing import ScriptedServer


@pytest.fixture(autouse=True)
def _reset_settings():
    yield
    plait.settings.reset()


async def test_streaming_snippet(capsys: pytest.CaptureFixture[str]) -> None:
    async with ScriptedServer(responder=lambda body: '{"answer": "AI is software."}') as server:
        plait.settings.configure(lm=server.endpoint())  # plait: an endpoint, not an API key
        predictor = Predict("question -> answer")
        result = None
        async for event in predictor.astream(question="What is AI?"):
            if isinstance(event, OutputStreamChunk):
                print(event.delta, end="", flush=True)  # Real-time output
            elif isinstance(event, Prediction):
                result = event  # Final result
    assert capsys.readouterr().out == "AI is software."
    assert result is not None and result.answer == "AI is software."


@dataclass
class ToolProgress(StreamEvent):
    tool_name: str
    progress: float
    message: str


async def test_custom_stream_events_snippet() -> None:
    @tool
    async def search(query: str) -> str:
        """Searches."""
        emit_event(ToolProgress("search", 0.5, "Searching..."))  # Emit from anywhere
        return "found"

    replies = iter(
        [{"tool_calls": [{"name": "search", "arguments": {"query": "x"}}]}, '{"answer": "ok"}']
    )
    async with ScriptedServer(responder=lambda body: next(replies)) as server:
        plait.settings.configure(lm=server.endpoint())
        agent = ReAct("question -> answer", tools=[search])
        events = [event async for event in agent.astream(question="find x")]
    progress = [e for e in events if isinstance(e, ToolProgress)]
    assert progress == [ToolProgress("search", 0.5, "Searching...")]


async def test_the_stream_is_all_stream_events_and_each_names_its_module_object() -> None:
    @tool
    def search(query: str) -> str:
        """Searches."""
        return "found"

    replies = iter(
        [{"tool_calls": [{"name": "search", "arguments": {"query": "x"}}]}, '{"answer": "ok"}']
    )
    async with ScriptedServer(responder=lambda body: next(replies)) as server:
        plait.settings.configure(lm=server.endpoint())
        agent = ReAct("question -> answer", tools=[search])
        # udspy: the Prediction is the stream's last event, a StreamEvent like the others
        events = [e async for e in agent.astream(question="x?") if isinstance(e, StreamEvent)]
    assert isinstance(events[-1], Prediction) and events[-1].answer == "ok"
    named = [
        e for e in events if isinstance(e, OutputStreamChunk | ToolCallEvent | ToolResultEvent)
    ]
    assert {type(e) for e in named} == {OutputStreamChunk, ToolCallEvent, ToolResultEvent}
    assert all(e.module is agent and e.module_path == "ReAct" for e in named)
    assert "module=" not in repr(named[0]) and "module_path='ReAct'" in repr(named[0])


def delete_files_responder(body: dict[str, Any]) -> Any:
    if not any(m["role"] == "tool" for m in body["messages"]):
        return {"tool_calls": [{"name": "delete_file", "arguments": {"path": "old.log"}}]}
    return '{"answer": "' + body["messages"][-1]["content"].replace('"', "'") + '"}'


def test_confirmation_loop_snippet(tmp_path: Path) -> None:
    target = tmp_path / "old.log"
    target.write_text("x")

    @tool(require_confirmation=True)
    def delete_file(path: str) -> str:
        os.remove(tmp_path / path)
        return f"Deleted {path}"

    answers = iter(["yes"])
    with server_in_thread(responder=delete_files_responder) as server:
        plait.settings.configure(lm=server.endpoint())
        agent = ReAct("question -> answer", tools=[delete_file])
        resume_state = None
        while True:
            try:
                result = agent(question="Delete all files", resume_state=resume_state)
                break  # Success
            except ConfirmationRequired as e:
                user_input = next(answers)  # input("Approve? (yes/no): ")
                resume_state = ResumeState(e, user_input)
    assert result.answer == "Deleted old.log" and not target.exists()


async def test_streaming_confirmation_snippet(tmp_path: Path) -> None:
    @confirm_first  # "Or manually"
    def delete_file(path: str) -> str:
        return f"Deleted {path}"

    async def ask_user(tool_call: Any) -> bool:
        return tool_call.name == "delete_file"

    async with ScriptedServer(responder=delete_files_responder) as server:
        plait.settings.configure(lm=server.endpoint())
        agent = ReAct("question -> answer", tools=[delete_file])
        seen = []
        async for event in agent.astream(question="Delete files"):
            if isinstance(event, Prediction) and not event.is_final:
                for tc in event.native_tool_calls:
                    approved = await ask_user(tc)
                    # plait: the pause travels on the event (the seed leaves `exception` open)
                    resume_state = ResumeState(event.confirmation, "yes" if approved else "no")
                    async for event2 in agent.astream(resume_state=resume_state):
                        seen.append(event2)
    assert seen[-1].is_final and seen[-1].answer == "Deleted old.log"


class LoggingCallback(BaseCallback):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_lm_start(self, call_id, instance, inputs):  # type: ignore[no-untyped-def]
        self.lines.append(f"[{call_id}] LLM called")
        self.lines.append(f"  Model: {inputs.get('model')}")
        self.lines.append(f"  Messages: {len(inputs.get('messages', []))}")

    def on_lm_end(self, call_id, outputs, exception):  # type: ignore[no-untyped-def]
        if exception:
            self.lines.append(f"[{call_id}] LLM failed: {exception}")
        else:
            self.lines.append(f"[{call_id}] LLM completed")


async def test_callbacks_snippet() -> None:
    async with ScriptedServer(responder=lambda body: '{"answer": "4"}') as server:
        plait.settings.configure(lm=server.endpoint())
        predictor = Predict("question -> answer")
        everywhere, here = LoggingCallback(), LoggingCallback()
        plait.settings.configure(callbacks=[everywhere])  # Configure globally
        await predictor(question="2+2?")
        with plait.settings.context(callbacks=[here]):  # Or per-context
            result = await predictor(question="...")
    assert result.answer == "4"
    for callback in (everywhere, here):
        assert callback.lines[1:3] == ["  Model: scripted-model", "  Messages: 2"]
        assert callback.lines[3].endswith("LLM completed")


async def test_settings_snippet() -> None:
    async with (
        ScriptedServer(responder=lambda b: '{"answer": "global"}') as global_server,
        ScriptedServer(responder=lambda b: '{"answer": "custom"}') as custom_server,
    ):
        global_lm = global_server.endpoint()  # plait: LM(model=..., api_key=...)
        plait.settings.configure(lm=global_lm)
        predictor = Predict("question -> answer")
        custom_lm = custom_server.endpoint()
        with plait.settings.context(lm=custom_lm):
            result = await predictor(question="...")  # Uses custom_lm
        assert result.answer == "custom"
        result = await predictor(question="...")  # Uses global LM
        assert result.answer == "global"
