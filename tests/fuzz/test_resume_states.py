"""Resume states stored as JSON (a web server keeps them between requests), edited or forged.

`ResumeState.from_json` gives a state or the ``ValueError`` it documents; a
`ReAct` agent resumed with any state it gave either finishes, pauses again,
or refuses with a plait error, and a tool needing confirmation never runs
with arguments other than the ones the person was shown (or edited).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from plait import ConfirmationRequired, ReAct, ResourceConfig, ResumeState, tool
from plait.errors import PlaitError
from plait.testing import ScriptedServer

from .support import documents, fuzz, json_text, mutated_json, outcome, outcome_async


def responder(body: dict[str, Any]) -> Any:
    """First turn: call write_note and clock; then answer from what the tools said."""
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if not results:
        calls = [
            {"name": "write_note", "arguments": {"text": "buy milk"}},
            {"name": "clock", "arguments": {}},
        ]
        return {"content": "I will save it.", "tool_calls": calls}
    return json.dumps({"answer": " / ".join(results)})


@dataclass
class Agent:
    """A ReAct agent whose confirmed tool records what it was run with."""

    notes: list[Any] = field(default_factory=list)
    react: ReAct = field(init=False)

    def __post_init__(self) -> None:
        @tool(require_confirmation=True)
        def write_note(text: str) -> str:
            """Writes a note (a side effect)."""
            self.notes.append(text)
            return f"saved: {text}"

        @tool
        def clock() -> str:
            """Returns the time."""
            return "12:00"

        self.react = ReAct("request -> answer", tools=[write_note, clock])


async def paused_state() -> str:
    """Returns the JSON of a real pause, answered "yes"."""
    async with ScriptedServer(responder=responder) as server:
        agent = Agent().react.bind(ResourceConfig({"*": server.endpoint(max_retries=0)}))
        try:
            await agent(request="note: buy milk")
        except ConfirmationRequired as pending:
            return ResumeState(pending, "yes").to_json()
    raise AssertionError("the agent did not pause")


@pytest.fixture(scope="module")
def valid() -> dict[str, Any]:
    return json.loads(asyncio.run(paused_state()))


READ_ERRORS = (PlaitError, ValueError)
"""What `ResumeState.from_json` documents: a ValueError (the text is not a state)."""

NESTED = b'{"pause": ' + b"[" * 100_000
LIST_EXTRA = b'{"pause": {"format": "plait.confirmation/1", "question": "q"}, "extra": [1]}'


@fuzz(400)
@given(data=st.data())
@example(data=None)
def test_any_stored_text_is_a_resume_state_or_a_value_error(
    valid: dict[str, Any], data: st.DataObject | None
) -> None:
    texts = [NESTED, LIST_EXTRA] if data is None else [data.draw(documents(valid), label="json")]
    for text in texts:
        outcome("resume state", lambda text=text: read(text), allowed=READ_ERRORS)


def read(text: bytes) -> Any:
    """Reads a stored state and the answer in it, as a resuming module does."""
    return ResumeState.from_json(text).decision


@dataclass
class Resumer:
    agent: Agent
    config: ResourceConfig


@pytest.fixture
async def resumer() -> AsyncIterator[Resumer]:
    async with ScriptedServer(responder=responder) as server:
        yield Resumer(Agent(), ResourceConfig({"*": server.endpoint(max_retries=0)}))


def forged(valid: dict[str, Any]) -> bytes:
    """The valid state with the pending call's arguments changed, and the shown ones not."""
    state = copy.deepcopy(valid)
    state["pause"]["context"]["pending"]["calls"][0]["arguments"] = '{"text": "sell the house"}'
    return json_text(state)


@fuzz(100)
@given(data=st.data())
@example(data=None)
async def test_a_resumed_agent_finishes_pauses_or_refuses_and_runs_only_what_was_shown(
    valid: dict[str, Any], resumer: Resumer, data: st.DataObject | None
) -> None:
    if data is None:
        text = forged(valid)
    else:
        text = data.draw(mutated_json(valid).map(json_text), label="json")
    try:
        state = ResumeState.from_json(text)
    except Exception:  # how the text is read is the test above's concern
        return
    resumer.agent.notes.clear()
    agent = resumer.agent.react.bind(resumer.config)
    await outcome_async(
        "resume state (ReAct)",
        lambda: agent(resume_state=state),
        allowed=(PlaitError,),
    )
    shown = state.exception.arguments if isinstance(state.exception.arguments, dict) else {}
    _, edited = state.decision
    allowed = [shown.get("text"), edited.get("text") if isinstance(edited, dict) else None]
    assert all(note in allowed for note in resumer.agent.notes)
