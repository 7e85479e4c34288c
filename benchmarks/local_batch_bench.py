"""The embedded model decoding calls together: tokens per second, the demo's wall time, greedy text.

Three figures, in one run on the same machine:

1. tokens per second of ``--calls`` greedy calls sent one at a time, then with
   4 in flight (one llama.cpp batch holds them), and each one's CPU seconds
   per token (CPU time is what a loaded machine does not distort);
2. the README demo (`examples/demo.py`: three perspectives at once, then a
   synthesis): its wall time against the sum of its node times;
3. whether each call's greedy text with 4 in flight is the text it has alone.

    python benchmarks/local_batch_bench.py [--calls 8] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from plait import ResourceConfig
from plait.backends.local import LocalBackend
from plait.backends.types import Message, Request, Response, SamplingOptions
from plait.report.profiling import profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import demo  # type: ignore[import-not-found]  # the README demo, as it is

TOPICS = ("the sea", "a forest", "a city at night", "the desert", "winter", "a river")


def requests(calls: int, max_tokens: int) -> list[Request]:
    return [
        Request(
            messages=(Message("user", f"Describe {TOPICS[i % len(TOPICS)]} in two sentences."),),
            options=SamplingOptions(max_tokens=max_tokens, temperature=0.0),
        )
        for i in range(calls)
    ]


async def timed(
    backend: LocalBackend, asked: list[Request], in_flight: int
) -> tuple[list[Response], float, float]:
    """Replies, wall seconds and process CPU seconds of ``asked`` with ``in_flight`` at once."""
    gate = asyncio.Semaphore(in_flight)

    async def one(request: Request) -> Response:
        async with gate:
            return await backend.complete(request)

    wall, cpu = time.perf_counter(), time.process_time()
    replies = await asyncio.gather(*(one(r) for r in asked))
    return list(replies), time.perf_counter() - wall, time.process_time() - cpu


def demo_times() -> tuple[float, float]:
    """The demo's wall time and sum of node times, on the embedded model."""
    report = demo.Report().bind(ResourceConfig({"llm": {"provider": "local"}}))
    report.run_sync("warm-up")  # load the model outside the measured run
    with profile() as prof:
        report.run_sync(demo.TEXT)
    return prof.wall_time, sum(r.duration for r in prof.records)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    asked = requests(args.calls, args.max_tokens)
    backend = LocalBackend()
    try:
        await backend.complete(asked[0])  # load the model outside the timed part
        results = {n: await timed(backend, asked, n) for n in (1, 4)}
    finally:
        await backend.aclose()
    print(f"{args.calls} calls, {args.max_tokens} tokens at most, temperature 0")
    rates = {}
    for n, (replies, wall, cpu) in results.items():
        tokens = sum(r.usage.output_tokens for r in replies)
        rates[n] = tokens / wall
        print(
            f"{n} in flight: {tokens} tokens in {wall:.2f} s = {rates[n]:.1f} tok/s; "
            f"{1000 * cpu / tokens:.1f} ms CPU per token"
        )
    print(f"tokens per second, 4 in flight / one at a time: {rates[4] / rates[1]:.2f}")
    same = sum(a.text == b.text for a, b in zip(results[1][0], results[4][0], strict=True))
    print(f"greedy text with 4 in flight identical to alone: {same} of {args.calls}")
    wall, nodes = demo_times()
    print(f"demo: wall {wall:.2f} s, sum of node times {nodes:.2f} s, ratio {wall / nodes:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
