"""examples/serve_chat.py on the embedded model, called over HTTP like its docstring says."""

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
async def test_the_served_chat_answers_on_the_embedded_model() -> None:
    spec = importlib.util.spec_from_file_location("serve_chat", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    history = [{"role": "user", "content": "Say hello."}]
    async with serving(app({"chat": example.make_chat()})) as url:
        async with httpx.AsyncClient(timeout=300) as client:
            plain = await client.post(f"{url}/programs/chat/run", json={"history": history})
            streamed = await client.post(
                f"{url}/programs/chat/run?stream=true", json={"history": history}
            )
        chat = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=300)
        reply = await chat.chat.completions.create(model="chat", messages=history)
        await chat.close()
    assert plain.status_code == 200 and plain.json()["output"].strip()
    assert plain.json()["usage"]["output_tokens"] > 0
    events = sse_events(streamed.text)
    assert events[-1][0] == "output" and any(name == "text" for name, _ in events)
    assert (reply.choices[0].message.content or "").strip()
