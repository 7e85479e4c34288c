"""The Ray lease ledger at 8, 32 and 128 workers, simulated in one process.

Two cores cannot run a cluster, but the lease protocol does not need one: each worker
here is a real `LeasedLimiter` reaching a real `LeaseLedger` through a `LocalLink`
(messages delayed at random up to 1 ms each way, out of order, as Ray's actor calls
may be), its calls sleeps of the upstream's latency (20 ms ± 25 %), on an event loop
whose clock jumps to its next timer (`plait.testing.lease_sim`). Each worker keeps 64
calls in flight when it may; an eighth of the workers join during the run, an eighth
die at a quarter of it (their links cut, their calls gone) and an eighth leave at half.

For each scenario it prints the calls per second against the limit's ideal (limit /
latency), the ledger's messages per call (goal ≤ 0.05), the most permits leased and
calls in flight against the limit (goal: never above), the seconds a dead worker's
permits took to come back (goal ≤ the lease term, 10 s) and the lowest and highest
worker's calls over its fair share (goal: within 0.8–1.2), and the CPU seconds the
simulation took (the ledger's and the limiters' Python, not Ray's).

``--ray`` adds what the model of ``docs/how-to/ray-scaling.md`` needs from Ray itself: how many
messages a second one limits actor (`plait.distributed.ray.EndpointLimits`, on a local
Ray) answers, sent by the driver 256 at a time (a floor: the driver shares the cores).

    python benchmarks/ray_lease_sim.py [--duration 30] [--scarce-duration 60] [--ray]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from plait.testing.lease_sim import Scenario, SimResult, simulate

GOAL_MESSAGES = 0.05
GOAL_FAIRNESS = (0.8, 1.2)


def row(name: str, result: SimResult, cpu: float) -> str:
    scenario = result.scenario
    ideal = scenario.limit / scenario.latency
    low, high = result.worst_fairness
    back = max(result.returned_after, default=0.0)
    ok = (
        result.messages_per_call <= GOAL_MESSAGES
        and result.limit_held
        and back <= scenario.term
        and GOAL_FAIRNESS[0] <= low
        and high <= GOAL_FAIRNESS[1]
    )
    return (
        f"{name:<22} {scenario.workers:>4} {scenario.limit:>5} "
        f"{result.calls_per_second:>7.0f} {result.calls_per_second / ideal:>5.2f} "
        f"{result.messages_per_call:>8.4f} {result.peak_leased:>4}/{result.peak_in_flight:<4} "
        f"{back:>6.2f} {len(result.returned_after):>4} "
        f"{low:>5.2f}-{high:<5.2f} {len(result.fairness):>4} {cpu:>6.1f}  "
        f"{'ok' if ok else 'MISSED'}"
    )


async def _actor_rate(actor: object, method: str, args: tuple, messages: int) -> float:
    """Messages a second the actor answers, ``messages`` of ``method`` in windows of 256."""
    call = getattr(actor, method).remote
    started = time.perf_counter()
    for _ in range(messages // 256):
        await asyncio.gather(*(call(*args) for _ in range(256)))
    return messages / (time.perf_counter() - started)


def ray_actor_capacity(messages: int = 8192) -> None:
    """Prints the messages a second one `EndpointLimits` actor answers on a local Ray."""
    import ray  # an optional dependency (the ray extra), only for --ray

    from plait.distributed.ray import EndpointLimits

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actor = EndpointLimits.remote(256)  # type: ignore[attr-defined]
        ray.get(actor.stats.remote())
        asyncio.run(_actor_rate(actor, "give", ("nobody", 0, 0), 1024))  # warm-up
        gives = asyncio.run(_actor_rate(actor, "give", ("nobody", 0, 0), messages))
        opens = asyncio.run(_actor_rate(actor, "open", ("w", None), messages))
        print(
            f"one limits actor on a local Ray (2 cores, the driver sending): {gives:,.0f} "
            f"messages/s (a give of no lease), {opens:,.0f} messages/s (a lease renewed)"
        )
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=30.0, help="simulated seconds")
    parser.add_argument(
        "--scarce-duration",
        type=float,
        default=60.0,
        help="simulated seconds of the run with more workers than permits (turns)",
    )
    parser.add_argument("--workers", type=int, nargs="*", default=[8, 32, 128])
    parser.add_argument("--ray", action="store_true", help="also measure a Ray limits actor")
    args = parser.parse_args()
    scenarios = [
        (f"limit 256, {n} workers", Scenario(workers=n, limit=256, duration=args.duration))
        for n in args.workers
    ]
    most = max(args.workers)
    scenarios.append(
        (
            f"limit {most // 2}: turns",
            # taking turns, a worker's share shows over several rounds of turns (4 s each)
            Scenario(workers=most, limit=most // 2, duration=args.scarce_duration, judged_after=20),
        )
    )
    print(
        "lease ledger, simulated workers on virtual time; 64 calls in flight a worker, "
        "20 ms upstream, 1/8 join, 1/8 die, 1/8 leave"
    )
    print(
        f"{'scenario':<22} {'wkrs':>4} {'limit':>5} {'calls/s':>7} {'ideal':>5} "
        f"{'msg/call':>8} {'leased/flight':>9} {'back s':>6} {'dead':>4} "
        f"{'fair share':>11} {'jdgd':>4} {'cpu s':>6}"
    )
    for name, scenario in scenarios:
        started = time.process_time()
        result = simulate(scenario)
        print(row(name, result, time.process_time() - started), flush=True)
    print(
        f"goals: msg/call <= {GOAL_MESSAGES}; leased and in flight <= limit; a dead worker's "
        f"permits back <= the term (10 s); every judged worker within "
        f"{GOAL_FAIRNESS[0]}-{GOAL_FAIRNESS[1]} of its fair share"
    )
    if args.ray:
        ray_actor_capacity()


if __name__ == "__main__":
    main()
