"""One LLM call: what reaches the wire, and what comes back as a Value."""

from __future__ import annotations

from typing import Any

import pytest

from plait import (
    LLMInference,
    Module,
    Parameter,
    ResourceConfig,
    ResourceManager,
    ValueKind,
    run,
)
from plait.backends.types import Message
from plait.errors import UnknownAliasError
from plait.execution.llm_call import build_request, call_llm
from seed_programs import SummarizeAndAnalyze

from .support import (
    Ask,
    endpoint,
)


async def test_module_settings_reach_the_wire(server, manager):
    module = LLMInference(alias="llm", system_prompt="Be brief.", temperature=0.2, max_tokens=20)

    await call_llm(module, "hello there", manager)

    body = server.stats.log[0].body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
    ]
    assert (body["model"], body["temperature"], body["max_tokens"]) == ("scripted-model", 0.2, 20)
    assert "response_format" not in body


async def test_a_reply_comes_back_as_a_response_value_with_usage(server, manager):
    module = LLMInference(alias="llm", system_prompt="s", max_tokens=2)

    value = await call_llm(module, "one two three", manager)

    assert (value.kind, value.payload) == (ValueKind.RESPONSE, "echo: one")  # cut at 2 words
    meta = value.meta
    assert (meta["alias"], meta["model"], meta["finish_reason"]) == (
        "llm",
        "scripted-model",
        "length",
    )
    assert (meta["input_tokens"], meta["output_tokens"]) == (4, 2)  # "s" + 3 words; 2 words
    assert meta["attempts"] == 1


async def test_a_parameter_system_prompt_is_read_at_run_time(server, manager):
    instructions = Parameter("Answer in French.", description="the assistant's instructions")
    program = Ask(system_prompt=instructions)

    await run(program, "hi", resources=manager)
    instructions.value = "Answer in German."
    await run(program, "hi", resources=manager)  # same cached graph, new value

    systems = [r.body["messages"][0]["content"] for r in server.stats.log]
    assert systems == ["Answer in French.", "Answer in German."]


class Chat(Module):
    def __init__(self, system_prompt: str = "") -> None:
        super().__init__()
        self.llm = LLMInference(alias="llm", system_prompt=system_prompt)

    def forward(self, turns: list[dict[str, str]]) -> Any:
        return self.llm(turns)


async def test_a_list_of_turns_is_sent_as_the_conversation(server, manager):
    turns = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "What is my name?"},
    ]

    # By keyword: a list as the first positional argument would be a batch.
    out = await run(Chat(system_prompt="Be kind."), turns=turns, resources=manager)

    assert out == "echo: What is my name?"
    assert server.stats.log[0].body["messages"] == [
        {"role": "system", "content": "Be kind."},
        *turns,
    ]


def test_an_explicit_system_turn_wins_over_the_modules():
    module = LLMInference(alias="llm", system_prompt="module prompt")
    request = build_request(
        module, [{"role": "system", "content": "turn prompt"}, Message("user", "hi")]
    )
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "turn prompt"),
        ("user", "hi"),
    ]


def test_a_bad_turn_is_refused_with_its_index():
    module = LLMInference(alias="llm")
    with pytest.raises(TypeError, match=r"prompt item 1 is int; expected a Message"):
        build_request(module, [{"role": "user", "content": "hi"}, 7])


def test_a_timeout_is_carried_by_the_request():
    request = build_request(LLMInference(alias="llm"), "hi", timeout=2.5)
    assert request.timeout == 2.5 and request.response_schema is None


async def test_an_unknown_alias_fails_the_node_naming_alias_and_known_ones(server):
    config = ResourceConfig({"fast_llm": endpoint(server)})
    async with ResourceManager(config) as manager:
        with pytest.raises(UnknownAliasError, match=r"'smart_llm'.*'fast_llm'") as info:
            await run(SummarizeAndAnalyze(), "text", resources=manager)

    assert info.value.node_id == "analyzer"
    assert info.value.__notes__ == ["analyzer failed"]
    assert server.stats.requests == 1  # the summarizer's call went out


async def test_a_non_text_prompt_is_sent_as_its_text(server, manager):
    module = LLMInference(alias="llm")
    value = await call_llm(module, 42, manager)
    assert value.payload == "echo: 42"
