"""History: multi-turn state with the system prompt kept first."""

from __future__ import annotations

import pytest

from plait import History
from plait.backends.types import Message, ToolCall


def test_system_prompt_stays_first_whatever_is_added() -> None:
    history = History("Be brief.")
    history.add_user("hi")
    history.add_assistant("hello")
    history.system_prompt = "Be very brief."
    assert [m.role for m in history.messages] == ["system", "user", "assistant"]
    assert history.messages[0] == Message("system", "Be very brief.")
    assert list(history) == list(history.messages)
    assert len(history) == 2


def test_tool_turns_keep_calls_and_ids() -> None:
    history = History()
    call = ToolCall("call_1", "search", '{"q": "plait"}')
    history.add_user("find plait")
    history.add_assistant(tool_calls=[call])
    history.add_tool_result("call_1", "found it", name="search")
    assert history.messages[1] == Message("assistant", "", tool_calls=(call,))
    assert history.last == Message("tool", "found it", tool_call_id="call_1", name="search")
    assert history.system_prompt is None and len(history.messages) == 3


def test_copy_is_independent_and_clear_keeps_the_prompt() -> None:
    history = History("sys")
    history.add_user("one")
    fork = history.copy()
    fork.add_user("two")
    assert len(history) == 1 and len(fork) == 2
    assert fork != history and fork.copy() == fork

    fork.clear()
    assert fork.messages == (Message("system", "sys"),)
    assert len(fork) == 0 and fork.last is None
    assert bool(fork)  # an empty conversation is still a history, not "no history"


def test_system_messages_cannot_land_mid_conversation() -> None:
    history = History(messages=[Message("system", "sys"), Message("user", "hi")])
    assert history.system_prompt == "sys" and len(history) == 1
    with pytest.raises(ValueError, match=r"set history.system_prompt"):
        history.add(Message("system", "late"))
    with pytest.raises(ValueError, match="system prompt twice"):
        History("a", messages=[Message("system", "b")])
    with pytest.raises(ValueError, match=r"set history.system_prompt"):
        history.add({"role": "system", "content": "late"})


def test_a_turn_is_a_message_or_its_dict_with_one_rule_everywhere() -> None:
    history = History()
    history.add({"role": "user", "content": "x"})
    assert history.messages[-1] == Message("user", "x")
    expected = r"is int; expected a Message or \{'role': ..., 'content': ...\}"
    with pytest.raises(TypeError, match="the turn given to History.add\\(\\) " + expected):
        history.add(3)  # type: ignore[arg-type]


def test_round_trips_through_openai_format() -> None:
    history = History("sys")
    history.extend([Message("user", "q")])
    history.add_assistant("", [ToolCall("c1", "f", "{}")])
    history.add_tool_result("c1", "42", name="f")
    data = history.to_list()
    assert data[2] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    assert History.from_list(data) == history
    with pytest.raises(ValueError, match="message 0: role must be"):
        History.from_list([{"role": "robot", "content": "x"}])
    assert repr(history) == "History(system_prompt='sys', turns=3)"


async def test_predict_reads_and_extends_a_history() -> None:
    from plait import Predict, ResourceConfig, ResourceManager
    from plait.testing import ScriptedServer

    history = History("You are terse.")
    async with ScriptedServer(responder=lambda body: '{"answer": "Paris"}') as server:
        config = ResourceConfig(
            {"*": {"provider": "openai", "model": "m", "base_url": server.base_url, "api_key": "k"}}
        )
        async with ResourceManager(config) as manager:
            ask = Predict("question -> answer").bind(manager)
            await ask(question="Capital of France?", history=history)
            await ask(question="And its river?", history=history)

    assert [m.role for m in history.turns] == ["user", "assistant"] * 2
    second = server.stats.log[1].body["messages"]
    assert second[0]["role"] == "system" and second[0]["content"].startswith("You are terse.")
    assert [m["role"] for m in second[1:]] == ["user", "assistant", "user"]
    assert second[1]["content"] == "question: Capital of France?"
