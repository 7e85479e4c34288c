"""Callbacks (seed 003 "Callbacks", DSPy's hook names) and the OpenTelemetry callback.

Every program runs against the scripted server; what the callbacks saw is
compared with what the server saw.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import plait
from plait import (
    BaseCallback,
    LLMInference,
    Module,
    Predict,
    ReAct,
    ResourceConfig,
    run,
    tool,
)
from plait.callbacks import call_path
from plait.testing import Fault, ScriptedServer


class Recorder(BaseCallback):
    """Writes down every hook call: (hook, call_id, payload)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("on_"):

            def hook(call_id: str, *rest: Any) -> None:
                object.__getattribute__(self, "calls").append((name, call_id, rest))

            return hook
        return object.__getattribute__(self, name)

    def hooks(self) -> list[str]:
        return [name for name, _, _ in self.calls]


class Pipeline(Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = LLMInference("llm", "first")
        self.second = LLMInference("llm", "second")

    def forward(self, text: str) -> str:
        return self.second(self.first(text))


def config_of(server: ScriptedServer, **options: Any) -> ResourceConfig:
    return ResourceConfig({"*": server.endpoint(max_retries=0, **options)})


async def test_module_and_lm_hooks_pair_start_and_end_by_call_id() -> None:
    recorder = Recorder()
    async with ScriptedServer() as server:
        with plait.settings.context(callbacks=[recorder]):
            output = await run(Pipeline(), "hi", resources=config_of(server))
    assert output == "echo: echo: hi"
    starts = {cid: name for name, cid, _ in recorder.calls if name.endswith("_start")}
    ends = {cid: name for name, cid, _ in recorder.calls if name.endswith("_end")}
    assert set(starts) == set(ends) and len(starts) == 5  # program, 2 nodes, 2 LLM calls
    assert sorted(starts.values()) == ["on_lm_start"] * 2 + ["on_module_start"] * 3
    lm_inputs = [rest[1] for name, _, rest in recorder.calls if name == "on_lm_start"]
    assert [i["messages"][0]["content"] for i in lm_inputs] == ["first", "second"]
    assert all(i["alias"] == "llm" and i["model"] == "scripted-model" for i in lm_inputs)
    lm_outputs = [rest[0] for name, _, rest in recorder.calls if name == "on_lm_end"]
    assert [o.text for o in lm_outputs] == ["echo: hi", "echo: echo: hi"]
    assert all(o.usage.output_tokens > 0 for o in lm_outputs)
    program_end = [rest for name, _, rest in recorder.calls if name == "on_module_end"][-1]
    assert program_end == ("echo: echo: hi", None)


async def test_a_failing_call_reports_its_exception_and_a_raising_callback_breaks_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(BaseCallback):
        def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
            raise RuntimeError("callback bug")

    recorder = Recorder()
    async with ScriptedServer() as server:
        server.inject(Fault(status=400, times=1))
        with plait.settings.context(callbacks=[Broken(), recorder]):
            with pytest.raises(plait.errors.BackendError, match="HTTP 400"):
                await run(LLMInference("llm"), "x", resources=config_of(server))
            assert await run(LLMInference("llm"), "y", resources=config_of(server)) == "echo: y"
    failed = next(rest for name, _, rest in recorder.calls if name == "on_lm_end")
    assert failed[0] is None and "HTTP 400" in str(failed[1])
    assert any("callback bug" in r.getMessage() or r.exc_info for r in caplog.records)


async def test_adapter_and_tool_hooks_use_dspy_names() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Adds two numbers."""
        return a + b

    replies = iter(
        [
            {"content": "", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
            '{"answer": "5"}',
        ]
    )
    recorder = Recorder()
    async with ScriptedServer(responder=lambda body: next(replies)) as server:
        agent = ReAct("question -> answer", tools=[add])
        with plait.settings.context(callbacks=[recorder]):
            assert (await run(agent, question="2+3?", resources=config_of(server))).answer == "5"
    hooks = recorder.hooks()
    assert hooks.count("on_tool_start") == 1 and hooks.count("on_tool_end") == 1
    tool_end = next(rest for name, _, rest in recorder.calls if name == "on_tool_end")
    assert tool_end[0].content == "5" and tool_end[1] is None

    recorder.calls.clear()
    async with ScriptedServer(responder=lambda body: '{"answer": "4"}') as server:
        with plait.settings.context(callbacks=[recorder]):
            await run(Predict("question -> answer"), question="2+2?", resources=config_of(server))
    hooks = recorder.hooks()
    for hook in ("format", "parse"):
        assert f"on_adapter_{hook}_start" in hooks and f"on_adapter_{hook}_end" in hooks
    parse_start = [rest for name, _, rest in recorder.calls if name == "on_adapter_parse_start"]
    assert parse_start[0][1]["completion"] == '{"answer": "4"}'


async def test_callbacks_configured_globally_per_context_and_per_module() -> None:
    everywhere, scoped, own = Recorder(), Recorder(), Recorder()
    async with ScriptedServer() as server:
        program = Pipeline()
        program.second.callbacks = [own]
        plait.settings.configure(callbacks=[everywhere])
        try:
            await run(program, "a", resources=config_of(server))
            with plait.settings.context(callbacks=[scoped]):  # a context replaces the global
                await run(program, "b", resources=config_of(server))
        finally:
            plait.settings.reset()
        await run(program, "c", resources=config_of(server))
    assert everywhere.hooks().count("on_lm_start") == 2
    assert scoped.hooks().count("on_lm_start") == 2
    # the module's own callback saw its call and the LLM call inside it, in all three runs
    assert own.hooks().count("on_module_start") == 3 and own.hooks().count("on_lm_start") == 3


async def test_open_telemetry_spans_follow_the_gen_ai_conventions_and_nest() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from plait.report.telemetry import OpenTelemetryCallback

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with ScriptedServer() as server:
        with plait.settings.context(callbacks=[OpenTelemetryCallback(provider)]):
            await run(Pipeline(), "secret words", resources=config_of(server))
    spans = {span.name: span for span in exporter.get_finished_spans()}
    chat = [s for s in exporter.get_finished_spans() if s.name == "chat scripted-model"]
    assert len(chat) == 2
    attributes = chat[0].attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.usage.output_tokens"] > 0
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert "gen_ai.input.messages" not in attributes  # content only when asked for
    root = spans["Pipeline"]
    nodes = [s for s in exporter.get_finished_spans() if s.name.startswith("LLMInference")]
    assert {s.name for s in nodes} == {"LLMInference first", "LLMInference second"}
    assert all(s.parent.span_id == root.context.span_id for s in nodes)
    assert {s.parent.span_id for s in chat} == {s.context.span_id for s in nodes}

    exporter.clear()
    async with ScriptedServer() as server:
        callback = OpenTelemetryCallback(provider, capture_content=True)
        with plait.settings.context(callbacks=[callback]):
            await run(LLMInference("llm"), "secret words", resources=config_of(server))
    chat = next(s for s in exporter.get_finished_spans() if s.name.startswith("chat"))
    assert "secret words" in chat.attributes["gen_ai.input.messages"]
    assert json.loads(chat.attributes["gen_ai.output.messages"])[0]["content"] == (
        "echo: secret words"
    )


async def test_evaluate_hooks_bracket_the_run_and_carry_its_result() -> None:
    recorder = Recorder()
    data = [("a", "echo: echo: a"), ("b", "wrong")]
    async with ScriptedServer() as server:
        with plait.settings.context(callbacks=[recorder]):
            result = await plait.evaluate(Pipeline(), data, resources=config_of(server))
    assert result == 0.5
    hooks = recorder.hooks()
    assert hooks[0] == "on_evaluate_start" and hooks[-1] == "on_evaluate_end"
    assert hooks.count("on_lm_start") == 4  # the programs' calls are heard inside it
    _, start_id, (program, inputs) = recorder.calls[0]
    assert isinstance(program, Pipeline) and inputs["devset"] == data
    _, end_id, (outputs, exception) = recorder.calls[-1]
    assert end_id == start_id and outputs is result and exception is None


async def test_evaluate_end_hears_the_exception_that_stopped_it() -> None:
    recorder = Recorder()

    def broken_metric(output: Any, target: Any) -> Any:
        return object()  # not a score

    async with ScriptedServer() as server:
        with plait.settings.context(callbacks=[recorder]), pytest.raises(TypeError):
            await plait.evaluate(
                Pipeline(), [("a", "x")], broken_metric, resources=config_of(server)
            )
    _, _, (outputs, exception) = recorder.calls[-1]
    assert recorder.hooks()[-1] == "on_evaluate_end"
    assert outputs is None and isinstance(exception, TypeError)


async def test_a_tool_that_raises_and_a_module_that_fails_report_their_exceptions() -> None:
    @tool
    def divide(a: int, b: int) -> float:
        """Divides a by b."""
        return a / b

    class Failing(Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = LLMInference("llm")

        def forward(self, text: str) -> str:
            return self.llm(text)

    class EndRecorder(BaseCallback):
        def __init__(self) -> None:
            self.calls: list[tuple[str, str, Any]] = []

        def on_tool_end(self, call_id: str, outputs: Any, exception: Any = None) -> None:
            self.calls.append(("on_tool_end", call_id, (outputs, exception)))

        def on_module_end(self, call_id: str, outputs: Any, exception: Any = None) -> None:
            self.calls.append(("on_module_end", call_id, (outputs, exception, call_path())))

    recorder = EndRecorder()
    with plait.settings.context(callbacks=[recorder]):
        result = await divide.call('{"a": 1, "b": 0}', call_id="c1")
    assert result.ok is False and isinstance(result.exception, ZeroDivisionError)
    tool_end = next(rest for name, _, rest in recorder.calls if name == "on_tool_end")
    assert tool_end[0] is result and tool_end[1] is result.exception

    recorder.calls.clear()
    async with ScriptedServer() as server:
        server.inject(Fault(status=400, times=1))
        with (
            plait.settings.context(callbacks=[recorder]),
            pytest.raises(plait.errors.BackendError, match="HTTP 400"),
        ):
            await run(Failing(), "x", resources=config_of(server))
    module_ends = [rest for name, _, rest in recorder.calls if name == "on_module_end"]
    assert module_ends and all(outputs is None for outputs, _, _ in module_ends)
    assert all("HTTP 400" in str(exception) for _, exception, _ in module_ends)
    # The end hook runs inside the call, so it still names the module ("" is the program).
    assert sorted(path for _, _, path in module_ends) == ["", "llm"]


def span_texts(span: Any) -> str:
    """Everything a span carries as text: status, attributes, events and their attributes."""
    texts = [span.name, str(span.status.description), json.dumps(dict(span.attributes))]
    for event in span.events:
        texts += [event.name, json.dumps(dict(event.attributes))]
    return "\n".join(texts)


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
async def test_an_error_body_echoing_the_prompt_stays_out_of_spans_unless_content_is_captured(
    streamed: bool,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from plait.report.telemetry import OpenTelemetryCallback

    echo = Fault(status=400, message="your prompt 'secret words' is not allowed")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for capture in (False, True):
        exporter.clear()
        async with ScriptedServer(faults=[echo]) as server:
            callback = OpenTelemetryCallback(provider, capture_content=capture)
            program = LLMInference("llm")
            with (
                plait.settings.context(callbacks=[callback]),
                pytest.raises(plait.errors.BackendError, match="secret words"),
            ):
                if streamed:
                    async for _ in program.astream("secret words", resources=config_of(server)):
                        pass
                else:
                    await run(program, "secret words", resources=config_of(server))
        spans = exporter.get_finished_spans()
        chat = next(span for span in spans if span.name.startswith("chat"))
        if capture:
            assert "'secret words' is not allowed" in chat.status.description
            continue
        assert all("secret words" not in span_texts(span) for span in spans), [
            span_texts(span) for span in spans
        ]
        assert "HTTP 400" in chat.status.description and "alias 'llm'" in chat.status.description
        assert chat.attributes["error.type"] == "BackendError"
        assert chat.attributes["http.response.status_code"] == 400
        assert chat.events[0].name == "exception"
