"""State store benchmark: what the store costs a run, a checkpoint rerun's rows/s, and
response-cache hits and writes per second, on SQLite and PostgreSQL.

**W2**: 2,000 calls, 64 in flight, 100 ms upstream (the scripted server in its own
process), with no store, then with an SQLite and a PostgreSQL store (the endpoint's
cache and the run's checkpoint in it, a fresh store each time): each store's cost is its
wall time over the no-store run's, measured in the same run (best of ``--repeat``).

**Rerun**: ``--rerun-rows`` rows run once through the ``test`` provider (no network),
their checkpoint in PostgreSQL; the same run again is answered wholly from the checkpoint
(pages of 1,000 keys, decoded and restored as the program's types): rows/s of the rerun.

**Cache**: each store is filled with ``--keys`` replies through `ResponseCacheStore` (memory
LRU off, so every lookup reaches the store), then every key is read back, first one
at a time and then ``--in-flight`` at once (as a batch's calls ask). PostgreSQL runs
on a server this script starts for itself (as the tests do: tests/postgres_server.py,
as the user ``postgres`` when run as root), or on ``--url``.

    python benchmarks/state_bench.py [--calls 2000] [--in-flight 64] [--latency 0.1]
        [--rerun-rows 20000] [--keys 2000] [--repeat 5] [--url postgresql://…]

Run it alone (``flock /tmp/heavy.lock``): figures on a loaded machine say so.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from plait import LLMInference, run
from plait.backends.types import Response, Usage
from plait.resources import ResourceConfig
from plait.resources.cache import ResponseCacheStore
from plait.testing import start_server_process

TESTS = Path(__file__).resolve().parents[1] / "tests"


def reply(i: int) -> Response:
    return Response(f"reply {i} " * 20, usage=Usage(40, 60), finish_reason="stop", model="m")


async def measure(name: str, location: str, keys: int, in_flight: int) -> None:
    cache = ResponseCacheStore(location, memory_entries=0)
    names = [f"{uuid.uuid4().hex}{i}" for i in range(keys)]
    try:
        start = time.perf_counter()
        for i, key in enumerate(names):
            await cache.put(key, reply(i))
        await cache.aclose()  # waits for writes still on their way
        writes = keys / (time.perf_counter() - start)
        cache = ResponseCacheStore(location, memory_entries=0)
        start = time.perf_counter()
        for key in names:
            assert await cache.get(key) is not None
        one = keys / (time.perf_counter() - start)
        start = time.perf_counter()
        for first in range(0, keys, in_flight):
            hits = await asyncio.gather(*(cache.get(k) for k in names[first : first + in_flight]))
            assert all(hit is not None for hit in hits)
        many = keys / (time.perf_counter() - start)
    finally:
        await cache.aclose()
    print(
        f"{name:<10} writes {writes:>9,.0f}/s   hits one at a time {one:>9,.0f}/s   "
        f"hits {in_flight} in flight {many:>9,.0f}/s"
    )


async def w2(
    base_url: str, state: str | None, calls: int, in_flight: int, cache: bool = True
) -> float:
    """Wall seconds of W2 with ``state`` (None: no store); ``cache`` keeps the endpoint's
    replies there too (else the store holds only the run's checkpoint)."""
    endpoint = {"provider": "openai", "model": "scripted", "base_url": base_url,
                "api_key": "k", "max_concurrent": in_flight,
                "cache": cache and state is not None}  # fmt: skip
    config = ResourceConfig({"fast": endpoint}, state=state)
    items = [f"w2 {uuid.uuid4().hex} {i}" for i in range(calls)]
    start = time.perf_counter()
    outputs = await run(LLMInference("fast"), items, resources=config, progress=False,
                        max_concurrent=in_flight)  # fmt: skip
    elapsed = time.perf_counter() - start
    assert len(outputs) == calls
    return elapsed


async def rerun(state: str, rows: int) -> tuple[float, float]:
    """Rows/s of a first run through the test provider and of its rerun from the checkpoint."""
    config = ResourceConfig({"fast": {"provider": "test"}}, state=state)
    items = [f"row {i}" for i in range(rows)]
    program = LLMInference("fast")
    start = time.perf_counter()
    first = await run(program, items, resources=config, progress=False, max_concurrent=256)
    first_rate = rows / (time.perf_counter() - start)
    start = time.perf_counter()
    again = await run(program, items, resources=config, progress=False, max_concurrent=256)
    rate = rows / (time.perf_counter() - start)
    assert again == first
    return first_rate, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--rerun-rows", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--url", help="a PostgreSQL state URL (default: start a server)")
    args = parser.parse_args()
    if args.url:
        bench(args, lambda: args.url)
        return
    sys.path.insert(0, str(TESTS))
    from postgres_server import start_for_script

    with start_for_script() as server:
        bench(args, lambda: server.url(f"bench_{uuid.uuid4().hex[:8]}"))


def bench(args: argparse.Namespace, postgres: Any) -> None:
    with tempfile.TemporaryDirectory() as folder:
        sqlite = lambda: str(Path(folder) / f"{uuid.uuid4().hex}.sqlite")  # noqa: E731
        with start_server_process(latency=args.latency) as (_process, base_url):
            best: dict[str, float] = {}
            for _ in range(args.repeat):
                for name, state, cache in (
                    ("none", None, False),
                    ("sqlite", sqlite(), True),
                    ("postgres", postgres(), True),
                    ("postgres, checkpoint only", postgres(), False),
                ):
                    took = asyncio.run(w2(base_url, state, args.calls, args.in_flight, cache))
                    best[name] = min(best.get(name, took), took)
        ideal = args.calls / args.in_flight * args.latency
        print(f"W2: {args.calls} calls, {args.in_flight} in flight, {args.latency * 1000:.0f} ms "
              f"upstream (ideal {ideal:.2f} s), best of {args.repeat}")  # fmt: skip
        for name, took in best.items():
            cost = (took / best["none"] - 1) * 100
            print(f"  {name:<26} {took:6.3f} s   store cost {cost:+5.1f} % of wall time")
        first, rate = asyncio.run(rerun(postgres(), args.rerun_rows))
        print(
            f"rerun of {args.rerun_rows:,} rows from the PostgreSQL checkpoint: "
            f"{rate:,.0f} rows/s (the first run, test provider: {first:,.0f} rows/s)"
        )
        asyncio.run(measure("sqlite", sqlite(), args.keys, args.in_flight))
        asyncio.run(measure("postgres", postgres(), args.keys, args.in_flight))


if __name__ == "__main__":
    main()
