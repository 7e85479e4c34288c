"""examples/chat.py end to end, driven through stdin/stdout like a person at a terminal.

One run talks to the scripted server (every reply known, so the dialogue is
checked line by line); one runs on the embedded SmolLM2 (slow), where what the
model writes is not fixed but the pause, the [y/n] and the saved note are.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from execution.support import server_in_thread

CHAT = Path(__file__).parents[2] / "examples" / "chat.py"


def responder(body: dict[str, Any]) -> Any:
    """The note agent's forced call gets a tool call; every other request an echo."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and not any(m["role"] == "tool" for m in body["messages"]):
        request = body["messages"][-1]["content"].split("request:", 1)[-1].strip()
        return {"tool_calls": [{"name": "save_note", "arguments": {"text": request}}]}
    if any(m["role"] == "tool" for m in body["messages"]):
        return '{"reply": "Done."}'
    return "Hello to you too."


def run_chat(stdin: str, notes: Path, *extra: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [sys.executable, str(CHAT), "--notes", str(notes), *extra],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_chat_streams_replies_and_asks_before_saving_a_note(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    with server_in_thread(responder=responder, stream_pieces=5) as server:
        out = run_chat(
            "hello\nnote: buy milk\ny\nnote: sell the car\nn\n",
            notes,
            "--base-url",
            server.base_url,
        )
        streamed = [r for r in server.stats.log if r.body.get("stream")]
    assert "assistant: Hello to you too." in out
    assert 'Run the tool save_note with {"text": "buy milk"}? [y/n]' in out
    assert 'Run the tool save_note with {"text": "sell the car"}? [y/n]' in out
    assert notes.read_text() == "buy milk\n"  # approved once, declined once
    assert out.count("assistant: Done.") == 2
    assert streamed, "the chat must stream its replies"


@pytest.mark.slow
def test_the_chat_runs_on_the_embedded_model(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    out = run_chat("hello\nnote: buy milk\ny\n", notes, timeout=300)
    first_reply = out.split("assistant: ", 1)[1].split("\nyou: ", 1)[0]
    assert first_reply.strip()  # the model said something, streamed to the terminal
    assert "[y/n]" in out
    assert notes.read_text().strip()  # the approved note was written
