"""Seed 003 (udspy): its signatures, adapter, tools, history and call conventions, run on plait.

Each test is a snippet of the seed, changed only where plait's resources need
it (said in a comment): ``lm=`` is an endpoint of the scripted server, not an
OpenAI key. Streaming, confirmation, callbacks and settings are in
``test_seed003_interaction.py``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

import pytest
from pydantic import Field

import plait
from plait import (
    ChainOfThought,
    History,
    InputField,
    Module,
    OutputField,
    OutputStreamChunk,
    Predict,
    Prediction,
    Signature,
    StreamEvent,
    ValueKind,
    emit_event,
    tool,
)
from plait.signatures import ChatAdapter, JSONAdapter, make_signature
from plait.testing import ScriptedServer, server_in_thread
from plait.tools import ToolCallError


@pytest.fixture(autouse=True)
def _reset_settings():
    yield
    plait.settings.reset()


class QA(Signature):
    """Answer questions concisely."""  # ← Instructions (docstring)

    question: str = InputField(description="User's question")  # ← Input
    answer: str = OutputField(description="Concise answer")  # ← Output


# ------------------------------------------------------------------- signatures
def test_field_extraction_snippet() -> None:
    inputs = QA.get_input_fields()  # {"question": FieldInfo(...)}
    outputs = QA.get_output_fields()  # {"answer": FieldInfo(...)}
    assert list(inputs) == ["question"] and inputs["question"].description == "User's question"
    assert list(outputs) == ["answer"] and outputs["answer"].annotation is str
    assert QA.get_instructions() == "Answer questions concisely."


def test_dynamic_creation_snippet() -> None:
    # String format (all fields are str)
    from_string = Signature.from_string("question -> answer", "Answer questions")
    # Programmatic (custom types)
    programmatic = make_signature(
        input_fields={"question": str},
        output_fields={"answer": str},
        instructions="Answer questions",
    )
    assert programmatic == from_string
    assert programmatic.get_instructions() == "Answer questions"

    typed = make_signature(
        input_fields={"question": (str, "The question")},
        output_fields={"count": (int, OutputField(description="How many"))},
    )
    assert typed.input_fields["question"].description == "The question"
    assert typed.output_fields["count"].annotation is int
    with pytest.raises(TypeError, match=r"output_fields\['count'\] is marked InputField"):
        make_signature(output_fields={"count": (int, InputField())})


# ---------------------------------------------------------------------- adapter
def test_adapter_methods_snippet() -> None:
    adapter = JSONAdapter()
    system = adapter.format_instructions(QA)  # Signature → system message
    assert system.startswith("Answer questions concisely.") and "- question (str)" in system
    assert adapter.format_inputs(QA, {"question": "What is Python?"}) == (
        "question: What is Python?"  # Inputs → user message
    )
    assert adapter.parse_outputs(QA, '{"answer": "A language"}') == {"answer": "A language"}


def test_format_tool_schema_snippet() -> None:
    @tool(name="calculator", description="Perform arithmetic")
    def calculator(
        operation: str = Field(description="add, subtract, multiply, divide"),
        a: float = Field(description="First number"),
        b: float = Field(description="Second number"),
    ) -> float:
        """Perform arithmetic operations."""
        ops = {"add": a + b, "subtract": a - b}
        return ops[operation]

    adapter = ChatAdapter()
    schema = adapter.format_tool_schema(calculator)
    assert schema == {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Perform arithmetic",
            "parameters": calculator.parameters,  # Tool provides this
        },
    }
    assert calculator.parameters["required"] == ["operation", "a", "b"]
    assert calculator.parameters["properties"]["a"] == {
        "type": "number",
        "description": "First number",
    }


# ------------------------------------------------------------------------ tools
async def test_tool_acall_snippet() -> None:
    @tool(name="search", description="Search the web")
    def search(query: str = Field(description="Search query")) -> str:
        return f"results for {query}"

    # In Predict's tool loop: result = await tool.acall(**tc.arguments)
    arguments = {"query": "plait"}
    result = await search.acall(**arguments)
    assert result == "results for plait"
    with pytest.raises(ToolCallError, match="invalid arguments for tool 'search'") as info:
        await search.acall(q="plait")
    assert info.value.result.error == "invalid_arguments"

    @tool
    async def fails(x: int) -> int:
        """Fails."""
        raise LookupError(f"nothing at {x}")

    with pytest.raises(LookupError, match="nothing at 3"):  # the tool's own exception
        await fails.acall(x=3)


def calculator_tool() -> Any:
    @tool(name="calculator", description="Perform arithmetic")
    def calculator(
        operation: str = Field(description="add, subtract, multiply, divide"),
        a: float = Field(description="First number"),
        b: float = Field(description="Second number"),
    ) -> float:
        """Perform arithmetic operations."""
        ops = {"add": a + b, "subtract": a - b}
        return ops[operation]

    return calculator


def add_then_answer(body: dict[str, Any]) -> Any:
    """The model: asks the calculator, then answers with what it returned."""
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if not results:
        call = {"name": "calculator", "arguments": {"operation": "add", "a": 2, "b": 3}}
        return {"content": "", "tool_calls": [call]}
    return json.dumps({"answer": results[-1]})


async def test_predict_runs_the_tool_loop_snippet() -> None:
    # Tools lifecycle: LLM returns tool calls, Predict executes them, loop until final answer
    async with ScriptedServer(responder=add_then_answer) as server:
        plait.settings.configure(lm=server.endpoint())
        predictor = Predict("question -> answer", tools=[calculator_tool()])
        result = await predictor(question="What is 2 + 3?")
        sent = [record.body for record in server.stats.log]
    assert result.is_final and result.answer == "5.0"
    assert [step.tool for step in result.trajectory] == ["calculator"]
    assert [[t["function"]["name"] for t in body["tools"]] for body in sent] == [["calculator"]] * 2
    assert sent[1]["messages"][-1] == {
        "role": "tool",
        "content": "5.0",
        "tool_call_id": sent[1]["messages"][-2]["tool_calls"][0]["id"],
        "name": "calculator",
    }
    assert len(predictor.traces()) == 2  # each turn is traced on the Predict


async def test_tool_invocation_results_are_tool_result_values_snippet() -> None:
    # Seed 001: "Tool invocation results: Value(TOOL_RESULT) to standardize outputs".
    async with ScriptedServer(responder=add_then_answer) as server:
        plait.settings.configure(lm=server.endpoint())
        result = await Predict("question -> answer", tools=[calculator_tool()])(question="2+3?")
    (value,) = [step.as_value() for step in result.trajectory]
    assert value.kind is ValueKind.TOOL_RESULT and value.payload == "5.0"
    assert value.meta["tool"] == "calculator" and value.meta["ok"] is True
    assert value.meta["args"] == {"operation": "add", "a": 2, "b": 3}


async def test_predict_with_auto_execute_tools_false_does_one_step() -> None:
    async with ScriptedServer(responder=add_then_answer) as server:
        plait.settings.configure(lm=server.endpoint())
        predictor = Predict("question -> answer", tools=[calculator_tool()])
        step = await predictor(question="What is 2 + 3?", auto_execute_tools=False)
    assert step.is_final is False and step.native_tool_calls[0].name == "calculator"
    assert len(server.stats.log) == 1


async def test_predict_answers_without_tools_once_its_turns_run_out() -> None:
    def always_calls(body: dict[str, Any]) -> Any:
        if not body.get("tools"):
            return '{"answer": "gave up calling"}'
        call = {"name": "calculator", "arguments": {"operation": "add", "a": 1, "b": 1}}
        return {"content": "", "tool_calls": [call]}

    async with ScriptedServer(responder=always_calls) as server:
        plait.settings.configure(lm=server.endpoint())
        predictor = Predict("question -> answer", tools=[calculator_tool()], max_turns=2)
        result = await predictor(question="1 + 1?")
        sent = [record.body for record in server.stats.log]
    assert result.answer == "gave up calling" and len(result.trajectory) == 2
    assert [bool(body.get("tools")) for body in sent] == [True, True, False]


# ---------------------------------------------------------------------- history
def test_history_methods() -> None:
    history = History()
    history.add_system_message("You are terse.")
    history.add_user_message("hi")
    history.add_assistant_message(
        "",
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    )
    history.add_tool_result("c1", "42")
    history.set_system_message("You are very terse.")  # Always at position 0
    assert list(history.messages) == [
        {"role": "system", "content": "You are very terse."},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]
    assert history.messages[0]["role"] == "system" and dict(history.messages[1]) == {
        "role": "user",
        "content": "hi",
    }
    with pytest.raises(ValueError, match=r"use history.set_system_message"):
        history.add_system_message("late")  # plait keeps one system turn, first


def test_history_usage_snippet() -> None:
    replies = iter(['{"answer": "A programming language"}', '{"answer": "Readable, dynamic"}'])
    with server_in_thread(responder=lambda body: next(replies)) as server:
        plait.settings.configure(lm=server.endpoint())  # plait: an endpoint, not an API key
        predictor = Predict(QA)
        history = History()

        # First turn
        result = predictor(question="What is Python?", history=history)
        roles = [m["role"] for m in history.messages]
        # History now contains: [system, user, assistant]
        assert roles == ["system", "user", "assistant"]
        assert history.messages[0]["content"] == JSONAdapter().format_instructions(QA)
        assert history.messages[1] == {"role": "user", "content": "question: What is Python?"}
        assert result.answer == "A programming language"

        # Second turn (context preserved)
        result = predictor(question="What are its features?", history=history)
        second = server.stats.log[1].body["messages"]

    assert result.answer == "Readable, dynamic"
    # LLM sees full conversation history, with one system turn (the task is not doubled)
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[0]["content"].count("Answer questions concisely.") == 1
    assert [m["role"] for m in history.messages] == ["system", *["user", "assistant"] * 2]


async def test_a_restored_history_does_not_repeat_the_task() -> None:
    async with ScriptedServer(responder=lambda body: '{"answer": "ok"}') as server:
        plait.settings.configure(lm=server.endpoint())
        predictor = Predict(QA)
        history = History("Be kind.")
        await predictor(question="one?", history=history)
        restored = History.from_list(history.to_list())  # saved and loaded as JSON
        await predictor(question="two?", history=restored)
    system = server.stats.log[1].body["messages"][0]["content"]
    assert system.startswith("Be kind.") and system.count("Answer questions concisely.") == 1


# ------------------------------------------------------------- call conventions
async def test_aforward_and_acall_snippet() -> None:
    async with ScriptedServer(responder=lambda body: '{"answer": "AI is software."}') as server:
        plait.settings.configure(lm=server.endpoint())
        predictor = Predict("question -> answer")
        result = await predictor.aforward(question="What is AI?")
        print(result.answer)  # Just the final answer
        again = await predictor.acall(question="What is AI?")
    assert isinstance(result, Prediction) and result.answer == again.answer == "AI is software."

    class Shout(Module):  # no LLM inside: its direct call is not awaitable, aforward still is
        def forward(self, text: str) -> str:
            return text.upper()

    assert await Shout().aforward("hi") == "HI"


def test_a_call_from_synchronous_code_returns_the_result() -> None:
    # udspy: `result = predictor(question=...)` in a script, with no event loop running.
    with server_in_thread(responder=lambda body: '{"answer": "4"}') as server:
        plait.settings.configure(lm=server.endpoint())
        predictor = Predict("question -> answer")
        result = predictor(question="2+2?")
        batch = predictor([{"question": "1+3?"}, {"question": "2*2?"}])
    assert isinstance(result, Prediction) and result.answer == "4"
    assert [p.answer for p in batch] == ["4", "4"]


def test_predictor_forward_snippet() -> None:
    # udspy: `forward(self, **inputs)` is the synchronous entry point ("Sync wrapper").
    with server_in_thread(responder=lambda body: '{"answer": "4"}') as server:
        plait.settings.configure(lm=server.endpoint())
        predictor = Predict("question -> answer")
        result = predictor.forward(question="2+2?")
    assert isinstance(result, Prediction) and result.answer == "4"
    assert server.stats.requests == 1


class Exclaim(Module):
    async def forward(self, text: str) -> str:
        return text + "!"


def test_an_async_module_without_resources_is_refused_at_the_call() -> None:
    # Not a coroutine that nothing runs: one line naming the fix, at the call.
    with pytest.raises(
        plait.PlaitError,
        match=r"Exclaim.forward is async and Exclaim has no "
        r"resources.*module.bind\(config\).*asyncio.run\(module.aforward",
    ):
        Exclaim()("hi")
    with pytest.raises(plait.PlaitError, match="has no resources"):
        Predict("question -> answer").forward(question="2+2?")
    assert asyncio.run(Exclaim().aforward("hi")) == "hi!"  # the fix it names, for no LLM calls

    async def streamed() -> list[Any]:
        return [event async for event in Exclaim().astream("hi")]

    with pytest.raises(plait.PlaitError, match=r"Exclaim has no resources: bind them"):
        asyncio.run(streamed())


async def test_an_async_module_without_resources_is_awaitable_inside_a_loop() -> None:
    assert await Exclaim()("hi") == "hi!"
    assert await Exclaim().forward("hi") == "hi!"  # inside a loop, forward stays a coroutine


async def test_a_call_inside_a_running_loop_is_awaitable() -> None:
    async with ScriptedServer(responder=lambda body: '{"answer": "4"}') as server:
        plait.settings.configure(lm=server.endpoint())
        predictor = Predict("question -> answer")
        pending = predictor(question="2+2?")  # plait's own convention: await module(x)
        assert inspect.isawaitable(pending)
        assert (await pending).answer == "4"

        async def from_a_task() -> Any:
            return await predictor(question="2+2?")

        assert (await asyncio.create_task(from_a_task())).answer == "4"


# ------------------------------------------------------------ writing modules
class Signature1(Signature):
    """Restate the question as a short topic."""

    question: str = InputField()
    output: str = OutputField()


class Signature2(Signature):
    """Answer about the topic."""

    input: str = InputField()
    answer: str = OutputField()


def two_step_responder(body: dict[str, Any]) -> str:
    user = body["messages"][-1]["content"]
    if user.startswith("question:"):
        return '{"output": "capital of France"}'
    return '{"reasoning": "It is Paris.", "answer": "Paris"}'


class Pipeline(Module):
    def __init__(self):  # udspy's examples never call super().__init__()
        self.step1 = Predict(Signature1)
        self.step2 = ChainOfThought(Signature2)

    async def forward(self, *, stream: bool = False, **inputs):  # udspy: aexecute
        # Get result from first module (don't stream intermediate steps)
        result1 = await self.step1.aforward(**inputs)

        # Stream final module if requested
        result2 = await self.step2.aforward(
            input=result1.output,
            stream=stream,  # Pass down stream parameter
        )

        return Prediction(final=result2.answer)


def test_a_module_that_skips_super_init_registers_its_children() -> None:
    pipeline = Pipeline()
    assert [name for name, _ in pipeline.named_children()] == ["step1", "step2"]
    assert {name for name, _ in pipeline.named_parameters()} >= {
        "step1.instructions",
        "step2.instructions",
    }
    assert pipeline.step2.instructions.path == "step2.instructions"
    assert pipeline.training is False and pipeline.copy().step1 is not pipeline.step1


async def test_composing_modules_snippet() -> None:
    async with ScriptedServer(responder=two_step_responder) as server:
        plait.settings.configure(lm=server.endpoint())
        pipeline = Pipeline()
        result = await pipeline.aforward(question="Which city is France's capital?")
        events = [event async for event in pipeline.astream(question="And again?")]
    assert isinstance(result, Prediction) and result.final == "Paris"
    assert server.stats.log[1].body["messages"][-1]["content"] == "input: capital of France"
    # astream gives forward stream=True (udspy's astream -> aexecute(stream=True)):
    # step2 streams, step1 was asked not to
    chunks = [e for e in events if isinstance(e, OutputStreamChunk)]
    assert chunks and {e.module_path for e in chunks} == {"step2"}
    assert all(e.module is pipeline.step2 for e in chunks)
    assert isinstance(events[-1], Prediction) and events[-1].final == "Paris"


class MyModule(Module):
    def __init__(self, signature):
        self.signature = signature
        self.predictor = Predict(signature)

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {name: value.strip() for name, value in inputs.items()}

    def postprocess(self, result: Prediction) -> dict[str, Any]:
        return {"answer": result.answer.upper()}

    async def forward(self, *, stream: bool = False, **inputs):  # udspy: aexecute
        # Custom pre-processing
        processed = self.preprocess(inputs)

        # Call nested module
        result = await self.predictor.aforward(**processed)

        # Custom post-processing
        final = self.postprocess(result)

        # Anything listening to stream gets this chunk
        emit_event(
            OutputStreamChunk(
                module=self,
                field_name="answer",
                delta=final["answer"],
                content=final["answer"],
                is_complete=True,
            )
        )

        # Return final prediction
        return Prediction(**final)


async def test_adding_a_new_module_snippet() -> None:
    async with ScriptedServer(responder=lambda body: '{"answer": "paris"}') as server:
        plait.settings.configure(lm=server.endpoint())
        module = MyModule(QA)
        assert (await module.aforward(question="  Capital of France?  ")).answer == "PARIS"
        events = [event async for event in module.astream(question="Capital of France?")]
    assert server.stats.log[0].body["messages"][-1]["content"] == "question: Capital of France?"
    # the predictor's own chunks stay out (aforward does not stream): one chunk, then the result
    assert [type(e) for e in events] == [OutputStreamChunk, Prediction]
    chunk, final = events
    assert chunk.module is module and chunk.module_path == "MyModule"
    assert (chunk.field_name, chunk.delta, chunk.content, chunk.is_complete) == (
        "answer",
        "PARIS",
        "PARIS",
        True,
    )
    assert all(isinstance(event, StreamEvent) for event in events) and final.answer == "PARIS"


async def test_a_module_written_with_aexecute_is_told_to_name_it_forward() -> None:
    class Udspy(Module):
        def __init__(self):
            self.predictor = Predict(QA)

        async def aexecute(self, *, stream: bool = False, **inputs):
            return await self.predictor.aforward(**inputs)

    with pytest.raises(NotImplementedError) as info:
        await Udspy().aforward(question="q?")
    assert "Udspy defines aexecute()" in str(info.value)
    assert "async def forward(self, *, stream=False, **inputs)" in str(info.value)


async def test_aforward_stream_false_keeps_a_call_out_of_the_stream() -> None:
    class Quiet(Module):
        def __init__(self) -> None:
            self.inner = Predict(QA)

        async def forward(self, question: str) -> Prediction:
            loud = await self.inner.aforward(question=question, stream=True)
            await self.inner.aforward(question=question, stream=False)
            await self.inner.aforward(question=question)  # udspy: aforward does not stream
            return loud

    async with ScriptedServer(responder=lambda body: '{"answer": "ok"}') as server:
        plait.settings.configure(lm=server.endpoint())
        events = [event async for event in Quiet().astream(question="q?")]
    chunks = [e for e in events if isinstance(e, OutputStreamChunk)]
    assert [c.content for c in chunks if c.is_complete] == ["ok"]  # one call streamed
    assert [r.body.get("stream", False) for r in server.stats.log] == [True, False, False]
