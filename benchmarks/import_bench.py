"""Import benchmark: how long does ``import plait`` take in a fresh interpreter?

Each run starts a new Python that times ``import plait`` around the statement
itself (``time.perf_counter``, interpreter start-up excluded), with bytecode
cached as for an installed package (filled by one run first). Beside it, in
turn, the same for ``import typing``: the one standard-library module the core
needs (``asyncio``, which every run loads, imports it too), so the floor under
``import plait`` on this machine, whatever plait does. Prints the medians and
plait's share above that floor.

    python benchmarks/import_bench.py [--runs 15] [--before SRC]

``--before SRC`` adds another checkout's ``src`` (first on ``PYTHONPATH``),
timed in turn with this one, so both see the same load.

Goal (issue 39): ``import plait`` ≤ 30 ms on an idle machine. Measured with ``--before``
the checkout before the issue-39 import work (2 shared cores, load average 2.4, 21 runs
each): before 41.6 ms median, after 23.8 ms (0.57 ×); ``import typing`` 16.3 ms, so plait
adds 7.5 ms above it (25.2 ms before: dataclasses, inspect, ast, dis, tokenize, copy and
the dataclasses plait defined).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

TIMED = "import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _seconds(stmt: str, src: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    code = TIMED.format(stmt=stmt)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{stmt!r} with {src} failed:\n{out.stderr}")
    return float(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--before", help="another checkout's src, timed in turn with this one")
    args = parser.parse_args()
    cases = {"import typing": ("import typing", SRC), "import plait": ("import plait", SRC)}
    if args.before:
        cases["import plait (before)"] = ("import plait", args.before)
    for stmt, src in cases.values():
        _seconds(stmt, src)  # fills the bytecode cache
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, (stmt, src) in cases.items():
            times[name].append(_seconds(stmt, src))
    medians = {name: statistics.median(values) for name, values in times.items()}
    floor = medians["import typing"]
    for name, values in times.items():
        print(
            f"{name:24} median {medians[name] * 1000:6.1f} ms  "
            f"(min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f}; {len(values)} runs)"
        )
    for name in cases:
        if name != "import typing":
            above = medians[name] - floor
            print(f"{name}: {medians[name] / floor:.2f} × import typing, {above * 1000:+.1f} ms")
    if args.before:
        ratio = medians["import plait"] / medians["import plait (before)"]
        print(f"after / before: {ratio:.2f}")


if __name__ == "__main__":
    main()
