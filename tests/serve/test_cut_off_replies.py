"""A served agent whose reply was cut off at max_tokens: the answer says why, beside the id.

Real uvicorn on loopback, httpx as the client, the scripted server as the model, which
rambles inside the forced tool call until ``finish_reason: "length"``.
"""

from __future__ import annotations

from typing import Any

import httpx

from plait import ReAct, tool
from plait.serve import app
from plait.testing import ScriptedServer
from serve.support import serving, sse_events, upstream


@tool
def search(query: str) -> str:
    """Searches the notes."""
    return f"notes about {query}"


def rambling_call(body: dict[str, Any]) -> dict[str, Any]:
    arguments = '{"query": "sk-live-SECRET the user asked about'
    call = {"id": "call_1", "name": "search", "arguments": arguments}
    return {"tool_calls": [call], "finish_reason": "length"}


def agent() -> ReAct:
    return ReAct("question -> answer", tools=[search], first_tool_choice="search", max_tokens=16)


def check_reason(error: dict[str, Any]) -> None:
    assert error["type"] == "reply_cut_off" and len(error["error_id"]) == 16
    message = error["message"]
    assert message.startswith("the run failed: ReplyCutOffError: ReAct (question -> answer): ")
    assert "max_tokens=16" in message and "argument 'query' of a call of tool 'search'" in message
    assert "raise max_tokens above 16" in message
    assert f"quote error id {error['error_id']}" in message
    assert "SECRET" not in message and "the user asked" not in message


async def test_the_api_answer_and_the_stream_say_why_a_cut_off_run_failed() -> None:
    async with ScriptedServer(responder=rambling_call) as server:
        served = app({"agent": agent()}, upstream(server))
        async with serving(served) as url, httpx.AsyncClient(timeout=60) as client:
            answer = await client.post(f"{url}/programs/agent/run", json={"question": "notes?"})
            streamed = await client.post(
                f"{url}/programs/agent/run?stream=true", json={"question": "notes?"}
            )
    assert answer.status_code == 502, answer.text
    check_reason(answer.json()["error"])
    name, data = sse_events(streamed.text)[-1]
    assert name == "error" and data["error"]["status"] == 502
    check_reason(data["error"])
