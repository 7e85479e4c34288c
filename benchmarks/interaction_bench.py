"""Interaction-layer benchmark: streaming latency and throughput, and what callbacks cost.

Against the scripted server in its own process (loopback), prints:

1. time to first token: ``LLMInference.astream`` vs the backend's own ``stream``
   (same request, same server), median over sequential calls; the goal is
   at most +5 ms for the whole event path (scheduler, manager, field splitting,
   event queue);
2. events per second through a 3-branch program streaming many small pieces;
3. client CPU per call of a 2,000-call batch with no callback configured, with a
   no-op callback on every hook, and with the OpenTelemetry callback (when
   installed) — the first is the figure to compare with ``scheduler_bench.py``
   before the interaction layer existed (goal: no measurable difference).

    python benchmarks/interaction_bench.py [--calls 2000] [--ttft-runs 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import plait
from plait import BaseCallback, LLMInference, Module, OutputStreamChunk, ResourceConfig, run
from plait.backends.openai import OpenAICompatBackend
from plait.backends.types import Message, Request
from plait.testing import start_server_process


def config_for(base_url: str) -> ResourceConfig:
    return ResourceConfig(
        {"*": {"provider": "openai", "model": "bench", "base_url": base_url, "api_key": "k"}}
    )


async def ttft_backend(base_url: str, runs: int) -> list[float]:
    backend = OpenAICompatBackend("bench", base_url=base_url, api_key="k")
    request = Request(messages=(Message("user", "a b c d e f g h"),))
    times = []
    try:
        for _ in range(runs):
            started = time.perf_counter()
            async for chunk in backend.stream(request):
                if chunk.text:
                    times.append(time.perf_counter() - started)
                    break
    finally:
        await backend.aclose()
    return times


async def ttft_astream(base_url: str, runs: int) -> list[float]:
    program = LLMInference("llm").bind(config_for(base_url))
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        async for event in program.astream("a b c d e f g h"):
            if isinstance(event, OutputStreamChunk) and event.delta:
                times.append(time.perf_counter() - started)
                break
    return times


class ThreeBranches(Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = LLMInference("llm", "a")
        self.b = LLMInference("llm", "b")
        self.c = LLMInference("llm", "c")

    def forward(self, text: str) -> list[Any]:
        return [self.a(text), self.b(text), self.c(text)]


async def events_per_second(base_url: str, rounds: int) -> tuple[float, int]:
    program = ThreeBranches().bind(config_for(base_url))
    words = " ".join(f"w{i}" for i in range(200))
    count = 0
    started = time.perf_counter()
    for _ in range(rounds):
        async for _event in program.astream(words):
            count += 1
    return count / (time.perf_counter() - started), count


class NoOp(BaseCallback):
    """Every hook does nothing (what a do-nothing integration costs)."""


async def batch_cpu(base_url: str, calls: int, callbacks: list[Any] | None) -> float:
    prompts = [f"p{i}" for i in range(calls)]
    config = config_for(base_url)
    cpu = time.process_time()
    if callbacks is None:
        await run(LLMInference("llm"), prompts, resources=config, max_concurrent=64)
    else:
        with plait.settings.context(callbacks=callbacks):
            await run(LLMInference("llm"), prompts, resources=config, max_concurrent=64)
    return (time.process_time() - cpu) / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--ttft-runs", type=int, default=40)
    args = parser.parse_args()

    with start_server_process(latency=0.02) as (_process, base_url):
        direct = asyncio.run(ttft_backend(base_url, args.ttft_runs))
        streamed = asyncio.run(ttft_astream(base_url, args.ttft_runs))
        ms_direct, ms_stream = statistics.median(direct) * 1000, statistics.median(streamed) * 1000
        print(f"time to first token, median of {args.ttft_runs} (server latency 20 ms):")
        print(f"  backend.stream        {ms_direct:7.2f} ms")
        print(f"  LLMInference.astream  {ms_stream:7.2f} ms   (+{ms_stream - ms_direct:.2f} ms)")

    with start_server_process(stream_pieces=200) as (_process, base_url):
        rate, count = asyncio.run(events_per_second(base_url, 10))
        print(f"3-branch program streaming 200 pieces per reply: {count} events, {rate:,.0f}/s")

    with start_server_process() as (_process, base_url):
        asyncio.run(batch_cpu(base_url, 200, None))  # warm up imports and connections
        rows: list[tuple[str, Any]] = [("no callback", None), ("no-op callback", [NoOp()])]
        try:
            from plait.report.telemetry import OpenTelemetryCallback

            rows.append(("OpenTelemetry (no exporter)", [OpenTelemetryCallback()]))
        except ImportError:
            pass
        print(f"client CPU per call, {args.calls} calls, 64 in flight (best of 3 rounds):")
        best = {label: float("inf") for label, _ in rows}
        for _ in range(3):  # rounds interleave the settings, so drift hits all alike
            for label, callbacks in rows:
                figure = asyncio.run(batch_cpu(base_url, args.calls, callbacks))
                best[label] = min(best[label], figure)
        base = best["no callback"]
        for label, figure in best.items():
            print(f"  {label:28s} {figure:6.3f} ms   ({figure / base:.2f} × no callback)")


if __name__ == "__main__":
    main()
