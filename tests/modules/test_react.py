"""ReAct over the scripted server: scripted tool calls, tool errors, max_iters, parallel calls."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from typing import Any

import pytest

from plait import History, LLMInference, ReAct, Tool, tool
from plait.modules.react import ReActPrediction, ReActStep
from plait.tools import DEFAULT_TIMEOUT

from .scripted import all_text, bodies, last_user, scripted


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@tool
def lookup(city: str) -> str:
    """Returns facts about a city."""
    if city == "Atlantis":
        raise LookupError(f"no such city: {city}")
    return f"{city} has 2 million people"


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


def call_then_answer(*calls: dict[str, Any], answer: str = '{"answer": "done"}') -> Any:
    """A responder: the given tool calls first; once tool results are in, the answer."""

    def responder(body: dict[str, Any]) -> Any:
        if not tool_messages(body):
            return {"tool_calls": list(calls)}
        return answer

    return responder


async def test_tool_call_then_final_answer() -> None:
    responder = call_then_answer(
        {"id": "call_add", "name": "add", "arguments": {"a": 2, "b": 3}}, answer='{"answer": "5"}'
    )
    async with scripted(responder) as (server, manager):
        agent = ReAct("question -> answer", tools=[add]).bind(manager)
        prediction = await agent(question="What is 2 + 3?")

    first, second = bodies(server)
    assert first["tool_choice"] == "auto"
    assert first["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Adds two integers.",
                "parameters": {
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                    "type": "object",
                },
            },
        }
    ]
    assistant = second["messages"][-2]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"][0]["function"]["name"] == "add"
    (result,) = tool_messages(second)
    assert (result["content"], result["tool_call_id"]) == ("5", "call_add")

    assert isinstance(prediction, ReActPrediction)
    assert prediction.answer == "5" and not prediction.extracted
    assert prediction.trajectory == [
        ReActStep(thought="", tool="add", args={"a": 2, "b": 3}, result="5", call_id="call_add")
    ]
    assert prediction.usage.input_tokens > 0
    traces = agent.traces()
    assert len(traces) == 2 and traces[0].module_type == "ReAct"
    assert traces[0].output == {"text": "", "tool_calls": ["add"]}


async def test_tool_errors_are_shown_to_the_model() -> None:
    responder = call_then_answer(
        {"name": "lookup", "arguments": {"city": "Atlantis"}},
        {"name": "add", "arguments": '{"a": "two", "b": 1}'},
        {"name": "teleport", "arguments": "{}"},
    )
    async with scripted(responder) as (server, manager):
        agent = ReAct("question -> answer", tools=[lookup, add]).bind(manager)
        prediction = await agent(question="Where is Atlantis?")

    results = [m["content"] for m in tool_messages(bodies(server)[1])]
    assert results == [
        "Error: tool 'lookup' raised LookupError: no such city: Atlantis",
        "Error: invalid arguments for tool 'add': argument 'a': Input should be a valid integer, "
        "unable to parse string as an integer (got 'two')",
        "Error: there is no tool named 'teleport'; the tools are: lookup, add",
    ]
    assert [step.ok for step in prediction.trajectory] == [False, False, False]
    assert prediction.answer == "done"


async def test_max_iters_ends_with_an_extraction_call_that_must_answer() -> None:
    def responder(body: dict[str, Any]) -> Any:
        if "tools" in body:  # the agent loop: it never stops calling tools
            turn = len(tool_messages(body))
            return {"content": f"thinking {turn}", "tool_calls": [
                {"name": "lookup", "arguments": {"city": f"City{turn}"}}
            ]}  # fmt: skip
        return '{"answer": 42}'

    async with scripted(responder) as (server, manager):
        agent = ReAct("question -> answer: int", tools=[lookup], max_iters=2).bind(manager)
        prediction = await agent(question="How many?")

    loop1, loop2, extraction = bodies(server)
    assert "tools" in loop1 and "tools" in loop2
    assert "tools" not in extraction and "response_format" in extraction
    trajectory = last_user(extraction)
    assert "Step 1: called lookup(" in trajectory and "City0 has 2 million people" in trajectory
    assert "Step 2: called lookup(" in trajectory and "City1 has 2 million people" in trajectory
    assert "The step limit was reached" in trajectory
    assert prediction.answer == 42 and prediction.extracted
    assert [step.thought for step in prediction.trajectory] == ["thinking 0", "thinking 1"]
    assert [t.module_type for t in agent.traces()] == ["ReAct", "ReAct", "Predict"]


async def test_an_unparseable_final_answer_is_extracted() -> None:
    def responder(body: dict[str, Any]) -> Any:
        if "tools" not in body:
            return '{"answer": 5}'
        if not tool_messages(body):
            return {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}
        return "It is five."

    async with scripted(responder) as (server, manager):
        agent = ReAct("question -> answer: int", tools=[add]).bind(manager)
        prediction = await agent(question="2 + 3?")

    assert len(bodies(server)) == 3
    assert "Final reply: It is five." in last_user(bodies(server)[2])
    assert prediction.answer == 5 and prediction.extracted


async def test_calls_of_one_turn_run_concurrently() -> None:
    barrier = asyncio.Barrier(3)
    arrived: list[str] = []

    @tool
    async def probe(name: str) -> str:
        arrived.append(name)
        # Each call waits for the other two: done only if all three run at once.
        await asyncio.wait_for(barrier.wait(), timeout=10)
        return f"{name} ok"

    responder = call_then_answer(
        *({"name": "probe", "arguments": {"name": n}} for n in ("x", "y", "z"))
    )
    async with scripted(responder) as (server, manager):
        prediction = await ReAct("task -> answer", tools=[probe]).bind(manager)(task="probe all")

    assert sorted(arrived) == ["x", "y", "z"]
    assert [m["content"] for m in tool_messages(bodies(server)[1])] == ["x ok", "y ok", "z ok"]
    assert [step.result for step in prediction.trajectory] == ["x ok", "y ok", "z ok"]


async def test_history_gets_the_whole_exchange() -> None:
    responder = call_then_answer({"name": "add", "arguments": {"a": 1, "b": 1}})
    history = History("You are a calculator.")
    async with scripted(responder) as (server, manager):
        agent = ReAct("question -> answer", tools=[add]).bind(manager)
        await agent(question="1 + 1?", history=history)
        await agent(question="and again?", history=history)

    assert [m.role for m in history.turns[:4]] == ["user", "assistant", "tool", "assistant"]
    assert len(history) == 6  # the second run answered at once: user + assistant
    third = bodies(server)[2]  # the second run's request sees the first run
    assert third["messages"][0]["content"].startswith("You are a calculator.")
    assert "question: 1 + 1?" in all_text(third)
    assert json.loads(third["messages"][4]["content"]) == {"answer": "done"}


async def test_instructions_are_learnable_and_sent() -> None:
    async with scripted(lambda body: '{"answer": "ok"}') as (server, manager):
        agent = ReAct("question -> answer", tools=[add])
        names = dict(agent.named_parameters())
        assert set(names) == {"instructions", "extract.instructions", "extract.demos"}
        agent.instructions.value = "Use tools wisely."
        await agent.bind(manager)(question="hi")
    system = bodies(server)[0]["messages"][0]["content"]
    assert system.startswith("Use tools wisely.")


def test_bad_setups_are_refused() -> None:
    with pytest.raises(ValueError, match="two tools named 'add'"):
        ReAct("q -> a", tools=[add, add])
    with pytest.raises(ValueError, match="max_iters >= 1"):
        ReAct("q -> a", tools=[add], max_iters=0)
    agent = ReAct("q -> a", tools=[add.func, lookup])
    assert list(agent.tools) == ["add", "lookup"]
    assert "tools=[add, lookup]" in repr(agent)


async def test_inputs_are_checked() -> None:
    async with scripted() as (_, manager):
        agent = ReAct("question, context -> answer", tools=[add])
        with pytest.raises(Exception, match="missing input"):
            await agent.bind(manager)(question="x")


@pytest.mark.slow
async def test_react_on_the_local_model_answers_in_type() -> None:
    # The embedded 135M model may or may not call a tool; the earlier tool
    # turns in the history make the local backend render tool messages either
    # way. Asserts are about types, never wording.
    pytest.importorskip("llama_cpp")
    from plait import ResourceConfig, ResourceManager
    from plait.backends.types import ToolCall

    history = History()
    history.add_user("question: How many people live in Lyon?")
    history.add_assistant(tool_calls=[ToolCall("c1", "lookup", '{"city": "Lyon"}')])
    history.add_tool_result("c1", "Lyon has 520000 people", name="lookup")
    history.add_assistant('{"answer": 520000}')
    async with ResourceManager(ResourceConfig({"llm": {"provider": "local"}})) as manager:
        agent = ReAct(
            "question -> answer: int", tools=[lookup], max_iters=2, max_tokens=48, temperature=0.0
        ).bind(manager)
        prediction = await agent(question="How many people live in Paris?", history=history)

    assert isinstance(prediction.answer, int)
    assert all(isinstance(step, ReActStep) for step in prediction.trajectory)
    assert len(history) > 4 and history.turns[4].content.startswith("question: How many")
    assert 1 <= len(agent.traces()) <= 3 and all(t.output_tokens > 0 for t in agent.traces())


async def test_a_blocking_sync_tool_does_not_stall_other_calls() -> None:
    # The tool blocks its thread until the server has seen an unrelated call
    # that starts only once the tool runs: it can be released only if the
    # event loop keeps serving other work while the tool blocks.
    loop = asyncio.get_running_loop()
    tool_started = asyncio.Event()
    other_arrived = threading.Event()

    @tool
    def wait_for_other() -> str:
        """Blocks until the other call reached the server."""
        loop.call_soon_threadsafe(tool_started.set)
        return "released" if other_arrived.wait(timeout=10) else "the loop was stalled"

    agent_reply = call_then_answer({"name": "wait_for_other", "arguments": {}})

    def responder(body: dict[str, Any]) -> Any:
        if "tools" in body:
            return agent_reply(body)
        other_arrived.set()
        return "other answer"

    async def other_call(llm: LLMInference) -> Any:
        await tool_started.wait()
        return await llm("an unrelated question")

    async with scripted(responder) as (server, manager):
        agent = ReAct("question -> answer", tools=[wait_for_other]).bind(manager)
        llm = LLMInference(alias="llm").bind(manager)
        prediction, other = await asyncio.gather(agent(question="wait"), other_call(llm))

    first, unrelated, second = bodies(server)
    assert "tools" in first and "tools" not in unrelated and "tools" in second
    assert last_user(unrelated) == "an unrelated question"
    assert [m["content"] for m in tool_messages(second)] == ["released"]
    assert prediction.trajectory[0].result == "released" and other == "other answer"


async def test_a_tool_that_never_returns_times_out_and_the_model_is_told() -> None:
    assert Tool(add.func).timeout == DEFAULT_TIMEOUT and 0 < DEFAULT_TIMEOUT < math.inf
    release = threading.Event()

    @tool(timeout=0.05)
    async def hang_async() -> str:
        """Never answers."""
        await asyncio.Event().wait()
        return "never"

    @tool(timeout=0.05)
    def hang_sync() -> str:
        """Blocks its thread until the test ends."""
        release.wait(timeout=30)
        return "too late"

    responder = call_then_answer(
        {"name": "hang_async", "arguments": {}}, {"name": "hang_sync", "arguments": {}}
    )
    try:
        async with scripted(responder) as (server, manager):
            agent = ReAct("question -> answer", tools=[hang_async, hang_sync]).bind(manager)
            prediction = await agent(question="anything?")
    finally:
        release.set()

    assert [m["content"] for m in tool_messages(bodies(server)[1])] == [
        "Error: tool 'hang_async' did not finish within 0.05 seconds",
        "Error: tool 'hang_sync' did not finish within 0.05 seconds",
    ]
    assert [step.ok for step in prediction.trajectory] == [False, False]
    assert prediction.answer == "done"
