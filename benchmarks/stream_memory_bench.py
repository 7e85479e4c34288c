"""Streaming-batch memory: does memory stay flat as a streamed batch grows?

Streams N inputs through a one-call program against the scripted server (in its
own process, no latency) and samples Python's traced memory as results arrive.
Prints the peak for a small and a large batch and their ratio; a flat profile
means a ratio near 1 however large the batch (the inputs list itself is excluded:
it is allocated before tracing starts).

    python benchmarks/stream_memory_bench.py [--small 5000] [--large 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import tracemalloc

from plait import ExecutionSettings, LLMInference, ResourceConfig
from plait.testing import start_server_process


async def stream(base_url: str, count: int) -> tuple[int, float]:
    """Streams ``count`` items; returns (peak traced bytes, seconds)."""
    config = ResourceConfig(
        {"llm": {"provider": "openai", "model": "bench", "base_url": base_url, "api_key": "k"}}
    )
    prompts = [f"item {i}" for i in range(count)]
    module = LLMInference("llm")
    tracemalloc.start()
    tracemalloc.reset_peak()
    started = time.perf_counter()
    received = 0
    async with ExecutionSettings(
        resources=config, streaming=True, max_concurrent=64, progress=False
    ):
        async for result in module(prompts):
            assert result.ok, result.error
            received += 1
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    from plait.resources import ResourceManager

    await ResourceManager.shared(config).aclose()
    assert received == count
    return peak, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=5000)
    parser.add_argument("--large", type=int, default=50000)
    args = parser.parse_args()
    with start_server_process(latency=0.0) as (_server, base_url):
        small_peak, small_s = asyncio.run(stream(base_url, args.small))
        large_peak, large_s = asyncio.run(stream(base_url, args.large))
    print(f"{args.small:>7} items: peak {small_peak / 1e6:6.1f} MB  ({small_s:.1f} s)")
    print(f"{args.large:>7} items: peak {large_peak / 1e6:6.1f} MB  ({large_s:.1f} s)")
    print(
        f"peak ratio large/small: {large_peak / small_peak:.2f} "
        f"for {args.large / args.small:.0f}× the items"
    )


if __name__ == "__main__":
    main()
