"""The Backend interface of seed 004: keyword forms, contexts that gain their replies, raw batches.

Calls go to the scripted OpenAI-compatible server over loopback; tests assert on
the request bodies it saw.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel

from plait import tool
from plait.backends.openai import OpenAICompatBackend
from plait.backends.types import Message, Request, SamplingOptions
from plait.porting.mellea import CBlock, Component, Context, ModelOutputThunk
from plait.testing import ScriptedServer


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as running:
        yield running


@pytest.fixture
async def backend(server: ScriptedServer) -> AsyncIterator[OpenAICompatBackend]:
    made = OpenAICompatBackend("test-model", base_url=server.base_url)
    yield made
    await made.aclose()


class Person(BaseModel):
    name: str


@tool
def lookup(name: str) -> str:
    """Looks a person up."""
    return name


class Ask(Component):
    """A component with tools: what ``tool_calls=True`` extracts from the action."""

    tools = (lookup,)

    def __init__(self, text: str) -> None:
        self.text = text

    def parts(self) -> list[CBlock]:
        return [CBlock(self.text)]


def bodies(server: ScriptedServer) -> list[dict[str, Any]]:
    return [record.body for record in server.stats.log]


async def test_generate_from_context_takes_format_model_options_and_tool_calls(
    backend: OpenAICompatBackend, server: ScriptedServer
) -> None:
    thunk, _ = backend.generate_from_context(
        CBlock("Name someone."),
        Context(),
        format=Person,
        model_options={"temperature": 0.2, "max_new_tokens": 5, "seed": 7},
    )
    await thunk
    body = bodies(server)[0]
    assert body["messages"] == [{"role": "user", "content": "Name someone."}]
    assert body["response_format"]["json_schema"]["schema"]["properties"] == {
        "name": {"title": "Name", "type": "string"}
    }
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (0.2, 5, 7)
    assert "tools" not in body

    server.responder = lambda body: {
        "tool_calls": [{"name": "lookup", "arguments": {"name": "Ada"}}]
    }
    thunk, ctx = backend.generate_from_context(Ask("Find Ada."), Context(), tool_calls=True)
    response = await thunk
    assert [t["function"]["name"] for t in bodies(server)[1]["tools"]] == ["lookup"]
    assert response.tool_calls[0].name == "lookup"
    assert ctx.messages[-1].tool_calls == response.tool_calls


async def test_the_context_returned_gains_the_reply_once_the_thunk_resolves(
    backend: OpenAICompatBackend,
) -> None:
    ctx = Context([Message("system", "Be brief.")])
    thunk, after = backend.generate_from_context(Message("user", "hi"), ctx)
    assert [m.role for m in after.messages] == ["system", "user"]  # the reply is not known yet
    assert after.pending == (thunk,)
    await thunk
    assert [m.role for m in after.messages] == ["system", "user", "assistant"]
    assert after.messages[-1] == {"role": "assistant", "content": "echo: hi"}
    assert [m.role for m in ctx.messages] == ["system"]  # the given context never changes
    assert after.pending == ()


async def test_a_context_waiting_for_a_reply_waits_before_its_own_call(
    backend: OpenAICompatBackend, server: ScriptedServer
) -> None:
    first, ctx = backend.generate_from_context("one", Context())
    with pytest.raises(RuntimeError, match="still waits for a reply"):
        ctx.to_request(Message("user", "two"))
    second, ctx = backend.generate_from_context("two", ctx)  # built before the first ran
    reply = await second
    assert first.is_computed and reply.text == "echo: two"
    assert bodies(server)[1]["messages"] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "echo: one"},
        {"role": "user", "content": "two"},
    ]
    assert [m.content for m in ctx.messages] == ["one", "echo: one", "two", "echo: two"]


async def test_generate_from_raw_sends_each_action_alone_with_the_context_settings(
    backend: OpenAICompatBackend, server: ScriptedServer
) -> None:
    ctx = Context(
        [Message("user", "never sent")],
        template=Request(messages=(), options=SamplingOptions(max_tokens=9)),
    )
    thunks = backend.generate_from_raw(
        [Request(messages=(Message("user", "as a request"),)), "as text", CBlock("as a block")],
        ctx,
        model_options={"temperature": 0},
    )
    assert all(isinstance(t, ModelOutputThunk) and not t.is_computed for t in thunks)
    replies = [await t for t in thunks]
    assert [r.text for r in replies] == ["echo: as a request", "echo: as text", "echo: as a block"]
    sent = bodies(server)
    assert [b["messages"] for b in sent][1] == [{"role": "user", "content": "as text"}]
    assert [b["temperature"] for b in sent] == [0, 0, 0]
    assert [b.get("max_tokens") for b in sent] == [None, 9, 9]


def test_unknown_options_and_actions_are_refused(backend: OpenAICompatBackend) -> None:
    with pytest.raises(
        TypeError, match=r"unknown model option\(s\) temprature; known: .*temperature"
    ):
        backend.generate_from_context("hi", Context(), model_options={"temprature": 1})
    with pytest.raises(TypeError, match="an action is a Message, text, a CBlock or a Component"):
        backend.generate_from_raw([42])


class SchemaBlindBackend(OpenAICompatBackend):
    """A backend that cannot constrain decoding (as some of Mellea's cannot)."""

    follows_response_schema = False


async def test_a_backend_that_cannot_honour_format_logs_a_warning_and_continues(
    server: ScriptedServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Mellea: "some backends do not support this parameter. They will log warnings and
    # continue to generate."
    blind = SchemaBlindBackend("test-model", base_url=server.base_url)
    try:
        with caplog.at_level("WARNING", logger="plait.porting.mellea"):
            thunk, _ = blind.generate_from_context(
                CBlock("Name someone."), Context(), format=Person
            )
            (raw,) = blind.generate_from_raw(["Name another."], format=Person)
            replies = [await thunk, await raw]
    finally:
        await blind.aclose()
    assert [r.text for r in replies] == ["echo: Name someone.", "echo: Name another."]
    assert all("response_format" not in body for body in bodies(server))
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2
    assert warned[0] == (
        "SchemaBlindBackend cannot constrain replies to format=Person; "
        "the call continues without it"
    )
