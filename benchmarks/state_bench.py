"""State store benchmark (first version): response-cache hits and writes per second from
the SQLite store and the PostgreSQL store.

Each store is filled with ``--keys`` replies through `ResponseCacheStore` (memory
LRU off, so every lookup reaches the store), then every key is read back, first one
at a time and then ``--in-flight`` at once (as a batch's calls ask). PostgreSQL runs
on a server this script starts for itself (as the tests do: tests/postgres_server.py,
as the user ``postgres`` when run as root), or on ``--url``.

    python benchmarks/state_bench.py [--keys 2000] [--in-flight 64] [--url postgresql://…]

Not yet here (issue 36): W2 with no store / SQLite / PostgreSQL (the store's share of
wall time) and a checkpoint rerun's rows/s; they come with checkpoints on the store.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

from plait.backends.types import Response, Usage
from plait.resources.cache import ResponseCacheStore

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--url", help="a PostgreSQL state URL (default: start a server)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(measure("sqlite", str(Path(folder) / "s.sqlite"), args.keys, args.in_flight))
    if args.url:
        asyncio.run(measure("postgres", args.url, args.keys, args.in_flight))
        return
    sys.path.insert(0, str(TESTS))
    from postgres_server import start_for_script

    with start_for_script() as server:
        url = server.url(f"bench_{uuid.uuid4().hex[:8]}")
        asyncio.run(measure("postgres", url, args.keys, args.in_flight))


if __name__ == "__main__":
    main()
