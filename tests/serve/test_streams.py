"""Streamed answers add up to the plain answer: a cut upstream stream that is retried, and a
long reply in many pieces, on ``/v1/chat/completions`` and on the run route's SSE."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import openai
import pytest

from plait import History, LLMInference, Module
from plait.serve import app
from plait.testing import Fault, ScriptedServer
from serve.support import serving, sse_events


class Chat(Module):
    """Answers the last turn of a conversation."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm", "Be brief.")

    def forward(self, history: History) -> str:
        return self.llm(history)


def retried(server: ScriptedServer) -> dict[str, Any]:
    """Resources whose every alias is ``server``, a failed attempt retried at once."""
    return {"*": server.endpoint(max_retries=2, retry_base_delay=0)}


def cut_once() -> Fault:
    """Cuts the next stream inside its text: the role chunk and two pieces were sent."""
    return Fault(kind="drop", after_chunks=3, times=1)


def rebuilt(events: list[tuple[str, Any]]) -> dict[tuple[str, str], str]:
    """Returns each ``(module, field)``'s text as a client of the run route's SSE keeps it."""
    texts: dict[tuple[str, str], str] = {}
    for name, data in events:
        if name == "restart":
            texts = {key: text for key, text in texts.items() if key[0] != data["module"]}
        elif name in ("text", "thought"):
            key = (data["module"], data["field"])
            before = texts.get(key, "")
            texts[key] = before[: data.get("keep", len(before))] + data["delta"]
    return texts


def frame(event: dict[str, Any]) -> dict[str, Any]:
    """A text event's data without the text it carries (its delta, or a ``content``
    repeating the text so far): what the event costs whatever the reply."""
    return {**{k: v for k, v in event.items() if k != "content"}, "delta": ""}


async def streamed_deltas(url: str, text: str) -> list[str]:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": text}], stream=True
        )
        return [c.choices[0].delta.content or "" async for c in stream if c.choices]
    finally:
        await client.close()


async def test_a_v1_stream_cut_upstream_and_retried_sends_the_reply_once() -> None:
    async with (
        ScriptedServer(stream_pieces=8) as server,
        serving(app({"chat": Chat()}, retried(server))) as url,
    ):
        server.inject(cut_once())
        deltas = await streamed_deltas(url, "tell me a long story")
        assert server.stats.requests == 2  # the cut attempt and its retry
    assert "".join(deltas) == "echo: tell me a long story"


async def test_a_v1_stream_whose_retry_says_something_else_ends_with_an_error() -> None:
    attempts = itertools.count(1)

    def answer(body: dict[str, Any]) -> str:
        return f"attempt {next(attempts)} of a reply that changes when asked again"

    async with (
        ScriptedServer(responder=answer, stream_pieces=8) as server,
        serving(app({"chat": Chat()}, retried(server))) as url,
    ):
        server.inject(cut_once())
        received: list[str] = []
        with pytest.raises(openai.APIError, match="asked again") as raised:
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused")
            stream = await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            async for chunk in stream:
                received.append(chunk.choices[0].delta.content or "")
        await client.close()
    assert "attempt 1 of a reply".startswith("".join(received))  # never the retry's text
    assert "the text streamed is not the reply" in str(raised.value)


async def test_run_route_text_comes_as_deltas_that_rebuild_the_output_after_a_restart() -> None:
    async with (
        ScriptedServer(stream_pieces=8) as server,
        serving(app({"chat": Chat()}, retried(server))) as url,
    ):
        server.inject(cut_once())
        history = [{"role": "user", "content": "tell me a long story"}]
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            answer = await client.post("/programs/chat/run?stream=true", json={"history": history})
    events = sse_events(answer.text)
    assert [name for name, _ in events].count("restart") == 1
    assert all("content" not in data for name, data in events if name == "text")
    output = events[-1][1]["output"]
    assert output == "echo: tell me a long story"
    assert rebuilt(events) == {("llm", "text"): output}


async def test_a_long_reply_in_many_pieces_streams_in_size_proportional_to_it() -> None:
    """40,000 characters in 10,000 pieces: each event repeating the text so far made 201 MB
    of SSE; deltas keep it within three times the reply plus each event's framing."""
    words = itertools.cycle(["alpha", "beta", "gamma", "delta", "épsilon", "zeta", "ηta"])
    reply = " ".join(itertools.islice(words, 7000))[:40_000]
    async with (
        ScriptedServer(responder=lambda body: reply, stream_pieces=10_000) as server,
        serving(app({"chat": Chat()}, retried(server))) as url,
    ):
        history = [{"role": "user", "content": "write a lot"}]
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            answer = await client.post("/programs/chat/run?stream=true", json={"history": history})
    events = sse_events(answer.text)
    texts = [data for name, data in events if name == "text"]
    framing = sum(
        len(b"event: text\ndata: \n\n") + len(json.dumps(frame(d), separators=(",", ":")))
        for d in texts
    )
    assert len(texts) > 5_000
    assert len(answer.content) <= 3 * len(reply.encode()) + framing + 1_000
    assert rebuilt(events) == {("llm", "text"): reply} and events[-1][1]["output"] == reply
