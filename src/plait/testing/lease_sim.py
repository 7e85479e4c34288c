"""A cluster of simulated workers sharing one `LeaseLedger`, in one process, on virtual time.

Two cores cannot run 128 Ray workers, but the lease protocol does not need them to be
real: each simulated worker is a real `LeasedLimiter` reaching a real `LeaseLedger`
through a `LocalLink` (every message a task of its own, delayed at random as Ray's
actor calls are, so they arrive out of order), and its calls are sleeps of an upstream's
latency between ``acquire`` and ``release``. The event loop is a `VirtualTimeLoop`: when
nothing is ready it jumps to its next timer instead of waiting, so 30 seconds of a
cluster run in the CPU time its Python takes, and the ledger and every limiter read the
loop's clock.

`simulate` runs one `Scenario` (workers that start together, others that join later,
some that leave and some that die) and returns a `SimResult`: the ledger's messages per
call, the most permits leased and calls in flight against the limit, how long a dead
worker's permits took to come back, and each worker's calls against its fair share.
``benchmarks/ray_lease_sim.py`` prints them at 8, 32 and 128 workers;
``tests/distributed/test_lease_sim.py`` checks the same invariants at small scale.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import selectors
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from plait.distributed.leased_limiter import LeasedLimiter
from plait.distributed.leases import DEFAULT_TERM, LeaseLedger, LocalLink

__all__ = ["Scenario", "SimResult", "VirtualTimeLoop", "simulate"]


class _JumpingSelector(selectors.DefaultSelector):
    """Polls its file descriptors without blocking; where the loop would wait for its next
    timer, moves the loop's clock there instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready: list[Any] = super().select(0)
        if not ready and timeout is None:
            raise RuntimeError("the simulation waits for nothing: no timer and no task ready")
        if not ready and timeout:
            self._loop.now += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock stands still while callbacks run and jumps to the next
    timer when none is ready: sleeps cost no wall time, timers keep their order."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now


@dataclass
class Scenario:
    """One simulated run: its cluster, its load and its churn."""

    workers: int
    """Workers alive at the busiest time (those that join later included)."""
    limit: int
    """The endpoint's ``max_concurrent`` across the cluster."""
    per_worker: int = 64
    """Calls each worker keeps in flight when it can (its own ``max_concurrent``)."""
    latency: float = 0.02
    """Seconds an upstream call takes, ± ``jitter`` of it at random."""
    jitter: float = 0.25
    duration: float = 30.0
    """Seconds of the run (virtual)."""
    churn: float = 1 / 8
    """The part of the workers that join late; as many leave, and as many die."""
    link_delay: float = 0.0005
    """Mean seconds a message (and its answer) spends on the way, at random up to 2 ×."""
    term: float = DEFAULT_TERM
    seed: int = 0
    judged_after: float = 2.0
    """Seconds a worker must have been calling for its fairness to be judged (taking
    turns, a worker's share shows only over several rounds of turns)."""
    ledger_options: dict[str, Any] = field(default_factory=dict)
    """More `LeaseLedger` arguments (a lease policy under test)."""


@dataclass
class SimResult:
    """What one `Scenario` measured."""

    scenario: Scenario
    calls: int
    messages: int
    """Messages the ledger received, of every kind."""
    asks: int
    peak_leased: int
    peak_in_flight: int
    """Calls between their acquire and release at once, across the cluster, at most."""
    returned_after: list[float]
    """Per dead worker: seconds from its death until the ledger took its permits back."""
    held_at_death: list[int]
    """Per dead worker: the permits its lease held when it died."""
    fairness: dict[str, float]
    """Per worker calling for ``judged_after`` whole seconds or more: its calls over its
    fair share."""

    @property
    def messages_per_call(self) -> float:
        return self.messages / max(self.calls, 1)

    @property
    def calls_per_second(self) -> float:
        return self.calls / self.scenario.duration

    @property
    def limit_held(self) -> bool:
        limit = self.scenario.limit
        return self.peak_leased <= limit and self.peak_in_flight <= limit

    @property
    def worst_fairness(self) -> tuple[float, float]:
        """The lowest and the highest share of `fairness` (1.0, 1.0 with none)."""
        shares = list(self.fairness.values()) or [1.0]
        return min(shares), max(shares)


class _Worker:
    """One simulated worker: a `LeasedLimiter`, its link, its call loops, its counts."""

    def __init__(self, name: str, ledger: LeaseLedger, scenario: Scenario, rng: random.Random):
        def delay() -> float:
            return rng.uniform(0.0, 2 * scenario.link_delay)

        self.name = name
        self.link = LocalLink(ledger, delay)
        self.limiter = LeasedLimiter(
            self.link, max_concurrent=ledger.max_concurrent, name=name, clock=_clock()
        )
        self.calls: Counter[int] = Counter()
        """Calls finished, by second of the run."""
        self.alive_from = 0.0
        self.alive_until = math.inf
        self.stopping = False
        self.tasks: list[asyncio.Task[None]] = []


class _Cluster:
    """The workers of one run, the ledger, and what a server would see (calls in flight)."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.rng = random.Random(scenario.seed)
        self.ledger = LeaseLedger(
            scenario.limit, term=scenario.term, clock=_clock(), **scenario.ledger_options
        )
        self.workers: list[_Worker] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self.returned_after: list[float] = []
        self.held_at_death: list[int] = []
        self._watchers: list[asyncio.Task[None]] = []

    async def start(self, index: int) -> _Worker:
        worker = _Worker(f"w{index:03d}", self.ledger, self.scenario, self.rng)
        worker.alive_from = _clock()()
        self.workers.append(worker)
        await worker.limiter.open()  # as a real worker does when it starts
        worker.tasks = [
            asyncio.create_task(self._call_loop(worker)) for _ in range(self.scenario.per_worker)
        ]
        return worker

    async def _call_loop(self, worker: _Worker) -> None:
        scenario, rng, clock = self.scenario, self.rng, _clock()
        while not worker.stopping:
            await worker.limiter.acquire()
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            try:
                spread = scenario.latency * scenario.jitter
                await asyncio.sleep(scenario.latency + rng.uniform(-spread, spread))
            finally:
                self.in_flight -= 1  # a dead worker's calls end with it
            worker.limiter.release()
            worker.calls[int(clock())] += 1

    def leave(self, worker: _Worker) -> None:
        """Stops the worker's calls; its limiter gives its permits back as they idle."""
        worker.stopping = True
        worker.alive_until = _clock()()

    async def die(self, worker: _Worker) -> None:
        """Kills the worker at once: its link drops everything, its calls end unanswered."""
        now = _clock()()
        held = (await self.ledger.stats())["holders"].get(worker.name, 0)
        worker.link.cut()
        worker.alive_until = now
        worker.stopping = True
        for task in worker.tasks:
            task.cancel()
        self.held_at_death.append(held)
        self._watchers.append(asyncio.create_task(self._watch_return(worker.name, now)))

    async def _watch_return(self, name: str, died: float) -> None:
        while name in (await self.ledger.stats())["holders"]:
            await asyncio.sleep(0.01)
        self.returned_after.append(_clock()() - died)

    def close(self) -> None:
        for worker in self.workers:
            worker.stopping = True
            for task in worker.tasks:
                task.cancel()
            worker.link.close()
        for watcher in self._watchers:
            watcher.cancel()

    def fairness(self) -> dict[str, float]:
        """Each worker's calls over its fair share, over the whole seconds it was alive and
        calling (not its first second, while it opens its lease): in each second, the calls
        of all the workers calling then, split evenly among them."""
        seconds = int(self.scenario.duration)
        totals: Counter[int] = Counter()
        calling: dict[int, float] = {}  # workers calling in each second (parts of one)
        spans = {}
        for worker in self.workers:
            start, end = worker.alive_from, min(worker.alive_until, seconds)
            for second in range(int(start), math.ceil(end)):
                part = min(end, second + 1) - max(start, second)
                calling[second] = calling.get(second, 0.0) + part
            spans[worker.name] = range(math.ceil(start) + 1, math.floor(end))
            for second, calls in worker.calls.items():
                totals[second] += calls
        shares = {}
        for worker in self.workers:
            span = spans[worker.name]
            fair = sum(totals[s] / calling[s] for s in span)
            if len(span) >= self.scenario.judged_after and fair > 0:
                shares[worker.name] = sum(worker.calls[s] for s in span) / fair
        return shares


def _clock() -> Any:
    return asyncio.get_running_loop().time


async def _run(scenario: Scenario) -> SimResult:
    cluster = _Cluster(scenario)
    total, churn = scenario.workers, max(1, round(scenario.workers * scenario.churn))
    duration = scenario.duration
    starting = [await cluster.start(i) for i in range(total - churn)]
    events: list[tuple[float, str, int]] = []
    for k in range(churn):  # joins spread over 10-40 % of the run
        events.append((duration * (0.1 + 0.3 * k / churn), "join", total - churn + k))
    dying, leaving = starting[:churn], starting[churn : 2 * churn]
    events += [(duration * 0.25, "die", i) for i in range(len(dying))]
    events += [(duration * (0.5 + 0.1 * k / churn), "leave", k) for k in range(len(leaving))]
    started = _clock()()
    try:
        for at, kind, index in sorted(events):
            await asyncio.sleep(max(0.0, started + at - _clock()()))
            if kind == "join":
                await cluster.start(index)
            elif kind == "die":
                await cluster.die(dying[index])
            else:
                cluster.leave(leaving[index])
        await asyncio.sleep(max(0.0, started + duration - _clock()()))
        stats = await cluster.ledger.stats()
        calls = sum(sum(w.calls.values()) for w in cluster.workers)
        return SimResult(
            scenario=scenario,
            calls=calls,
            messages=stats["messages"],
            asks=stats["asks"],
            peak_leased=stats["peak_leased"],
            peak_in_flight=cluster.peak_in_flight,
            returned_after=cluster.returned_after,
            held_at_death=cluster.held_at_death,
            fairness=cluster.fairness(),
        )
    finally:
        cluster.close()


def simulate(scenario: Scenario) -> SimResult:
    """Runs ``scenario`` on a `VirtualTimeLoop` of its own and returns what it measured."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        result = runner.run(_run(scenario))
        with contextlib.suppress(Exception):
            runner.run(asyncio.sleep(0))
    return result
