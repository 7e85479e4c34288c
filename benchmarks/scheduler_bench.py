"""Scheduler benchmark: 2,000 independent LLM calls, 64 in flight, 100 ms server latency.

Prints each client's wall time as a ratio to the ideal (latency × ⌈calls / concurrency⌉)
and its client CPU per call, for plait and for two peers run in the same process against
the same scripted server (in its own process, so it does not share the client's CPU):

* raw ``aiohttp`` + ``asyncio.gather`` (what a general-purpose HTTP client costs);
* the official ``openai`` SDK + ``asyncio.gather``.

    python benchmarks/scheduler_bench.py [--calls 2000] [--concurrency 64] [--latency 0.1]

SPEC §7 target: plait ≤ 1.2 × ideal. Issue 27: client CPU ≤ 0.25 ms per call. On aiohttp
plait spent 0.39–0.45 ms; on its own HTTP client (``backends/openai/_http.py``) 0.17–0.19
ms, below raw aiohttp's 0.27–0.36 in the same runs (2 shared cores, load average 1.5–2.1,
three runs each, alternately).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Awaitable, Callable

from plait import LLMInference, ResourceConfig, run
from plait.testing import start_server_process


async def plait_client(base_url: str, prompts: list[str], concurrency: int) -> None:
    config = ResourceConfig(
        {"llm": {"provider": "openai", "model": "bench", "base_url": base_url, "api_key": "k"}}
    )
    module = LLMInference("llm", temperature=0.0)
    outputs = await run(
        module, prompts, resources=config, max_concurrent=concurrency, progress=False
    )
    assert len(outputs) == len(prompts) and all(outputs)
    from plait.resources import ResourceManager

    await ResourceManager.shared(config).aclose()


async def aiohttp_client(base_url: str, prompts: list[str], concurrency: int) -> None:
    import aiohttp
    import orjson

    limit = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(prompt: str) -> str:
            body = {"model": "bench", "messages": [{"role": "user", "content": prompt}]}
            async with (
                limit,
                session.post(
                    f"{base_url}/chat/completions",
                    data=orjson.dumps(body),
                    headers={"Content-Type": "application/json", "Authorization": "Bearer k"},
                ) as response,
            ):
                data = orjson.loads(await response.read())
                return data["choices"][0]["message"]["content"]

        outputs = await asyncio.gather(*(one(p) for p in prompts))
    assert all(outputs)


async def openai_sdk_client(base_url: str, prompts: list[str], concurrency: int) -> None:
    from openai import AsyncOpenAI

    limit = asyncio.Semaphore(concurrency)
    async with AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0) as client:

        async def one(prompt: str) -> str:
            async with limit:
                reply = await client.chat.completions.create(
                    model="bench", messages=[{"role": "user", "content": prompt}]
                )
                return reply.choices[0].message.content or ""

        outputs = await asyncio.gather(*(one(p) for p in prompts))
    assert all(outputs)


def measure(
    name: str,
    client: Callable[[str, list[str], int], Awaitable[None]],
    base_url: str,
    prompts: list[str],
    concurrency: int,
) -> tuple[float, float]:
    """Runs one client in a fresh loop; returns (wall seconds, client CPU ms per call)."""
    cpu, wall = time.process_time(), time.perf_counter()
    asyncio.run(client(base_url, prompts, concurrency))
    wall = time.perf_counter() - wall
    cpu_ms = (time.process_time() - cpu) * 1000 / len(prompts)
    return wall, cpu_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1)
    args = parser.parse_args()

    ideal = args.latency * math.ceil(args.calls / args.concurrency)
    prompts = [f"question {i}" for i in range(args.calls)]
    clients = {
        "plait": plait_client,
        "aiohttp + gather": aiohttp_client,
        "openai SDK + gather": openai_sdk_client,
    }
    print(
        f"{args.calls} calls, {args.concurrency} in flight, {args.latency * 1000:.0f} ms "
        f"latency; ideal {ideal:.2f} s"
    )
    results: dict[str, float] = {}
    with start_server_process(latency=args.latency) as (_server, base_url):
        # Every client warmed up, so that none pays its imports inside its measurement
        # (plait no longer imports aiohttp, so the aiohttp client's column used to
        # include aiohttp's import once plait moved to its own HTTP client).
        for client in clients.values():
            measure("warm-up", client, base_url, prompts[:64], args.concurrency)
        for name, client in clients.items():
            wall, cpu_ms = measure(name, client, base_url, prompts, args.concurrency)
            results[name] = wall
            print(
                f"  {name:<22} {wall:6.2f} s  {wall / ideal:5.2f} × ideal  "
                f"client CPU {cpu_ms:.2f} ms/call"
            )
    print(
        f"plait / openai SDK: {results['plait'] / results['openai SDK + gather']:.2f}; "
        f"plait / aiohttp floor: {results['plait'] / results['aiohttp + gather']:.2f}"
    )


if __name__ == "__main__":
    main()
