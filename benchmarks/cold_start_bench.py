"""Cold-start benchmark: a fresh process imports plait, builds a 2-level program, binds
it and prints its first result; how long does that take beyond the two replies?

The program is two chained calls (a draft, then a revision reading it) against a
scripted OpenAI-compatible server in its own process (default 100 ms per reply), so
the ideal is 2 × latency: everything above it is Python starting, ``import plait``,
building and binding the program, tracing, the first session and its connection.
The script starts the client ``--runs`` times (default 9) as a new interpreter, with
bytecode cached as for an installed package (filled by one run first), and prints
each wall time, then the median over the ideal, and the same for a process that
only starts Python and exits (the floor no library can go under).

    python benchmarks/cold_start_bench.py [--runs 9] [--latency 0.1]

Goal (issue 27): median ≤ ideal + 100 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from plait.testing import start_server_process

CLIENT = """
import sys
import plait
from plait import LLMInference, Module, ResourceConfig


class Revise(Module):
    def __init__(self):
        super().__init__()
        self.draft = LLMInference("llm", "Write a first draft.")
        self.revise = LLMInference("llm", "Improve the draft.")

    def forward(self, topic):
        return self.revise(self.draft(topic))


config = ResourceConfig(
    {"llm": {"provider": "openai", "base_url": sys.argv[1], "api_key": "k", "model": "bench"}}
)
program = Revise().bind(resources=config)
print(program("otters"))
"""


def wall_of(command: list[str], env: dict[str, str]) -> float:
    """Returns the seconds from starting ``command`` to its exit (which must succeed)."""
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    return time.perf_counter() - start


def installed_like(cache: str) -> dict[str, str]:
    """Returns this environment with bytecode cached in ``cache``, as an installed
    package has it (a process that compiles every module is not what users start)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": cache}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--latency", type=float, default=0.1)
    args = parser.parse_args()
    ideal = 2 * args.latency
    print(
        f"cold start: a new process imports plait, builds and binds a 2-level program and "
        f"prints its first result; {args.latency * 1000:.0f} ms per reply, ideal "
        f"{ideal * 1000:.0f} ms; {args.runs} runs; Python {sys.version.split()[0]}"
    )
    client = [sys.executable, "-c", CLIENT]
    with (
        tempfile.TemporaryDirectory() as cache,
        start_server_process(latency=args.latency) as (_server, base_url),
    ):
        env = installed_like(cache)
        wall_of([*client, base_url], env)  # fills the bytecode cache
        bare = [wall_of([sys.executable, "-c", "pass"], env) for _ in range(args.runs)]
        walls = [wall_of([*client, base_url], env) for _ in range(args.runs)]
    print("  runs (ms): " + " ".join(f"{wall * 1000:.0f}" for wall in walls))
    median = statistics.median(walls)
    floor = statistics.median(bare)
    print(
        f"  plait: median {median * 1000:.0f} ms = ideal + {(median - ideal) * 1000:.0f} ms "
        f"(bare Python start: {floor * 1000:.0f} ms, so plait's own cost is "
        f"{(median - ideal - floor) * 1000:.0f} ms)"
    )


if __name__ == "__main__":
    main()
