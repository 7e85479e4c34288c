"""A conversation given to an LLMInference is one call; a list of conversations is a batch."""

from __future__ import annotations

from plait import History, LLMInference, ResourceConfig
from plait.backends.types import Message
from plait.testing import ScriptedServer

CHAT = [
    {"role": "user", "content": "Hi, I am Ada."},
    {"role": "assistant", "content": "Hello Ada."},
    {"role": "user", "content": "What is my name?"},
]


async def test_a_list_of_role_dicts_is_one_conversation_sent_as_one_request(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    chat = LLMInference("llm", system_prompt="Be brief.").bind(config)
    reply = await chat(CHAT)
    assert reply == "echo: What is my name?"
    assert server.stats.requests == 1
    assert server.stats.log[0].body["messages"] == [
        {"role": "system", "content": "Be brief."},
        *CHAT,
    ]


async def test_a_list_of_conversations_is_a_batch_of_calls(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    chat = LLMInference("llm").bind(config)
    replies = await chat([CHAT, [Message("user", "Second conversation")]])
    assert replies == ["echo: What is my name?", "echo: Second conversation"]
    assert server.stats.requests == 2
    assert sorted(len(r.body["messages"]) for r in server.stats.log) == [1, 3]


async def test_a_history_is_one_conversation(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    history = History("You are terse.")
    history.add_user("Count to three.")
    chat = LLMInference("llm").bind(config)
    assert await chat(history) == "echo: Count to three."
    assert server.stats.log[0].body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Count to three."},
    ]


async def test_a_list_of_plain_texts_is_still_a_batch(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    chat = LLMInference("llm").bind(config)
    assert await chat(["a", "b"]) == ["echo: a", "echo: b"]
    assert server.stats.requests == 2
