"""A person's "yes" runs exactly the calls that were shown, once (SPEC §4.8 "Approvals").

The scripted model asks for tool calls over loopback HTTP; the tools are real
and write what ran to a file, so each test checks what actually happened: an
edited, forged, replayed or foreign resume state is refused before any tool
runs, and a call the person never saw never runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from plait import ConfirmationRequired, ReAct, ResourceConfig, ResumeState, tool
from plait.testing import ScriptedServer


def payments_agent(log: Path, *, name: str = "pay") -> ReAct:
    """An agent whose one tool moves money (needs approval) and writes each payment to ``log``."""

    @tool(name=name, require_confirmation=True)
    def send_money(amount: int, to: str) -> str:
        """Sends money to someone."""
        with log.open("a") as file:
            file.write(f"{amount} {to}\n")
        return f"sent {amount} to {to}"

    return ReAct("request -> answer", tools=[send_money])


def calls_then_answer(*calls: dict[str, Any]) -> Any:
    """A responder: the given tool calls first; then an answer made of the tool results."""

    def responder(body: dict[str, Any]) -> Any:
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if not results:
            return {"content": "On it.", "tool_calls": list(calls)}
        return json.dumps({"answer": " / ".join(results)})

    return responder


def config_of(server: ScriptedServer) -> ResourceConfig:
    return ResourceConfig({"*": server.endpoint(max_retries=0)})


async def pause_of(agent: ReAct, server: ScriptedServer, **inputs: Any) -> ConfirmationRequired:
    with pytest.raises(ConfirmationRequired) as paused:
        await agent.bind(config_of(server))(**(inputs or {"request": "pay bob 500"}))
    return paused.value


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# ------------------------------------------------------------ item 1: unseen calls
async def test_two_calls_sharing_an_id_are_each_asked_about(tmp_path: Path) -> None:
    responder = calls_then_answer(
        {"id": "call_1", "name": "pay", "arguments": {"amount": 5, "to": "old-landlord"}},
        {"id": "call_1", "name": "pay", "arguments": {"amount": 9999, "to": "mallory"}},
    )
    log = tmp_path / "payments.txt"
    async with ScriptedServer(responder=responder) as server:
        agent = payments_agent(log)
        first = await pause_of(agent, server)
        assert first.arguments == {"amount": 5, "to": "old-landlord"}

        with pytest.raises(ConfirmationRequired) as second:
            await agent(request="pay bob 500", resume_state=ResumeState(first, "yes"))
        assert lines(log) == ["5 old-landlord"]  # the call nobody was shown did not run
        assert second.value.arguments == {"amount": 9999, "to": "mallory"}
        assert second.value.confirmation_id != first.confirmation_id

        result = await agent(request="pay bob 500", resume_state=ResumeState(second.value, "no"))
    assert lines(log) == ["5 old-landlord"]
    assert [step.ok for step in result.trajectory] == [True, False]
    assert len({step.call_id for step in result.trajectory}) == 2
