"""`plait serve` benchmark: what the HTTP server adds over calling the program in process.

Everything runs on loopback. The upstream is plait's scripted OpenAI-compatible server in
a process of its own; the served app is ``plait serve`` itself (real uvicorn, one worker)
in another; the clients are aiohttp (one session, no connection cap, keep-alive) in this
process, which also makes the in-process calls. The program is one model call
(``LLMInference``). Every figure is measured in the same run:

(a) added latency: p50 and p99 of a request over HTTP minus those of ``await run(program,
    prompt=…)`` in process, at 1 and at 64 concurrent clients, upstream 20 ms
    (goal: p50 ≤ 2 ms, p99 ≤ 10 ms added);
(b) throughput: 256 concurrent clients, upstream 100 ms, the endpoint's
    ``max_concurrent=64``: requests per second over HTTP against the in-process batch of
    the same size (goal ≥ 0.9), and the upstream's peak of requests in flight (≤ 64);
(c) the same workload served by a hand-written FastAPI + DSPy service (``dspy.Predict``
    awaited with ``acall`` under a semaphore of 64, ``dspy.LM(cache=False,
    num_retries=0)``, uvicorn), run by the peers' venv; skipped with the reason when that
    venv or its packages are missing;
(d) memory: the server process's RSS after (a) (its warm-up) and every 5,000 of 20,000
    more requests (goal: flat);
(e) the floor: the server CPU per request of ``plait serve`` at 64 clients against three bare
    uvicorn apps under the same load (uvloop, httptools, no access log, no middleware): one
    answering a fixed JSON body of the same shape after a 20 ms sleep (what any Python HTTP
    server costs here), one posting the same chat completion upstream with a bare aiohttp
    session (what any server making one model call a request costs here), one awaiting the
    same ``run(program, prompt=…)`` in process before answering (what plait's run adds);
    measured in turns, printed as ratios.

The server process's CPU per request is printed beside (a) and (d). The peers' venv (see
``benchmarks/fanout_bench.py``) needs fastapi and uvicorn too::

    python3 -m venv /work/peers_venv
    /work/peers_venv/bin/pip install -e . -r benchmarks/requirements-peers.txt fastapi uvicorn
    python benchmarks/serve_bench.py [--requests 20000] [--peers-python /work/peers_venv/bin/python]
        [--server-option=--no-access-log] [--server-option=--workers=2]

Run by the peers' python with ``--peer-server UPSTREAM`` it is that peer service.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEER_LIMIT = 64


def make_program() -> Any:
    """The served program: one model call on ``prompt``."""
    from plait import LLMInference

    return LLMInference("llm", "Answer briefly.")


# -- processes ------------------------------------------------------------------------


def _environment() -> dict[str, str]:
    """This checkout's plait and this folder (the upstream imports its responder here)."""
    env = dict(os.environ)
    paths = [str(ROOT / "src"), str(HERE), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


@contextmanager
def _listening(command: list[str], marker: str, log: Path) -> Iterator[tuple[int, str]]:
    """Starts ``command`` with stderr into ``log``; yields its pid and the URL after
    ``marker`` in that log once it appears; stops the process afterwards."""
    with log.open("w") as sink:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=sink, env=_environment()
        )
    try:
        for _ in range(1200):
            found = re.search(re.escape(marker) + r"(\S+)", log.read_text())
            if found:
                yield process.pid, found.group(1)
                return
            if process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"{command[2:5]} did not start: {log.read_text()[-2000:]}")
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def _endpoint(upstream: str, max_concurrent: int) -> dict[str, Any]:
    """The endpoint settings of the upstream: no retries, so every request is counted once."""
    return {
        "provider": "openai",
        "model": "scripted",
        "base_url": upstream,
        "api_key": "bench-key",
        "max_concurrent": max_concurrent,
        "max_retries": 0,
    }


SERVER_OPTIONS: list[str] = []
"""More ``plait serve`` options for every server of the run (``--server-option``)."""


@contextmanager
def plait_server(upstream: str, max_concurrent: int, folder: Path) -> Iterator[tuple[int, str]]:
    """``plait serve one=serve_bench.py:make_program`` against ``upstream``."""
    resources = folder / f"res-{max_concurrent}.json"
    resources.write_text(json.dumps({"llm": _endpoint(upstream, max_concurrent)}))
    command = [sys.executable, "-m", "plait", "serve", f"one={Path(__file__)}:make_program"]
    command += ["-r", str(resources), "--port", "0", "--max-active", "512", *SERVER_OPTIONS]
    with _listening(command, "Uvicorn running on ", folder / "plait-serve.log") as running:
        if any(option.startswith("--workers") for option in SERVER_OPTIONS):
            time.sleep(5)  # the workers start after the supervisor says where it listens
        yield running


def _tree(pid: int) -> list[int]:
    """Process ``pid`` and its descendants (``--workers``: the supervisor and its workers)."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        for child in children:
            found += _tree(int(child))
    return found


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` and its descendants in MiB (Linux)."""
    total = 0.0
    for member in _tree(pid):
        for line in Path(f"/proc/{member}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time process ``pid`` and its descendants have used (Linux)."""
    total = 0
    for member in _tree(pid):
        fields = Path(f"/proc/{member}/stat").read_text().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def upstream_stats(base_url: str, reset: bool = False) -> dict[str, Any]:
    root = base_url.removesuffix("/v1")
    if reset:
        request = urllib.request.Request(f"{root}/stats/reset", method="POST")
        urllib.request.urlopen(request, timeout=10).close()
        return {}
    with urllib.request.urlopen(f"{root}/stats", timeout=10) as answer:
        return json.loads(answer.read())


# -- load -----------------------------------------------------------------------------


async def closed_loop(
    call: Callable[[int], Awaitable[None]], clients: int, requests: int
) -> tuple[list[float], float]:
    """``clients`` workers each call ``call`` back to back until ``requests`` are done;
    returns each request's latency and the wall time, in seconds."""
    latencies: list[float] = []
    counter = iter(range(requests))

    async def client() -> None:
        for i in counter:
            started = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies, time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1] if q < 100 else max(values)
    )


def http_caller(session: Any, url: str, body: Callable[[int], dict]) -> Callable:
    async def call(i: int) -> None:
        async with session.post(url, json=body(i)) as answer:
            payload = await answer.read()
            if answer.status != 200:
                raise RuntimeError(f"{url} answered {answer.status}: {payload[:300]!r}")

    return call


def in_process_caller(program: Any, manager: Any) -> Callable:
    from plait.execution import run

    async def call(i: int) -> None:
        await run(program, prompt=f"question {i}", resources=manager)

    return call


def _session() -> Any:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600))


def _manager(upstream: str, max_concurrent: int) -> Any:
    from plait.resources import ResourceManager

    return ResourceManager({"llm": _endpoint(upstream, max_concurrent)})


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:6.2f} ms"


# -- (a) and (d) ----------------------------------------------------------------------


async def added_latency(url: str, upstream: str, pid: int) -> None:
    program = make_program()
    manager = _manager(upstream, 256)
    body = lambda i: {"prompt": f"question {i}"}  # noqa: E731
    async with _session() as session:
        over_http = http_caller(session, f"{url}/programs/one/run", body)
        in_process = in_process_caller(program, manager)
        await closed_loop(over_http, 16, 400)  # warm-up: connections, first traces
        await closed_loop(in_process, 16, 400)
        for clients, requests in ((1, 400), (64, 2560)):
            local, _ = await closed_loop(in_process, clients, requests)
            cpu = cpu_seconds(pid)
            remote, _ = await closed_loop(over_http, clients, requests)
            cpu_per = (cpu_seconds(pid) - cpu) / requests
            parts = []
            for q in (50, 99):
                added = percentile(remote, q) - percentile(local, q)
                parts.append(
                    f"p{q} {_ms(percentile(local, q))} in process, "
                    f"{_ms(percentile(remote, q))} over HTTP: +{_ms(added).strip()}"
                )
            print(
                f"  {clients:>2} client(s), {requests} requests: {'; '.join(parts)}; "
                f"server CPU {cpu_per * 1000:.2f} ms/request"
            )
    await manager.aclose()


async def memory(url: str, pid: int, requests: int) -> None:
    body = lambda i: {"prompt": f"memory question {i}"}  # noqa: E731
    step = max(1, requests // 4)
    async with _session() as session:
        call = http_caller(session, f"{url}/programs/one/run", body)
        readings = [(0, rss_mb(pid))]
        cpu = cpu_seconds(pid)
        for done in range(step, requests + 1, step):
            await closed_loop(call, 64, step)
            readings.append((done, rss_mb(pid)))
        cpu_per = (cpu_seconds(pid) - cpu) / requests
    shown = ", ".join(f"{n}: {mb:.1f}" for n, mb in readings)
    growth = readings[-1][1] - readings[0][1]
    print(
        f"  RSS MiB after warm-up and every {step} requests: {shown}; growth "
        f"{growth:+.1f} MiB over {requests}; server CPU {cpu_per * 1000:.2f} ms/request"
    )


# -- (e) ----------------------------------------------------------------------------


FLOOR_BODY = {
    "run_id": "0" * 32,
    "status": "completed",
    "output": "echo: question 1",
    "usage": {"calls": 1, "cached": 0, "input_tokens": 12, "output_tokens": 4, "cost": 0.0},
}


def run_floor_server(mode: str, upstream: str) -> None:
    """A bare uvicorn app on ``/run``: ``sleep`` answers `FLOOR_BODY` after 20 ms, ``run``
    awaits the served program in process (upstream ``upstream``) and answers its output,
    ``client`` posts the same chat completion to ``upstream`` with a bare aiohttp session
    and answers its text (the least any server making one model call a request does)."""
    import orjson
    import uvicorn

    from plait.execution import run

    held: dict[str, Any] = {}

    async def ask_upstream(prompt: str) -> str:
        chat = {"model": "scripted", "messages": [
            {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": prompt}
        ]}  # fmt: skip
        headers = {"authorization": "Bearer bench-key", "content-type": "application/json"}
        url = upstream.rstrip("/") + "/chat/completions"
        async with held["session"].post(url, data=orjson.dumps(chat), headers=headers) as reply:
            text: str = orjson.loads(await reply.read())["choices"][0]["message"]["content"]
            return text

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                held["program"], held["manager"] = make_program(), _manager(upstream, 256)
                held["session"] = _session()
                await send({"type": "lifespan.startup.complete"})
            await held["session"].close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        request, more = b"", True
        while more:
            message = await receive()
            request += message.get("body", b"")
            more = message.get("more_body", False)
        if mode == "sleep":
            await asyncio.sleep(0.02)
            answer = FLOOR_BODY
        elif mode == "client":
            output = await ask_upstream(orjson.loads(request)["prompt"])
            answer = {**FLOOR_BODY, "output": output}
        else:
            prompt = orjson.loads(request)["prompt"]
            output = await run(held["program"], prompt=prompt, resources=held["manager"])
            answer = {**FLOOR_BODY, "output": output}
        body = orjson.dumps(answer)
        length = str(len(body)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", length)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(app, host="127.0.0.1", port=0, log_level="info", access_log=False)


@contextmanager
def floor_server(mode: str, upstream: str, folder: Path) -> Iterator[tuple[int, str]]:
    command = [sys.executable, str(Path(__file__)), "--floor-server", mode, upstream]
    with _listening(command, "Uvicorn running on ", folder / f"floor-{mode}.log") as running:
        yield running


async def cpu_per_request(pid: int, url: str, clients: int, requests: int) -> float:
    """Server ``pid``'s CPU seconds per request over ``requests`` POSTs to ``url``."""
    body = lambda i: {"prompt": f"question {i}"}  # noqa: E731
    async with _session() as session:
        call = http_caller(session, url, body)
        await closed_loop(call, 16, 400)  # warm-up
        cpu = cpu_seconds(pid)
        await closed_loop(call, clients, requests)
        return (cpu_seconds(pid) - cpu) / requests


def floor(served: tuple[int, str], upstream: str, folder: Path, rounds: int = 3) -> None:
    with (
        floor_server("sleep", upstream, folder) as (bare, bare_url),
        floor_server("run", upstream, folder) as (running, running_url),
        floor_server("client", upstream, folder) as (client, client_url),
    ):
        servers = {
            "plait serve": (served[0], f"{served[1]}/programs/one/run"),
            "bare app, fixed JSON after 20 ms": (bare, f"{bare_url}/run"),
            "bare app, one bare aiohttp call": (client, f"{client_url}/run"),
            "bare app awaiting run() in process": (running, f"{running_url}/run"),
        }
        cpu: dict[str, list[float]] = {name: [] for name in servers}
        for _ in range(rounds):  # in turns, so a change in the machine's load hits each
            for name, (pid, url) in servers.items():
                cpu[name].append(asyncio.run(cpu_per_request(pid, url, 64, 2560)))
    median = {name: statistics.median(values) for name, values in cpu.items()}
    served_cpu = median["plait serve"]
    for name, value in median.items():
        print(
            f"  {name:<36} {value * 1000:.3f} ms/request (median of {rounds}); plait serve "
            f"{served_cpu / value:.2f} × this"
        )


# -- (b) and (c) ----------------------------------------------------------------------


async def in_process_batch(upstream: str, size: int, clients: int) -> float:
    from plait.execution import run

    program = make_program()
    manager = _manager(upstream, 64)
    await run(program, [f"warm {i}" for i in range(64)], resources=manager)
    started = time.perf_counter()
    await run(
        program, [f"question {i}" for i in range(size)], resources=manager, max_concurrent=clients
    )
    wall = time.perf_counter() - started
    await manager.aclose()
    return wall


async def http_load(url: str, body: Callable[[int], dict], size: int, clients: int) -> float:
    async with _session() as session:
        call = http_caller(session, url, body)
        await closed_loop(call, clients, clients)  # warm-up: one request per connection
        _, wall = await closed_loop(call, clients, size)
    return wall


def throughput_row(label: str, wall: float, size: int, base: float, upstream: str) -> None:
    peak = upstream_stats(upstream)["peak_concurrency"]
    print(
        f"  {label:<28} {size / wall:7.1f} requests/s  ({wall:5.2f} s; "
        f"{base / wall:4.2f} × in process)  upstream peak {peak}"
    )


@contextmanager
def peer_server(python: str, upstream: str, folder: Path) -> Iterator[tuple[int, str]]:
    command = [python, str(Path(__file__)), "--peer-server", upstream]
    with _listening(command, "Uvicorn running on ", folder / "peer.log") as running:
        yield running


def peer_problem(python: str) -> str | None:
    """Why the peer row cannot run, or None."""
    if not Path(python).exists():
        return f"{python} does not exist (create the peers' venv: see this file's docstring)"
    check = "import dspy, fastapi, uvicorn"
    done = subprocess.run([python, "-c", check], capture_output=True, text=True)
    if done.returncode:
        return f"{python} cannot {check}: {done.stderr.strip().splitlines()[-1]}"
    return None


def run_peer_server(upstream: str) -> None:
    """The hand-written FastAPI + DSPy service (runs in the peers' venv)."""
    import dspy
    import uvicorn
    from fastapi import FastAPI

    lm = dspy.LM("openai/scripted", api_base=upstream, api_key="k", cache=False, num_retries=0)
    dspy.configure(lm=lm)
    predict = dspy.Predict("question -> answer")
    limit = asyncio.Semaphore(PEER_LIMIT)
    app = FastAPI()

    @app.post("/run")
    async def answer(question: Question) -> dict[str, str]:
        async with limit:
            prediction = await predict.acall(question=question.question)
        return {"output": prediction.answer}

    uvicorn.run(app, host="127.0.0.1", port=0, log_level="info", access_log=False)


class Question(BaseModel):
    """The peer service's request body (at module level, where FastAPI can resolve it)."""

    question: str


# -- main -----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="for the memory part (d)")
    parser.add_argument("--batch", type=int, default=2048, help="requests of (b) and (c)")
    parser.add_argument("--peers-python", default="/work/peers_venv/bin/python")
    parser.add_argument(
        "--server-option",
        action="append",
        default=[],
        metavar="OPTION",
        help="pass OPTION to every plait serve (e.g. --server-option=--no-access-log, "
        "--server-option=--workers=2); repeatable",
    )
    parser.add_argument("--peer-server", metavar="UPSTREAM", help=argparse.SUPPRESS)
    parser.add_argument(
        "--floor-server", nargs=2, metavar=("MODE", "UPSTREAM"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    SERVER_OPTIONS[:] = args.server_option
    if args.peer_server:
        run_peer_server(args.peer_server)
        return
    if args.floor_server:
        run_floor_server(*args.floor_server)
        return
    sys.path[:0] = [str(ROOT / "src"), str(HERE)]
    os.environ["PYTHONPATH"] = _environment()["PYTHONPATH"]
    from plait.testing import start_server_process

    print(
        f"plait serve benchmark; Python {sys.version.split()[0]}, {os.cpu_count()} cores; "
        f"clients: aiohttp, one session, no connection cap; plait serve {' '.join(SERVER_OPTIONS)}"
    )
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        with (
            start_server_process(latency=0.02) as (_, upstream),
            plait_server(upstream, 256, folder) as (pid, url),
        ):
            print("(a) added latency, upstream 20 ms, one model call:")
            asyncio.run(added_latency(url, upstream, pid))
            print(f"(d) memory of the server process over {args.requests} requests:")
            asyncio.run(memory(url, pid, args.requests))
            print("(e) server CPU a request at 64 clients, upstream 20 ms, against bare apps:")
            floor((pid, url), upstream, folder)
        print(
            f"(b, c) throughput: {args.batch} requests, 256 concurrent clients, upstream "
            "100 ms, max_concurrent=64:"
        )
        with start_server_process(latency=0.1, responder="fanout_bench:respond") as (_, upstream):
            upstream_stats(upstream, reset=True)
            base = asyncio.run(in_process_batch(upstream, args.batch, 256))
            throughput_row("plait, in process (batch)", base, args.batch, base, upstream)
            with plait_server(upstream, 64, folder) as (_, url):
                upstream_stats(upstream, reset=True)
                body = lambda i: {"prompt": f"question {i}"}  # noqa: E731
                wall = asyncio.run(http_load(f"{url}/programs/one/run", body, args.batch, 256))
                throughput_row("plait serve", wall, args.batch, base, upstream)
            problem = peer_problem(args.peers_python)
            if problem:
                print(f"  {'FastAPI + DSPy':<28} skipped: {problem}")
                return
            with peer_server(args.peers_python, upstream, folder) as (_, url):
                upstream_stats(upstream, reset=True)
                body = lambda i: {"question": f"question {i}"}  # noqa: E731
                wall = asyncio.run(http_load(f"{url}/run", body, args.batch, 256))
                throughput_row("FastAPI + DSPy (hand-written)", wall, args.batch, base, upstream)


if __name__ == "__main__":
    main()
