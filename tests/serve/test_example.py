"""examples/serve_chat.py on the embedded model, called over HTTP like its docstring says:
the chat answers, and the note agent saves a note only once it is approved."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import openai
import pytest

from plait.serve import app
from serve.support import serving, sse_events

EXAMPLE = Path(__file__).parents[2] / "examples" / "serve_chat.py"


@pytest.mark.slow
async def test_the_served_chat_answers_and_a_note_waits_for_approval(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("serve_chat", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    history = [{"role": "user", "content": "Say hello."}]
    notes = tmp_path / "notes.txt"
    programs = {"chat": example.make_chat(), "notes": example.make_notes(notes)}
    async with serving(app(programs)) as url:
        async with httpx.AsyncClient(timeout=300) as client:
            plain = await client.post(f"{url}/programs/chat/run", json={"history": history})
            streamed = await client.post(
                f"{url}/programs/chat/run?stream=true", json={"history": history}
            )
            paused = await client.post(f"{url}/programs/notes/run", json={"request": "buy milk"})
            saved_before = notes.exists()
            (call,) = paused.json()["pending"]
            resumed = await client.post(
                f"{url}/programs/notes/runs/{paused.json()['run_id']}/resume",
                json={"answers": {call["call_id"]: "yes"}},
            )
        chat = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=300)
        reply = await chat.chat.completions.create(model="chat", messages=history)
        await chat.close()
    assert plain.status_code == 200 and plain.json()["output"].strip()
    assert plain.json()["usage"]["output_tokens"] > 0
    events = sse_events(streamed.text)
    assert events[-1][0] == "output" and any(name == "text" for name, _ in events)
    assert (reply.choices[0].message.content or "").strip()
    assert paused.status_code == 202 and call["tool_name"] == "save_note" and not saved_before
    assert resumed.status_code in (200, 202), resumed.text  # a small model may ask again
    assert notes.read_text(encoding="utf-8").strip() == call["arguments"]["text"].strip()
