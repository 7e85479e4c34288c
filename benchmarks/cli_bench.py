"""CLI throughput and memory: ``plait run`` over a small and a large JSON Lines file.

Writes N rows ``{"text": ...}``, runs ``python -m plait run`` on them (a one-call
program, 64 calls in flight) against the scripted server in its own process,
and prints rows/s, the CLI process's CPU per row (user + system, which a loaded machine
disturbs less than the wall time) and its peak resident memory for each size. A
flat profile — memory bounded by ``--chunk-size``, not the file — shows as a
large/small memory ratio near 1 while the row ratio is 10 ×.

The latency-bound ideal (64 rows per 20 ms, 3,200 rows/s) assumes free CPU, but
the scripted server runs on the same two cores and spends ~0.25-0.3 ms of CPU a
request: at the ideal rate it alone keeps one core ~90 % busy, so no client reaches
the ideal here. Each size is therefore also run by the floor, a bare client of the
same rows in its own process (aiohttp + orjson, 64 requests in flight, on uvloop
where installed, as ``plait run`` is): the same file read, requests and output
rows, without plait (rows written as they finish, not in input order, and no run
report). Both ratios are printed: to the ideal, and plait's time to the floor's
in the same run, with the server's CPU per request (from ``/proc``).

    python benchmarks/cli_bench.py [--small 20000] [--large 200000] [--latency 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
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


def write_rows(workdir: Path, rows: int) -> Path:
    source = workdir / f"in-{rows}.jsonl"
    with source.open("w") as file:
        for i in range(rows):
            file.write(json.dumps({"text": f"row {i}: the quick brown fox jumps over it"}) + "\n")
    return source


def timed(
    command: list[str], env: dict[str, str], cwd: Path, stderr: Path
) -> tuple[float, int, int, float]:
    """Runs ``command``; returns (seconds, peak RSS in KiB, exit code, CPU seconds) of it."""
    started = time.perf_counter()
    with stderr.open("w") as errors:
        process = subprocess.Popen(command, cwd=cwd, env=env, stderr=errors)
        # wait4 reports the peak resident memory and CPU of this child alone.
        _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    cpu = usage.ru_utime + usage.ru_stime
    return seconds, usage.ru_maxrss, os.waitstatus_to_exitcode(status), cpu


def run_cli(workdir: Path, rows: int, base_url: str) -> tuple[float, int, int, float]:
    """Returns (seconds, peak RSS in KiB, exit code, CPU seconds) of one CLI run over
    ``rows`` rows."""
    source = workdir / f"in-{rows}.jsonl"  # written by write_rows
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
    return timed(command, env, workdir, workdir / f"stderr-{rows}.txt")


def run_floor(workdir: Path, rows: int, base_url: str) -> tuple[float, int, int, float]:
    """The same as `run_cli`, for the bare client (`floor_client`) in its own process."""
    source, output = workdir / f"in-{rows}.jsonl", workdir / f"floor-{rows}.jsonl"
    command = [sys.executable, __file__, "--floor-client", str(source), str(output), base_url]
    return timed(command, dict(os.environ), workdir, workdir / f"floor-stderr-{rows}.txt")


def floor_client(source: str, output: str, base_url: str, in_flight: int = 64) -> None:
    """What a bare client of the same rows costs: each row's request (the program's system
    prompt and the row's text), its reply read, the row written with its output column."""
    import aiohttp  # only the floor's process needs it
    import orjson

    async def main() -> None:
        connector = aiohttp.TCPConnector(limit=in_flight)
        headers = {"Content-Type": "application/json", "Authorization": "Bearer k"}
        url = f"{base_url}/chat/completions"
        with open(source, "rb") as lines, open(output, "wb") as out:
            rows = enumerate(lines)
            async with aiohttp.ClientSession(connector=connector) as session:

                async def worker() -> None:
                    for number, line in rows:  # one shared iterator: each row once
                        row = orjson.loads(line)
                        messages = [
                            {"role": "system", "content": "Summarize in one line."},
                            {"role": "user", "content": row["text"]},
                        ]
                        body = orjson.dumps({"model": "bench", "messages": messages})
                        async with session.post(url, data=body, headers=headers) as reply:
                            data = orjson.loads(await reply.read())
                        text = data["choices"][0]["message"]["content"]
                        record = {"row": number, **row, "output": text, "error": None}
                        out.write(orjson.dumps(record) + b"\n")

                await asyncio.gather(*(worker() for _ in range(in_flight)))

    try:
        import uvloop  # as plait run, where installed
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


def server_cpu(pid: int) -> float | None:
    """Returns the CPU seconds process ``pid`` has used (None where /proc is not there)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=20_000)
    parser.add_argument("--large", type=int, default=200_000, help="0: the small size only")
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--no-floor", action="store_true", help="run plait only")
    parser.add_argument("--floor-client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_client:
        floor_client(*args.floor_client)
        return
    sizes = [rows for rows in (args.small, args.large) if rows]
    clients = (
        {"plait run": run_cli} if args.no_floor else {"plait run": run_cli, "floor": run_floor}
    )
    ideal = args.latency / 64
    print(f"one call per row, server latency {args.latency * 1000:g} ms, 64 in flight")
    results: dict[tuple[str, int], tuple[float, int]] = {}
    with tempfile.TemporaryDirectory() as tmp, start_server_process(args.latency) as (server, url):
        workdir = Path(tmp)
        (workdir / "bench_program.py").write_text(PROGRAM)
        for rows in sizes:
            write_rows(workdir, rows)
            for name, client in clients.items():
                before = server_cpu(server.pid)
                seconds, peak_kib, code, cpu = client(workdir, rows, url)
                after = server_cpu(server.pid)
                out = "out" if name == "plait run" else "floor"
                lines = sum(1 for _ in (workdir / f"{out}-{rows}.jsonl").open())
                results[name, rows] = (seconds, peak_kib)
                upstream = (
                    f"  server CPU {(after - before) * 1000 / rows:5.3f} ms/request"
                    if before is not None and after is not None
                    else ""
                )
                print(
                    f"{name:<9} {rows:>7} rows: {seconds:6.1f} s {rows / seconds:6.0f} rows/s "
                    f"({ideal * rows / seconds:4.2f} of the latency-bound ideal)  "
                    f"CPU {cpu * 1000 / rows:5.3f} ms/row  peak RSS {peak_kib / 1024:5.1f} MiB  "
                    f"exit {code}  {lines} output rows{upstream}",
                    flush=True,
                )
        served = fetch_stats(url)["requests"]
    if not args.no_floor:
        for rows in sizes:
            floor, plait = results["floor", rows][0], results["plait run", rows][0]
            print(f"{rows:>7} rows: plait run / floor time {plait / floor:.2f}")
    if len(sizes) == 2:
        (s_sec, s_mem), (l_sec, l_mem) = (
            results["plait run", sizes[0]],
            results["plait run", sizes[1]],
        )
        growth = sizes[1] / sizes[0]
        print(
            f"plait run, rows x{growth:.0f}: time x{l_sec / s_sec:.2f}, "
            f"peak memory x{l_mem / s_mem:.2f}"
        )
    print(f"server saw {served} requests")


if __name__ == "__main__":
    main()
