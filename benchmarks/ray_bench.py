"""Ray: items/s with 1 and 2 worker processes, and whether an endpoint limit holds across them.

A CPU-bound workload: many short calls (one LLM call per row, a scripted
server in its own process with ``--latency``, default 2 ms), so the client's
CPU per call decides the rate. Runs the same rows through
``plait.distributed.map_dataset`` on a local Ray cluster (``num_cpus=2``):

* 1 worker, limits="cluster"   — the baseline;
* 2 workers, limits="cluster"  — one Ray actor per endpoint leases permits to both;
* 2 workers, limits="shares"   — each worker holds half the limit, locally;
* 2 workers, limits="local"    — each worker holds the whole limit (no coordination).

Prints items/s over the whole job (Ray Data's start-up of the mapper actors
included) and over the time calls ran (the scripted server's first arrival to
its last answer), the speed-up of each over 1 worker, and the peak
concurrency the *server* observed against the configured ``max_concurrent``.
For the cluster runs it prints what the limits actor heard: messages from the
workers per 1,000 calls (asks for permits among them), from the actor's
``stats``; the bench makes the actor before the clock starts (a detached one,
so that it outlives the job and can be read), as a long-running job's would
already be there.

What binds: at 2 ms on a machine of 2 cores the CPU does (the server, the
driver and both workers share the cores; a call costs ~0.5 ms of client CPU
plus the server's), so even the uncoordinated "local" run reaches only
~1.4-1.7 x one worker, with twice the calls in flight. With ``--limit 16
--per-worker 8 --latency 0.02`` neither the limit nor the cores bind (one
worker: 8 calls in flight, ~330 calls/s), and 2 workers show what the leases
themselves cost against "shares" and "local".

``--rounds N`` runs the four in turn N times (one run's figures swing much on
a shared machine) and prints the median of each, and the median of the
ratios taken within each round.

``--per-worker`` sets the LLM calls each worker keeps in flight (default: the
limit). With the default, one worker alone can fill the endpoint's limit, and
a second worker can add only what the first leaves unused; with ``--limit 16
--per-worker 8`` the limit leaves room for two workers, and the run shows what
coordinating them costs.

    python benchmarks/ray_bench.py [--rows 6000] [--limit 8] [--per-worker 8] [--latency 0.002]
                                   [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import urllib.request
from pathlib import Path

import ray
import ray.data

from plait import LLMInference, Module
from plait.distributed import map_dataset
from plait.distributed.ray import build_config, endpoint_actor
from plait.testing import fetch_stats, start_server_process


class OneCall(Module):
    def __init__(self) -> None:
        super().__init__()
        self.call = LLMInference("llm")

    def forward(self, text: str) -> str:
        return self.call(text)


def reset(base_url: str) -> None:
    root = base_url.rsplit("/v1", 1)[0]
    urllib.request.urlopen(urllib.request.Request(root + "/stats/reset", method="POST")).read()


def measure(
    base_url: str, rows: int, workers: int, limits: str, limit: int, per_worker: int
) -> dict:
    resources = {
        "llm": {
            "provider": "openai",
            "model": "bench",
            "base_url": base_url,
            "api_key": "k",
            "max_concurrent": limit,
            "max_retries": 0,
        }
    }
    ds = ray.data.from_items([{"text": f"row {i}"} for i in range(rows)], override_num_blocks=8)
    namespace = os.urandom(4).hex()
    actor = None
    if limits == "cluster":  # detached, so that it outlives the workers and can be read
        endpoint = build_config(resources).endpoints()[0]
        actor = endpoint_actor(namespace, endpoint, lifetime="detached")
        ray.get(actor.stats.remote())
    reset(base_url)
    started = time.perf_counter()
    out = map_dataset(
        OneCall(), ds, resources=resources, limits=limits, concurrency=workers,
        batch_size=500, max_concurrent=per_worker, namespace=namespace,
    ).take_all()  # fmt: skip
    seconds = time.perf_counter() - started
    ledger = None
    if actor is not None:
        ledger = ray.get(actor.stats.remote())
        ray.kill(actor)
    failed = sum(r["error"] is not None for r in out)
    stats = fetch_stats(base_url, include_log=True)
    log = stats["log"]
    calls = max(r["finished"] for r in log) - min(r["arrived"] for r in log)
    return {
        "workers": workers,
        "limits": limits,
        "items_per_s": rows / seconds,
        "seconds": seconds,
        "calls_per_s": len(log) / calls,
        "calls_seconds": calls,
        "failed": failed,
        "server_peak": stats["peak_concurrency"],
        "requests": stats["requests"],
        "actor_messages": None if ledger is None else ledger.get("messages"),
        "actor_asks": None if ledger is None else ledger["asks"],
    }


MODES = ((1, "cluster"), (2, "cluster"), (2, "shares"), (2, "local"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--limit", type=int, default=8, help="the endpoint's max_concurrent")
    parser.add_argument("--per-worker", type=int, help="LLM calls in flight per worker")
    parser.add_argument("--latency", type=float, default=0.002)
    parser.add_argument("--rounds", type=int, default=1, help="run the four modes N times")
    args = parser.parse_args()
    per_worker = args.per_worker or args.limit
    src = str(Path(__file__).resolve().parents[1] / "src")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        namespace="ray_bench",
        runtime_env={"env_vars": {"PYTHONPATH": src}},
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        with start_server_process(latency=args.latency, keep_log=True) as (_, base_url):
            measure(base_url, 500, 1, "cluster", args.limit, per_worker)  # warm up the cluster
            rounds = [
                [
                    measure(base_url, args.rows, workers, limits, args.limit, per_worker)
                    for workers, limits in MODES
                ]
                for _ in range(args.rounds)
            ]
    finally:
        ray.shutdown()
    print(f"{args.rows} rows, 1 call each, server latency {args.latency * 1000:g} ms, "
          f"max_concurrent={args.limit}, {per_worker} in flight per worker, "
          f"{os.cpu_count()} cores")  # fmt: skip
    print(
        f"{'round':>5} {'workers':>7} {'limits':>8} {'items/s':>9} {'vs 1':>6} {'calls/s':>9} "
        f"{'vs 1':>6} {'server peak':>12} {'failed':>7} {'actor msgs/1k calls':>20}"
    )
    for number, results in enumerate(rounds, 1):
        base, base_calls = results[0]["items_per_s"], results[0]["calls_per_s"]
        for r in results:
            r["items_vs_1"] = r["items_per_s"] / base
            r["calls_vs_1"] = r["calls_per_s"] / base_calls
            held = "holds" if r["server_peak"] <= args.limit else "EXCEEDED"
            talk = ""
            if r["actor_asks"] is not None and r["actor_messages"] is None:
                talk = f"({r['actor_asks']} asks)"
            if r["actor_messages"] is not None:
                per_k = 1000 * r["actor_messages"] / r["requests"]
                talk = f"{per_k:.1f} ({r['actor_asks']} asks)"
            print(
                f"{number:>5} {r['workers']:>7} {r['limits']:>8} {r['items_per_s']:>9.0f} "
                f"{r['items_vs_1']:>5.2f}x {r['calls_per_s']:>9.0f} {r['calls_vs_1']:>5.2f}x "
                f"{r['server_peak']:>5} / {args.limit:<3} {held:>8} {r['failed']:>4} {talk:>20}"
            )
    if args.rounds > 1:
        print(f"medians of {args.rounds} rounds (ratios: the median of each round's ratio)")
        for column, (workers, limits) in enumerate(MODES):
            runs = [results[column] for results in rounds]
            items, calls = (
                statistics.median(r[key] for r in runs) for key in ("items_per_s", "calls_per_s")
            )
            items_vs, calls_vs = (
                statistics.median(r[key] for r in runs) for key in ("items_vs_1", "calls_vs_1")
            )
            peak = max(r["server_peak"] for r in runs)
            print(
                f"{'':>5} {workers:>7} {limits:>8} {items:>9.0f} {items_vs:>5.2f}x "
                f"{calls:>9.0f} {calls_vs:>5.2f}x {peak:>5} / {args.limit:<3}"
            )
        lease = [r[1]["calls_per_s"] / r[3]["calls_per_s"] for r in rounds]
        share = [r[1]["calls_per_s"] / r[2]["calls_per_s"] for r in rounds]
        print(
            f"2 workers, calls/s: cluster / local {statistics.median(lease):.2f} "
            f"(rounds {', '.join(f'{x:.2f}' for x in lease)}); cluster / shares "
            f"{statistics.median(share):.2f} (rounds {', '.join(f'{x:.2f}' for x in share)})"
        )
    print(json.dumps(rounds))


if __name__ == "__main__":
    main()
