"""A served program as an OpenAI model: the official client, and plait's own provider."""

from __future__ import annotations

import re
from typing import Any

import httpx
import openai
import pytest

from plait import History, LLMInference, Module, Predict, ResourceConfig, run
from plait.serve import app
from plait.testing import ScriptedServer
from plait.testing._replies import default_responder
from serve.support import serving, upstream


class Chat(Module):
    """Answers the last turn of a conversation."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm", "Be brief.")

    def forward(self, history: History) -> str:
        return self.llm(history)


async def test_the_official_openai_client_chats_with_served_programs() -> None:
    async with ScriptedServer() as server:
        programs = {"llm": LLMInference("llm"), "chat": Chat()}
        async with serving(app(programs, upstream(server), api_keys=("client-key",))) as url:
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="client-key")
            models = await client.models.list()
            plain = await client.chat.completions.create(
                model="llm", messages=[{"role": "user", "content": "hello"}]
            )
            chat = await client.chat.completions.create(
                model="chat",
                messages=[
                    {"role": "user", "content": "first"},
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": "second"},
                ],
            )
            stream = await client.chat.completions.create(
                model="llm",
                messages=[{"role": "user", "content": "streamed"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(
                    model="nope", messages=[{"role": "user", "content": "x"}]
                )
            await client.close()
    assert sorted(model.id for model in models.data) == ["chat", "llm"]
    assert plain.choices[0].message.content == "echo: hello"
    assert plain.usage is not None and plain.usage.completion_tokens > 0
    assert chat.choices[0].message.content == "echo: second"
    sent = server.stats.log[1].body["messages"]
    assert [m["role"] for m in sent][-3:] == ["user", "assistant", "user"]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: streamed"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0


async def test_plait_calls_a_served_plait_program_as_its_model() -> None:
    server = ScriptedServer()
    async with server, serving(app({"chat": Chat()}, upstream(server))) as url:
        served_model = ResourceConfig(
                {"*": {"provider": "openai", "base_url": f"{url}/v1", "model": "chat",
                       "api_key": "unused", "max_retries": 0}}
            )  # fmt: skip
        caller = LLMInference("outer", "Relay.")
        answer = await run(caller, "hi there", resources=served_model)
        streamed = [event async for event in caller.astream("again", resources=served_model)]
        async with httpx.AsyncClient() as client:
            metrics = (await client.get(f"{url}/metrics")).text
    assert answer == "echo: hi there"
    assert streamed[-1] == "echo: again"
    assert 'route="/v1/chat/completions",status="200"} 2.0' in metrics


class Pipeline(Module):
    """Drafts, then rewrites: two calls of one module, only the second is the reply."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm", "Be brief.")

    def forward(self, text: str) -> str:
        return self.llm(self.llm(text))


async def _streamed(client: openai.AsyncOpenAI, model: str, text: str) -> list[str]:
    """Returns the content deltas of a streamed completion (empty ones left out)."""
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], stream=True
    )
    deltas = [c.choices[0].delta.content async for c in stream if c.choices]
    return [delta for delta in deltas if delta]


async def test_a_streamed_reply_is_the_text_of_the_plain_reply() -> None:
    """A program of several output fields replies with JSON whole or streamed (its fields'
    text deltas are not the reply); a program returning one inner call's output as it is
    streams that call's text as it comes; one calling its module twice streams only the
    reply, never the draft."""

    def answer(body: dict[str, Any]) -> str:
        if "ticket" in str(body["messages"]):
            return '{"queue": "bug", "urgent": false}'
        return default_responder(body)

    triage = Predict("ticket -> queue, urgent: bool", alias="llm")
    async with ScriptedServer(responder=answer, stream_pieces=4) as server:
        programs = {"triage": triage, "chat": Chat(), "pipeline": Pipeline()}
        async with serving(app(programs, upstream(server))) as url:
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused")
            plain = await client.chat.completions.create(
                model="triage", messages=[{"role": "user", "content": "app crashes"}]
            )
            triaged = await _streamed(client, "triage", "app crashes")
            chatted = await _streamed(client, "chat", "tell me a long story")
            piped = await _streamed(client, "pipeline", "tell me a long story")
            await client.close()
    assert plain.choices[0].message.content == '{"queue": "bug", "urgent": false}'
    assert "".join(triaged) == plain.choices[0].message.content
    assert "".join(chatted) == "echo: tell me a long story"
    assert len(chatted) == 4  # the upstream's four pieces, each passed on as it came
    assert "".join(piped) == "echo: echo: tell me a long story"


async def test_a_conversation_with_an_image_part_is_refused_naming_the_message_everywhere() -> None:
    """An ``image_url`` part has no plait value to become: every route that takes a
    conversation answers 422 naming the message and the part (three answered 500), and no
    model is called."""
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    conversation = [
        {"role": "user", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]},
    ]
    async with (
        ScriptedServer() as server,
        serving(app({"chat": Chat(), "raw": LLMInference("llm")}, upstream(server))) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        answers = {
            f"/v1 {model}": await client.post(
                "/v1/chat/completions", json={"model": model, "messages": conversation}
            )
            for model in ("chat", "raw")
        }
        answers["run chat"] = await client.post(
            "/programs/chat/run?stream=true", json={"history": conversation}
        )
        answers["run raw"] = await client.post("/programs/raw/run", json={"prompt": conversation})
        assert server.stats.requests == 0
    for route, answer in answers.items():
        assert answer.status_code in (400, 422), (route, answer.text)
        message = answer.json()["error"]["message"]
        assert re.search(r"\b(messages?|history)[ .]1\b", message), (route, message)
        assert "part 1 is 'image_url', not a text part" in message, (route, message)
