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

from plait.testing import server_in_thread

CHAT = Path(__file__).parents[2] / "examples" / "chat.py"


def responder(body: dict[str, Any]) -> Any:
    """A model like SmolLM2: it repeats the note agent's call on the turn after it.

    The forced first turn calls ``save_note`` with the request; the next turn
    calls it again with the same text; the extraction call (no tools) replies
    "Done."; the chat gets an echo.
    """
    messages = body["messages"]
    if body.get("tools"):
        user = next(m["content"] for m in messages if m["role"] == "user")
        request = user.split("request:", 1)[-1].strip()
        return {"tool_calls": [{"name": "save_note", "arguments": {"text": request}}]}
    if any("trajectory" in str(m.get("content")).lower() for m in messages):
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


def test_the_chat_streams_replies_and_asks_once_before_saving_a_note(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    typed = "hello\nnote: buy milk\nmaybe\ny\nhello again\nnote: sell the car\nn\nbye\n"
    with server_in_thread(responder=responder, stream_pieces=5) as server:
        out = run_chat(typed, notes, "--base-url", server.base_url)
        streamed = [r for r in server.stats.log if r.body.get("stream")]
    # each note is asked about once, though the model called save_note twice for it
    assert out.count('Run the tool save_note with {"text": "buy milk"}? [y/n]') == 2  # + re-ask
    assert out.count("Please answer y or n.") == 1  # "maybe" was not taken for an answer
    assert out.count('Run the tool save_note with {"text": "sell the car"}? [y/n]') == 1
    assert notes.read_text() == "buy milk\n"  # approved and saved once, declined once
    assert out.count("assistant: Done.") == 2
    # every chat message got a chat reply: none of them answered a question
    assert out.count("assistant: Hello to you too.") == 3
    assert streamed, "the chat must stream its replies"


@pytest.mark.slow
def test_the_chat_runs_on_the_embedded_model(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    out = run_chat("hello\nnote: buy milk\ny\nhow are you\n", notes, timeout=300)
    first_reply = out.split("assistant: ", 1)[1].split("\nyou: ", 1)[0]
    assert first_reply.strip()  # the model said something, streamed to the terminal
    assert out.count("[y/n]") == 1  # SmolLM2 calls save_note again; nobody is asked twice
    assert len(notes.read_text().splitlines()) == 1  # the approved note, written once
    # the message typed after the note got a reply of its own
    last_reply = out.rsplit("you: ", 2)[-2]
    assert last_reply.startswith("assistant: ") and last_reply.removeprefix("assistant: ").strip()
