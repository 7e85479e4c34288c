"""CLI throughput and memory: ``plait run`` over a small and a large JSON Lines file.

Writes N rows ``{"text": ...}``, runs ``python -m plait run`` on them (a one-call
program, 64 calls in flight) against the scripted server in its own process,
and prints rows/s, the CLI process's CPU per row (user + system, which a loaded machine
disturbs less than the wall time) and its peak resident memory for each size. A
flat profile — memory bounded by ``--chunk-size``, not the file — shows as a
large/small memory ratio near 1 while the row ratio is 10 ×.

    python benchmarks/cli_bench.py [--small 20000] [--large 200000] [--latency 0.02]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from plait.testing import fetch_stats, start_server_process

PROGRAM = """
from plait import LLMInference, Module

class Summarize(Module):
    def __init__(self):
        super().__init__()
        self.summary = LLMInference("llm", "Summarize in one line.")

    def forward(self, text):
        return self.summary(text)
"""


def run_cli(workdir: Path, rows: int, base_url: str) -> tuple[float, int, int, float]:
    """Returns (seconds, peak RSS in KiB, exit code, CPU seconds) of one CLI run over
    ``rows`` rows."""
    source = workdir / f"in-{rows}.jsonl"
    with source.open("w") as file:
        for i in range(rows):
            file.write(json.dumps({"text": f"row {i}: the quick brown fox jumps over it"}) + "\n")
    (workdir / "res.toml").write_text(
        f'[llm]\nprovider = "openai"\nmodel = "bench"\nbase_url = "{base_url}"\napi_key = "k"\n'
    )
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, str(workdir)])
    command = [
        sys.executable, "-m", "plait", "run", "bench_program:Summarize",
        "-i", str(source), "-o", str(workdir / f"out-{rows}.jsonl"),
        "-r", str(workdir / "res.toml"), "--max-concurrent", "64", "--no-progress",
    ]  # fmt: skip
    started = time.perf_counter()
    with (workdir / f"stderr-{rows}.txt").open("w") as errors:
        process = subprocess.Popen(command, cwd=workdir, env=env, stderr=errors)
        # wait4 reports the peak resident memory of this child alone.
        _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    cpu = usage.ru_utime + usage.ru_stime
    return seconds, usage.ru_maxrss, os.waitstatus_to_exitcode(status), cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=20_000)
    parser.add_argument("--large", type=int, default=200_000)
    parser.add_argument("--latency", type=float, default=0.02)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, start_server_process(args.latency) as (_, url):
        workdir = Path(tmp)
        (workdir / "bench_program.py").write_text(PROGRAM)
        results = {}
        for rows in (args.small, args.large):
            seconds, peak_kib, code, cpu = run_cli(workdir, rows, url)
            lines = sum(1 for _ in (workdir / f"out-{rows}.jsonl").open())
            results[rows] = (seconds, peak_kib, code, lines, cpu)
        served = fetch_stats(url)["requests"]
    ideal = args.latency / 64
    print(f"plait run, one call per row, server latency {args.latency * 1000:g} ms, 64 in flight")
    for rows, (seconds, peak_kib, code, lines, cpu) in results.items():
        print(
            f"{rows:>8} rows: {seconds:7.1f} s  {rows / seconds:7.0f} rows/s "
            f"({ideal * rows / seconds:4.2f} of the latency-bound ideal)  "
            f"CLI CPU {cpu * 1000 / rows:5.3f} ms/row  "
            f"peak RSS {peak_kib / 1024:6.1f} MiB  exit {code}  {lines} output rows"
        )
    (s_sec, s_mem, *_), (l_sec, l_mem, *_) = results[args.small], results[args.large]
    growth = args.large / args.small
    print(f"rows x{growth:.0f}: time x{l_sec / s_sec:.2f}, peak memory x{l_mem / s_mem:.2f}")
    print(f"server saw {served} requests")


if __name__ == "__main__":
    main()
