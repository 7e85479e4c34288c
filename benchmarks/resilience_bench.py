"""Resilience benchmark: 2,000 calls, 64 in flight, 100 ms latency, with and without faults.

(a) The same batch against a fault-free server and against one answering 5 % of
    requests with 429 + ``Retry-After: 0``; prints the wall-time ratio (the cost of
    the retries: each 429 costs its call a backoff and a second round trip, and the
    endpoint's adaptive window narrows for a while after each burst of 429s).
(b) The batch once more with a response cache: a first run that fills it, then a
    rerun served from disk (a new manager, as a new process would be) and one served
    from memory (the same manager); prints calls per second and the ratio to the
    first run.

Each server runs in its own process, so it does not share the client's CPU.

    python benchmarks/resilience_bench.py [--calls 2000] [--concurrency 64] [--latency 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from plait import LLMInference, ResourceConfig, ResourceManager, run
from plait.testing import Fault, fetch_stats, start_server_process


def endpoint(base_url: str, concurrency: int, **options: Any) -> dict[str, Any]:
    return {
        "provider": "openai",
        "model": "gpt-4o-mini",
        "base_url": base_url,
        "api_key": "k",
        "max_concurrent": concurrency,
        **options,
    }


async def batch(manager: ResourceManager, prompts: list[str], concurrency: int) -> None:
    module = LLMInference("llm", temperature=0.0)
    outputs = await run(
        module, prompts, resources=manager, max_concurrent=concurrency, progress=False
    )
    assert outputs == [f"echo: {p}" for p in prompts], "a reply was lost or mixed up"


def timed(config: ResourceConfig, prompts: list[str], concurrency: int) -> tuple[float, Any]:
    """Runs the batch on a new manager in a new loop; returns (wall seconds, stats)."""

    async def go() -> tuple[float, Any]:
        async with ResourceManager(config) as manager:
            start = time.perf_counter()
            await batch(manager, prompts, concurrency)
            return time.perf_counter() - start, manager.stats()["llm"]

    return asyncio.run(go())


def faults_vs_clean(args: argparse.Namespace, prompts: list[str], ideal: float) -> None:
    with start_server_process(latency=args.latency) as (_server, url):
        timed(ResourceConfig({"llm": endpoint(url, args.concurrency)}), prompts[:64], 64)
        clean, _ = timed(
            ResourceConfig({"llm": endpoint(url, args.concurrency)}), prompts, args.concurrency
        )
    throttle = Fault(status=429, headers={"Retry-After": "0"}, rate=0.05, seed=1)
    with start_server_process(latency=args.latency, faults=[throttle]) as (_server, url):
        config = ResourceConfig({"llm": endpoint(url, args.concurrency)})
        faulty, stats = timed(config, prompts, args.concurrency)
        requests = fetch_stats(url)["requests"]
    print(f"(a) fault-free        {clean:6.2f} s  {clean / ideal:5.2f} × ideal")
    print(
        f"    5 % 429s           {faulty:6.2f} s  {faulty / ideal:5.2f} × ideal  "
        f"({stats.rate_limited} × 429, {requests} requests for {len(prompts)} calls)"
    )
    print(f"    faulty / fault-free: {faulty / clean:.2f}")


def cached_rerun(args: argparse.Namespace, prompts: list[str]) -> None:
    with (
        tempfile.TemporaryDirectory() as directory,
        start_server_process(latency=args.latency) as (_server, url),
    ):
        cache = str(Path(directory) / "responses.sqlite")
        config = ResourceConfig({"llm": endpoint(url, args.concurrency, cache=cache)})

        async def go() -> tuple[float, float, float, float]:
            async with ResourceManager(config) as manager:
                start = time.perf_counter()
                await batch(manager, prompts, args.concurrency)
                first = time.perf_counter() - start
            async with ResourceManager(config) as manager:  # new manager: hits come from disk
                cpu, start = time.process_time(), time.perf_counter()
                await batch(manager, prompts, args.concurrency)
                disk, disk_cpu = time.perf_counter() - start, time.process_time() - cpu
                cpu, start = time.process_time(), time.perf_counter()  # same one: memory
                await batch(manager, prompts, args.concurrency)
                memory = time.perf_counter() - start
                assert manager.stats()["llm"].cache_hits == 2 * len(prompts)
            return first, disk, memory, disk_cpu

        first, disk, memory, disk_cpu = asyncio.run(go())
        requests = fetch_stats(url)["requests"]
    calls = len(prompts)
    print(f"(b) first run (fills the cache)   {first:6.2f} s  {calls / first:8.0f} calls/s")
    print(
        f"    rerun from disk               {disk:6.2f} s  {calls / disk:8.0f} calls/s  "
        f"{first / disk:6.1f} × faster, client CPU {disk_cpu * 1000 / calls:.3f} ms/call"
    )
    print(
        f"    rerun from memory             {memory:6.2f} s  {calls / memory:8.0f} calls/s  "
        f"{first / memory:6.1f} × faster"
    )
    print(f"    server requests over the three runs: {requests} (= calls of the first run)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1)
    args = parser.parse_args()
    ideal = args.latency * math.ceil(args.calls / args.concurrency)
    prompts = [f"question {i}" for i in range(args.calls)]
    print(
        f"{args.calls} calls, {args.concurrency} in flight, {args.latency * 1000:.0f} ms "
        f"latency; ideal {ideal:.2f} s"
    )
    faults_vs_clean(args, prompts, ideal)
    cached_rerun(args, prompts)


if __name__ == "__main__":
    main()
