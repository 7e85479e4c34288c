"""Streaming events (seed 003 "Streaming"): `astream` on every module, against the scripted server.

What the consumer sees is asserted event by event; what was sent is asserted
on the server's request log.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest

from plait import (
    ChainOfThought,
    LLMInference,
    Module,
    OutputStreamChunk,
    Predict,
    Prediction,
    ResourceConfig,
    StreamEvent,
    ThoughtStreamChunk,
    emit_event,
    run,
)
from plait.streaming import EventStream, StreamRestart
from plait.testing import Fault, ScriptedServer


def endpoint(server: ScriptedServer, **options: Any) -> ResourceConfig:
    return ResourceConfig(
        {"*": server.endpoint(retry_base_delay=0.01, retry_max_delay=0.02, **options)}
    )


def chunks(events: list[Any], module: str, field: str = "text") -> list[Any]:
    return [
        e
        for e in events
        if isinstance(e, OutputStreamChunk) and e.module_path == module and e.field_name == field
    ]


class Views(Module):
    """Three branches in parallel, then a synthesis (fan-out, fan-in)."""

    def __init__(self) -> None:
        super().__init__()
        self.tech = LLMInference("llm", "tech")
        self.biz = LLMInference("llm", "biz")
        self.user = LLMInference("llm", "user")
        self.summary = LLMInference("llm", "summary")

    def forward(self, text: str) -> dict[str, Any]:
        notes = f"{self.tech(text)} | {self.biz(text)} | {self.user(text)}"
        return {"summary": self.summary(notes)}


async def collect(module: Module, *args: Any, **kwargs: Any) -> list[Any]:
    return [event async for event in module.astream(*args, **kwargs)]


async def test_llm_text_streams_as_the_provider_sends_it_then_the_output_comes_last() -> None:
    async with ScriptedServer(stream_pieces=4) as server:
        program = LLMInference("llm").bind(endpoint(server))
        events = await collect(program, "one two three four")
    pieces = chunks(events, "LLMInference")
    assert len(pieces) == 5  # the server's four pieces, then the closing chunk
    assert "".join(c.delta for c in pieces) == "echo: one two three four"
    assert [c.content for c in pieces[:-1]] == [
        "".join(c.delta for c in pieces[: i + 1]) for i in range(4)
    ]
    assert pieces[-1].is_complete and pieces[-1].content == "echo: one two three four"
    assert events[-1] == "echo: one two three four"
    assert server.stats.log[0].body["stream"] is True  # the provider's real stream


async def test_concurrent_branches_interleave_and_each_event_names_its_module() -> None:
    async with ScriptedServer(stream_pieces=3, latency=0.05) as server:
        program = Views().bind(endpoint(server))
        events = await collect(program, "a b c")
    modules = [e.module_path for e in events if isinstance(e, OutputStreamChunk)]
    assert set(modules) == {"tech", "biz", "user", "summary"}
    writers = {e.module_path: e.module for e in events if isinstance(e, OutputStreamChunk)}
    assert all(writers[name] is getattr(program, name) for name in modules)
    # the summary starts only after the three branches ended (it reads their text)
    first_summary = modules.index("summary")
    assert {"tech", "biz", "user"} <= set(modules[:first_summary])
    done = [e.module_path for e in events if isinstance(e, OutputStreamChunk) and e.is_complete]
    assert done[-1] == "summary"
    assert events[-1]["summary"].startswith("echo: echo: a b c")


async def test_structured_outputs_stream_per_field_and_reasoning_as_thought_chunks() -> None:
    reply = json.dumps({"reasoning": "Paris is the capital of France", "answer": "Paris"})
    async with ScriptedServer(stream_pieces=6, responder=lambda body: reply) as server:
        cot = ChainOfThought("question -> answer").bind(endpoint(server))
        events = await collect(cot, question="Capital of France?")
    thoughts = [e for e in events if isinstance(e, ThoughtStreamChunk)]
    answers = chunks(events, "ChainOfThought", "answer")
    assert "".join(t.delta for t in thoughts) == "Paris is the capital of France"
    assert thoughts[-1].is_complete and len(thoughts) > 2  # written piece by piece
    assert "".join(a.delta for a in answers) == "Paris" and answers[-1].is_complete
    assert events.index(thoughts[-1]) < events.index(answers[0])  # reasoning first
    final = events[-1]
    assert isinstance(final, Prediction) and final.answer == "Paris"


async def test_streaming_and_non_streaming_make_the_same_requests_and_results() -> None:
    async with ScriptedServer(stream_pieces=3) as server:
        program = Views().bind(endpoint(server))
        plain = await program("same input")
        streamed = (await collect(program, "same input"))[-1]
    assert streamed == plain

    def request(body: dict[str, Any]) -> Any:
        return {k: v for k, v in body.items() if k not in ("stream", "stream_options")}

    log = [r.body for r in server.stats.log]
    assert len(log) == 8
    assert sorted(map(json.dumps, map(request, log[:4]))) == sorted(
        map(json.dumps, map(request, log[4:]))
    )


async def test_a_cached_reply_streams_as_one_chunk_and_costs_no_request(tmp_path) -> None:
    async with ScriptedServer(stream_pieces=4) as server:
        config = endpoint(server, cache=str(tmp_path / "c.sqlite"))
        program = LLMInference("llm", temperature=0.0).bind(config)
        first = await collect(program, "x y z")
        again = await collect(program, "x y z")
    assert server.stats.requests == 1
    assert len(chunks(first, "LLMInference")) > 2
    replay = chunks(again, "LLMInference")
    assert [c.delta for c in replay] == ["echo: x y z", ""] and again[-1] == first[-1]


async def test_a_stream_that_breaks_is_retried_and_the_consumer_is_told_to_restart() -> None:
    async with ScriptedServer(stream_pieces=4) as server:
        server.inject(Fault(kind="drop", after_chunks=2, times=1))
        program = LLMInference("llm").bind(endpoint(server, max_retries=2))
        events = await collect(program, "alpha beta gamma")
    restart = [e for e in events if isinstance(e, StreamRestart)]
    assert len(restart) == 1 and restart[0].module_path == "LLMInference"
    assert restart[0].module is program
    after = events[events.index(restart[0]) + 1 :]
    text = "".join(c.delta for c in chunks(after, "LLMInference"))
    assert text == "echo: alpha beta gamma"  # no duplicated text after the restart
    assert events[-1] == "echo: alpha beta gamma" and server.stats.requests == 2


async def test_an_invalid_structured_reply_restarts_before_the_reask() -> None:
    replies = iter(['{"answer": "not a number"}', '{"answer": 42}'])
    async with ScriptedServer(responder=lambda body: next(replies)) as server:
        predict = Predict("question -> answer: int").bind(endpoint(server))
        events = await collect(predict, question="6 x 7?")
    assert any(isinstance(e, StreamRestart) for e in events)
    assert events[-1].answer == 42


@dataclass
class Progress(StreamEvent):
    step: str


class Steps(Module):
    """An async leaf that reports its own progress and then calls a model."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm")

    async def forward(self, text: str) -> str:
        emit_event(Progress("started"))  # without await: still delivered
        await emit_event(Progress("asking"))
        return await self.llm(text)


async def test_user_events_come_from_anywhere_inside_and_emit_is_free_when_not_streaming() -> None:
    async with ScriptedServer() as server:
        program = Steps().bind(endpoint(server))
        events = await collect(program, "hi")
        assert [e.step for e in events if isinstance(e, Progress)] == ["started", "asking"]
        assert await program("hi") == "echo: hi"  # not streaming: emit_event is a no-op


async def test_breaking_out_cancels_the_program_and_its_requests() -> None:
    async with ScriptedServer(latency=30.0) as server:
        program = Steps().bind(endpoint(server))
        async for event in program.astream("slow"):
            assert isinstance(event, Progress)
            break
        for _ in range(100):
            if server.stats.in_flight == 0 and server.stats.requests <= 1:
                break
            await asyncio.sleep(0.02)
    assert server.stats.in_flight == 0


async def test_a_slow_consumer_holds_producers_back_with_a_bounded_queue() -> None:
    stream = EventStream(maxsize=4)
    waits = [stream.put(Progress(str(i))) for i in range(10)]
    pending = [w for w in waits if isinstance(w, asyncio.Future) and not w.done()]
    assert len(pending) == 6  # everything past the bound waits for the consumer
    for _ in range(10):
        await stream.get()
    assert all(w.done() for w in pending)


async def test_a_slow_consumer_of_a_long_stream_keeps_memory_flat() -> None:
    from plait import _context

    words = " ".join(f"w{i}" for i in range(3000))
    async with ScriptedServer(stream_pieces=3000) as server:
        config = endpoint(server)
        stream = EventStream(maxsize=16)
        token = _context.STREAM.set(stream)
        try:
            task = asyncio.create_task(run(Views(), words, resources=config))
        finally:
            _context.STREAM.reset(token)
        task.add_done_callback(lambda _: stream.close())
        held, count = 0, 0
        while await stream.get() is not None:
            held = max(held, len(stream))
            count += 1
            if count % 50 == 0:
                await asyncio.sleep(0.005)  # a consumer busy with other work
        await task
    assert count > 10_000  # thousands of pieces of four streamed replies went through
    assert held <= 16 + 4  # the bound, plus at most one event per concurrent producer


async def test_a_failing_program_raises_after_the_events_it_emitted() -> None:
    async with ScriptedServer() as server:
        server.inject(Fault(status=400))
        program = Steps().bind(endpoint(server))
        seen: list[Any] = []
        with pytest.raises(Exception, match="HTTP 400"):
            async for event in program.astream("x"):
                seen.append(event)
    assert [e.step for e in seen] == ["started", "asking"]


async def test_astream_refuses_a_batch_with_the_way_to_stream_one() -> None:
    async with ScriptedServer() as server:
        program = LLMInference("llm").bind(endpoint(server))
        with pytest.raises(TypeError, match="streaming=True"):
            async for _ in program.astream(["a", "b"]):
                pass


async def test_run_of_an_unbound_program_still_works_for_streamed_settings() -> None:
    async with ScriptedServer() as server:
        assert await run(LLMInference("llm"), "x", resources=endpoint(server)) == "echo: x"
