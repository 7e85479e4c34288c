"""The ``test`` provider: a user's program runs against it through the whole resource layer,
with replies made from each request's schema, given in turn, or made by a function, and every
request recorded; nothing touches the network."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

import plait
from plait import (
    InputField,
    LLMInference,
    OutputField,
    Predict,
    ReAct,
    ResourceConfig,
    ResourceManager,
    Signature,
    run,
)
from plait.backends import providers
from plait.backends.test._made import made_value
from plait.backends.types import Message, Price, Request, Response, ToolCall, ToolSpec
from plait.errors import BackendError, BudgetExceededError, ConfigError, RateLimitError
from plait.streaming import OutputStreamChunk
from plait.testing import TestBackend


class Item(BaseModel):
    name: str
    qty: int


class Triage(Signature):
    """Sort a message."""

    text: str = InputField()
    label: Literal["spam", "ham", "urgent"] = OutputField()
    score: int = OutputField()
    tags: list[str] = OutputField()
    item: Item = OutputField()


ENV = {**os.environ, "PYTHONPATH": str(Path(plait.__file__).parents[1])}
"""A child process imports this checkout's plait."""


def python(code: str) -> str:
    """Runs ``code`` in a fresh interpreter; returns what it printed."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=ENV, check=True
    )
    return done.stdout.strip()


def ask(text: str = "hi") -> Request:
    return Request(messages=(Message("user", text),))


async def test_a_bare_test_provider_answers_a_typed_predict_with_valid_made_up_outputs() -> None:
    for entry in ({"provider": "test"}, "test"):
        async with ResourceManager({"llm": entry}) as manager:
            outputs = await run(
                Predict(Triage, alias="llm"), ["buy now", "hello"], resources=manager
            )
            usage = manager.total_usage()
        for out in outputs:
            assert out.label in ("spam", "ham", "urgent")
            assert isinstance(out.score, int) and isinstance(out.item, Item)
            assert out.tags and all(isinstance(tag, str) for tag in out.tags)
        assert usage.input_tokens > 0 and usage.output_tokens > 0
        assert usage.cost == 0.0


async def test_a_plain_call_gets_a_fixed_text_and_a_required_tool_gets_valid_arguments() -> None:
    backend = TestBackend()
    async with ResourceManager({"llm": {"provider": backend}}) as manager:
        assert await run(LLMInference("llm"), "hello", resources=manager) == "test reply"
        tool = ToolSpec(
            "lookup",
            "Look a city up.",
            {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer", "minimum": 1},
                },
                "required": ["city", "days"],
            },
        )
        forced = Request(
            messages=(Message("user", "weather?"),), tools=(tool,), tool_choice="required"
        )
        response = await manager.complete("llm", forced)
        (call,) = response.tool_calls
        assert (call.name, json.loads(call.arguments)) == ("lookup", {"city": "test", "days": 1})
        free = await manager.complete(
            "llm", Request(forced.messages, tools=(tool,), tool_choice="auto")
        )
        assert (free.tool_calls, free.text) == ((), "test reply")  # no call: a final answer


async def test_fixed_replies_are_used_in_turn_and_running_out_says_so() -> None:
    backend = TestBackend(
        replies=[{"label": "urgent", "score": 9, "tags": [], "item": {"name": "x", "qty": 2}}, "{}"]
    )
    async with ResourceManager({"llm": {"provider": backend}}) as manager:
        first = await Predict(Triage, alias="llm").bind(resources=manager)("fire!")
        assert (first.label, first.score, first.item) == ("urgent", 9, Item(name="x", qty=2))
        assert (await manager.complete("llm", ask())).text == "{}"
        with pytest.raises(BackendError, match=r"given 2 replies and this is call 3"):
            await manager.complete("llm", ask())


async def test_replies_from_backend_options_a_mapping_and_a_function_of_the_request() -> None:
    config = {
        "a": {"provider": "test", "backend_options": {"replies": ["one", "two"]}},
        "b": {"provider": "test", "backend_options": {"replies": {"cat": "meow", "dog": "woof"}}},
        "c": {
            "provider": "test",
            "backend_options": {"function": lambda r: r.messages[-1].content[::-1]},
        },
    }
    async with ResourceManager(config) as manager:
        assert [(await manager.complete("a", ask())).text for _ in range(2)] == ["one", "two"]
        assert (await manager.complete("b", ask("a dog barks"))).text == "woof"
        with pytest.raises(BackendError, match=r"none of its reply keys \('cat', 'dog'\)"):
            await manager.complete("b", ask("a bird"))
        assert (await manager.complete("c", ask("abc"))).text == "cba"
    with pytest.raises(ConfigError, match=r"'backend_options' has 'reply', which TestBackend"):
        ResourceConfig({"a": {"provider": "test", "backend_options": {"reply": "x"}}})


async def test_calls_are_recorded_in_order_with_messages_schema_and_options() -> None:
    backend = TestBackend()
    program = Predict(Triage, alias="llm", temperature=0.3)
    async with ResourceManager({"llm": {"provider": backend}}) as manager:
        await run(program, ["first", "second"], resources=manager, max_concurrent=1)
    assert len(backend.calls) == 2
    assert ["first" in c.messages[-1].content for c in backend.calls] == [True, False]
    assert "second" in backend.calls[1].messages[-1].content
    schema = backend.calls[0].response_schema
    assert schema is not None and schema.schema["properties"]["label"]["enum"] == [
        "spam",
        "ham",
        "urgent",
    ]
    assert backend.calls[0].options.temperature == 0.3


async def test_a_raised_reply_goes_through_the_retries() -> None:
    backend = TestBackend(replies=[RateLimitError("slow down", status=429, retryable=True), "ok"])
    config = {"llm": {"provider": backend, "retry_base_delay": 0.01, "retry_max_delay": 0.01}}
    async with ResourceManager(config) as manager:
        assert (await manager.complete("llm", ask())).text == "ok"
    assert len(backend.calls) == 2


async def test_streaming_delivers_the_reply_in_pieces() -> None:
    async with ResourceManager({"llm": "test"}) as manager:
        chunks = [chunk async for chunk in manager.stream("llm", ask())]
        assert len(chunks) > 1 and "".join(c.text for c in chunks) == "test reply"
        assert chunks[-1].usage is not None and chunks[-1].usage.cost == 0.0
        program = Predict(Triage, alias="llm").bind(resources=manager)
        events = [event async for event in program.astream(text="hello")]
    label = [e for e in events if isinstance(e, OutputStreamChunk) and e.field_name == "label"]
    assert label and label[-1].is_complete and label[-1].content == "spam"
    assert events[-1].label == "spam"


async def test_a_batch_keeps_to_max_concurrent() -> None:
    in_flight = peak = 0

    async def slow(request: Request) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return request.messages[-1].content.upper()

    backend = TestBackend(function=slow)
    config = {"llm": {"provider": backend, "max_concurrent": 2}}
    async with ResourceManager(config) as manager:
        outputs = await run(LLMInference("llm"), [f"q{i}" for i in range(8)], resources=manager)
    assert outputs == [f"Q{i}" for i in range(8)]
    assert peak == 2 and len(backend.calls) == 8


async def test_a_budget_counts_its_calls_at_the_price_given() -> None:
    backend = TestBackend(replies=["ok"] * 100)
    price = {"input": 1_000_000.0, "output": 0.0}  # $1 per input token: $1 a call
    config = {"llm": {"provider": backend, "price": price, "budget": 40.0, "max_concurrent": 1}}
    async with ResourceManager(config) as manager:
        assert (await manager.complete("llm", ask("abcd"))).usage.cost == 1.0
        with pytest.raises(BudgetExceededError, match="alias 'llm'"):
            for _ in range(100):
                await manager.complete("llm", ask("abcd"))
        spent = manager.total_usage().cost
    assert 1.0 < spent <= 40.0  # refused once its worst case no longer fitted
    assert len(backend.calls) == spent  # one dollar per call reached the backend


def test_the_test_provider_is_declared_in_its_spec_and_import_stays_light() -> None:
    spec = providers.get("test")
    assert spec is not None and spec.free and spec.backend_class() is TestBackend
    code = (
        "import sys, plait; from plait.backends import providers; "
        "assert providers.get('test') is not None; "
        "print('plait.backends.test.backend' in sys.modules)"
    )
    assert python(code) == "False"


async def test_nothing_touches_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the test provider used the network: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    async with ResourceManager({"llm": "test"}) as manager:
        outputs = await run(Predict(Triage, alias="llm"), ["a", "b", "c"], resources=manager)
        chunks = [chunk async for chunk in manager.stream("llm", ask())]
    assert len(outputs) == 3 and chunks


def test_a_test_backend_given_as_it_is_costs_nothing_like_the_test_provider() -> None:
    config = ResourceConfig(
        {
            "made": {"provider": TestBackend()},
            "built": {"provider": TestBackend, "backend_options": {"replies": ["x"]}},
            "priced": {"provider": TestBackend(), "price": {"input": 1.0, "output": 2.0}},
        }
    )
    assert config["made"].effective_price == Price(0.0, 0.0)  # not "unknown"
    assert config["built"].effective_price == Price(0.0, 0.0)
    assert config["priced"].effective_price == Price(1.0, 2.0)


async def test_a_response_reply_keeps_its_tool_calls_and_is_not_changed() -> None:
    reply = Response(text="", tool_calls=(ToolCall("c1", "lookup", '{"city": "Oslo"}'),))
    backend = TestBackend(replies=[reply, reply])
    async with ResourceManager({"llm": {"provider": backend}}) as manager:
        first = await manager.complete("llm", ask())
        second = await manager.complete("llm", ask("again"))
    assert first.tool_calls == second.tool_calls == reply.tool_calls
    assert first.usage.output_tokens > 0 and reply.usage.total_tokens == 0 and not reply.meta


class Node(BaseModel):
    name: str
    children: list[Node] = []
    parent: Node | None = None


class Bounded(BaseModel):
    above_three: int = Field(gt=3, le=10)
    half: float = Field(ge=0.5)
    word: str = Field(min_length=10, max_length=12)
    day: datetime.date
    moment: datetime.datetime
    key: uuid.UUID
    which: Literal[3, 4]
    pair: tuple[int, str]
    maybe: int | None
    tree: Node
    three: list[int] = Field(min_length=3)
    counts: dict[str, int]
    flag: bool


@pytest.mark.parametrize("model", [Bounded, Node, Item])
def test_a_made_value_is_valid_for_bounds_formats_tuples_and_recursive_models(
    model: type[BaseModel],
) -> None:
    value = made_value(model.model_json_schema())
    model.model_validate(value)  # raises when the made value breaks the schema
    assert made_value(model.model_json_schema()) == value  # the same every time


async def test_a_react_agent_runs_to_its_final_answer() -> None:
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    class Sum(Signature):
        """Answer."""

        question: str = InputField()
        answer: int = OutputField()

    backend = TestBackend()
    async with ResourceManager({"llm": {"provider": backend}}) as manager:
        agent = ReAct(Sum, tools=[add], alias="llm", first_tool_choice="required")
        assert (await run(agent, "1 + 2?", resources=manager)).answer == 0
    first, second = backend.calls[:2]
    assert first.tool_choice == "required" and [t.name for t in first.tools] == ["add"]
    assert [m.content for m in second.messages if m.role == "tool"] == ["0"]  # add(a=0, b=0)


def test_plait_run_over_a_file_with_the_test_provider_from_a_resources_file(tmp_path: Path) -> None:
    program = tmp_path / "triage.py"
    program.write_text(
        "from typing import Literal\n"
        "from plait import InputField, OutputField, Predict, Signature\n\n"
        "class Sort(Signature):\n"
        '    """Sort a message."""\n'
        "    message: str = InputField()\n"
        '    label: Literal["bug", "question"] = OutputField()\n\n'
        'sort = Predict(Sort, alias="llm")\n'
    )
    (tmp_path / "in.jsonl").write_text('{"message": "it crashes"}\n{"message": "hi"}\n')
    (tmp_path / "res.toml").write_text('llm = "test"\n')
    command = ["run", f"{program}:sort", "-i", "in.jsonl", "-o", "out.jsonl"]
    done = subprocess.run(
        [sys.executable, "-m", "plait", *command, "--resources", "res.toml"],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(row["label"], row["error"]) for row in rows] == [("bug", None), ("bug", None)]
    assert "cost $0.0000" in done.stdout + done.stderr


def test_plait_testing_exports_the_kit_and_loads_nothing_heavy() -> None:
    import plait.testing

    assert plait.testing.__all__ == sorted(plait.testing.__all__)
    assert {"TestBackend", "ScriptedServer", "Fault", "server_in_thread"} <= set(
        plait.testing.__all__
    )
    assert all(getattr(plait.testing, name) is not None for name in plait.testing.__all__)
    code = "import sys, plait.testing; print('aiohttp' in sys.modules)"
    assert python(code) == "False"  # the server's HTTP stack loads with the server
