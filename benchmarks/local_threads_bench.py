"""The embedded model's thread counts: calls per second alone and beside a CPU-bound neighbour.

A batch of 24 prompts goes to the embedded SmolLM2 model twice per setting:
alone, then while another process keeps one CPU busy (the usual state of a
small machine that also runs tests, a browser or a second program). The
settings are llama.cpp's own defaults (generation on half the machine's CPUs,
the prompt read on *every* CPU with threads that spin while they wait) and
plait's (both from half the CPUs this process may use, `default_threads`).
Each figure is calls per second; the last column is plait's over llama.cpp's.

    python benchmarks/local_threads_bench.py [--prompts 24] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from plait.backends.local import LocalBackend, default_threads
from plait.backends.types import Message, Request, SamplingOptions

NEIGHBOUR = "while True: pass"


@contextmanager
def busy_neighbour() -> Iterator[None]:
    """A process that keeps one CPU busy for as long as the block runs."""
    process = subprocess.Popen([sys.executable, "-c", NEIGHBOUR])
    try:
        yield
    finally:
        process.kill()
        process.wait()


async def calls_per_second(backend: LocalBackend, prompts: int, max_tokens: int) -> float:
    requests = [
        Request(
            messages=(Message("user", f"Name a colour that starts with letter {i % 26}."),),
            options=SamplingOptions(max_tokens=max_tokens, temperature=0.0),
        )
        for i in range(prompts)
    ]
    await backend.complete(requests[0])  # load the model outside the timed part
    start = time.perf_counter()
    await asyncio.gather(*(backend.complete(request) for request in requests))
    return prompts / (time.perf_counter() - start)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    cpus = multiprocessing.cpu_count()
    settings = {
        "llama.cpp defaults": (max(cpus // 2, 1), cpus),
        "plait defaults": (default_threads(), default_threads()),
    }
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    print(f"{cpus} CPUs, {usable} usable; {args.prompts} prompts, {args.max_tokens} tokens each")
    results: dict[str, tuple[float, float]] = {}
    for name, (generation, batch) in settings.items():
        backend = LocalBackend(n_threads=generation, n_threads_batch=batch)
        try:
            alone = await calls_per_second(backend, args.prompts, args.max_tokens)
            with busy_neighbour():
                beside = await calls_per_second(backend, args.prompts, args.max_tokens)
        finally:
            await backend.aclose()
        results[name] = (alone, beside)
        print(
            f"{name:20s} threads {generation}/{batch}: {alone:6.2f} calls/s alone, "
            f"{beside:6.2f} beside a busy neighbour"
        )
    old, new = results["llama.cpp defaults"], results["plait defaults"]
    print(f"plait / llama.cpp: {new[0] / old[0]:.2f} × alone, {new[1] / old[1]:.2f} × beside")


if __name__ == "__main__":
    asyncio.run(main())
