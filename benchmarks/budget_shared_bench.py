"""One budget shared by processes: what it costs, and whether it holds.

Everything runs on loopback; the upstream is plait's scripted server in a process of its
own, answering every call after 100 ms with 10 completion tokens and no prompt tokens;
at $0.10 a completion token every call costs $1.00, and with the program's
``max_tokens=10`` it holds at most $1.00 while in flight. In the same run:

(a) ``plait serve --workers 2`` (the workers share the SQLite budget file): ``--batch``
    requests from 256 concurrent clients, ``max_concurrent=64``, with no budget and with
    an endpoint budget that does not bind (twice the cost of the load), alternately
    ``--repeats`` times: the median requests per second and the ratio of the times (goal:
    the budget costs at most 10 %); then with a budget of
    ``--batch``/4 dollars, which binds: what the upstream served against the budget (goal:
    within it, and at least the budget less one call);
(b) with ``--ray``: 2 Ray Data workers (``map_dataset``, a local Ray) over ``--rows`` rows,
    the same three ways, and the messages each call sent to the budget actor.

::

    python benchmarks/budget_shared_bench.py [--batch 2048] [--repeats 3] [--ray] [--rows 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "src"), str(HERE)]

import serve_bench  # noqa: E402

PRICE = {"input": 0.0, "output": 100_000.0}
"""$0.10 a completion token: a call of 10 tokens costs $1.00."""


def respond(body: dict[str, Any]) -> dict[str, Any]:
    """The upstream's answer: 10 completion tokens, no prompt tokens (see the module doc)."""
    return {"content": "ok", "usage": {"prompt_tokens": 0, "completion_tokens": 10}}


def make_program() -> Any:
    """The served program: one model call of at most 10 tokens."""
    from plait import LLMInference

    return LLMInference("llm", "Answer briefly.", max_tokens=10)


def endpoint(upstream: str, budget: float | None) -> dict[str, Any]:
    settings = {**serve_bench._endpoint(upstream, 64), "price": PRICE}
    if budget is not None:
        settings["budget"] = budget
    return settings


def serve_load(
    upstream: str, folder: Path, budget: float | None, size: int
) -> tuple[float, int, int]:
    """Serves 64 warm-up requests, then ``size`` timed ones, from 2 workers; returns the
    timed part's wall seconds, the answers 200 and the upstream's requests (all of them)."""
    resources = folder / "res.json"
    resources.write_text(json.dumps({"llm": endpoint(upstream, budget)}))
    command = [sys.executable, "-m", "plait", "serve", f"one={Path(__file__)}:make_program"]
    command += ["-r", str(resources), "--port", "0", "--max-active", "512", "--workers", "2"]
    command += ["--no-access-log"]
    with serve_bench._listening(command, "Uvicorn running on ", folder / "serve.log") as (_, url):
        _until_ready(url)  # the workers start after the supervisor says where it listens
        return asyncio.run(_load(f"{url}/programs/one/run", upstream, size))


def _until_ready(url: str) -> None:
    for _ in range(1200):
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=5) as answer:
                if answer.status == 200:
                    time.sleep(2)  # the other worker, on a busy machine
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"plait serve at {url} never became ready")


async def _load(url: str, upstream: str, size: int) -> tuple[float, int, int]:
    answered = 0

    async with serve_bench._session() as session:

        async def call(i: int) -> None:
            nonlocal answered
            async with session.post(url, json={"prompt": f"q {i}"}) as answer:
                await answer.read()
                answered += answer.status == 200

        serve_bench.upstream_stats(upstream, reset=True)
        # Warm-up (both workers, the connections): its calls are spent from the budget too.
        await serve_bench.closed_loop(call, 64, 64)
        _, wall = await serve_bench.closed_loop(call, 256, size)
    return wall, answered, serve_bench.upstream_stats(upstream)["requests"]


def ray_load(upstream: str, budget: float | None, rows: int) -> tuple[float, int, int, int]:
    """Maps ``rows`` rows on 2 Ray Data workers; returns wall seconds, rows answered, the
    upstream's requests and the messages the budget actor got."""
    import ray

    from plait.distributed import map_dataset

    namespace = os.urandom(4).hex()
    ds = ray.data.from_items([{"prompt": f"q {i}"} for i in range(rows)], override_num_blocks=8)
    serve_bench.upstream_stats(upstream, reset=True)
    started = time.perf_counter()
    out = map_dataset(
        make_program(), ds, resources={"llm": endpoint(upstream, budget)}, concurrency=2,
        batch_size=rows // 8, max_concurrent=64, namespace=namespace,
    ).take_all()  # fmt: skip
    wall = time.perf_counter() - started
    actor = ray.get_actor(f"plait-budgets:{namespace}")
    messages = ray.get(actor.stats.remote())["messages"]
    answered = sum(row["error"] is None for row in out)
    return wall, answered, serve_bench.upstream_stats(upstream)["requests"], messages


def within(bound: int, sent: int, answered: int) -> None:
    """Prints what the upstream served under a binding budget of ``bound`` dollars."""
    used = sent >= bound - 1
    print(f"  budget ${bound:<12} upstream served {sent} calls = ${sent:.2f} (answered "
          f"{answered}); within it: {sent <= bound}; used to its last call: {used}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--ray", action="store_true", help="also (b), 2 Ray Data workers")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3, help="alternate runs of (a)")
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = serve_bench._environment()["PYTHONPATH"]
    from plait.testing import start_server_process

    print(f"shared budget benchmark; Python {sys.version.split()[0]}, {os.cpu_count()} cores")
    size = args.batch
    with (
        tempfile.TemporaryDirectory() as temporary,
        start_server_process(latency=0.1, responder="budget_shared_bench:respond") as (_, up),
    ):
        folder = Path(temporary)
        print(f"(a) plait serve --workers 2: {size} requests, 256 clients, upstream 100 ms:")
        frees, helds = [], []
        for _ in range(args.repeats):  # alternately, so that load elsewhere hits both alike
            frees.append(serve_load(up, folder, None, size)[0])
            wall, answered, sent = serve_load(up, folder, 2.0 * size, size)
            helds.append(wall)
        free, held = statistics.median(frees), statistics.median(helds)
        print(f"  no budget            {size / free:7.1f} requests/s  (median of {args.repeats})")
        ratio = held / free
        print(f"  budget ${2 * size:<12} {size / held:7.1f} requests/s  ({ratio:4.2f} × the "
              f"time; answered {answered}, upstream {sent})")  # fmt: skip
        bound = size // 4
        _, answered, sent = serve_load(up, folder, float(bound), size)
        within(bound, sent, answered)
        if not args.ray:
            return
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})  # fmt: skip
        rows = args.rows
        print(f"(b) map_dataset, 2 Ray Data workers: {rows} rows, 64 calls in flight each:")
        free, *_ = ray_load(up, None, rows)
        held, answered, sent, messages = ray_load(up, 2.0 * rows, rows)
        print(f"  no budget            {rows / free:7.1f} rows/s")
        ratio, per_call = held / free, messages / max(sent, 1)
        print(f"  budget ${2 * rows:<12} {rows / held:7.1f} rows/s  ({ratio:4.2f} × the "
              f"time; {per_call:.2f} messages to the budget actor a call)")  # fmt: skip
        bound = rows // 4
        _, answered, sent, _ = ray_load(up, float(bound), rows)
        within(bound, sent, answered)
        ray.shutdown()


if __name__ == "__main__":
    main()
