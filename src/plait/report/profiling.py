"""Profiling: when did each node of a run start and finish, and what did it cost.

Wrap any execution in `profile()` and read the records afterwards::

    with profile() as prof:
        pipeline.run_sync("some text")
    print(prof.table())
    prof.save("trace.json")          # open in ui.perfetto.dev or chrome://tracing
    report = prof.report()           # a `plait.report.RunReport` of what ran

The scheduler reports each node, the resource manager each request attempt
(its wait for limits, the request, its status) and a batch each finished
item to the active profiler through a context variable, so profiling costs
nothing when it is off. A node's time is split into the seconds its model
calls waited for limits (the run's or an endpoint's slots, a rate, a pause)
and the rest, its requests and its own work: a call queued behind others on
a busy endpoint is slow for want of a slot, not because the endpoint is.
With ``max_records`` a profiler keeps a uniform sample of that many records
of each kind (the counters and the per-second timeline stay exact), so
profiling a run of any length holds bounded memory.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plait import _context
from plait.backends.types import HoldsUsage, Usage
from plait.errors import BudgetExceededError

if TYPE_CHECKING:
    from plait.report import RunReport

__all__ = [
    "TIMELINE_STEP",
    "ItemOutcome",
    "NodeClock",
    "NodeTiming",
    "Profiler",
    "RequestTiming",
    "profile",
]

TIMELINE_STEP = 0.1
"""Seconds per bucket of the per-endpoint timeline at the start of a run."""
_MAX_BUCKETS = 2000
"""Buckets a timeline holds before it doubles its step."""


_NO_USAGE = Usage()
"""The usage of a node that made no model call (records only read it)."""


@dataclass(frozen=True, slots=True)
class NodeTiming(HoldsUsage):
    """One node execution (``input_tokens``, ``cost``, ``cache_hit`` … read its ``usage``)."""

    node_id: str
    module_path: str
    input_index: int | None
    start: float
    """Seconds since the profiler started."""
    end: float
    usage: Usage = field(default_factory=Usage)
    """What its model calls consumed: the reply's `Usage`, held, not copied."""
    finish_reason: str | None = None
    """Why the model stopped (``"length"``: cut off by the token limit); None for non-LLM nodes."""
    wait: float = 0.0
    """Seconds of it that its model calls spent waiting for limits (a slot, a rate, a pause)."""

    @property
    def duration(self) -> float:
        return self.end - self.start

    def span(self) -> dict[str, Any]:
        """Returns the record as a node span of a run report (``RunReport.spans``)."""
        usage = self.usage
        return {
            "node_id": self.node_id,
            "module_path": self.module_path,
            "input_index": self.input_index,
            "start": self.start,
            "end": self.end,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cost": usage.cost,
            "cache_hit": usage.cache_hit,
            "finish_reason": self.finish_reason,
            "wait": self.wait,
        }


@dataclass(frozen=True, slots=True)
class RequestTiming(HoldsUsage):
    """One attempt of one model call, as the resource manager saw it (``input_tokens``,
    ``cost`` … read its ``usage``)."""

    endpoint: str
    """The configuration entry that served it (an alias, or ``"*"``)."""
    alias: str
    """The alias the program used."""
    call: int
    """Number of the call within this profiler; the attempts of one call share it."""
    attempt: int
    """1 for the first attempt, 2 for the first retry, …"""
    queued: float
    """Seconds since the profiler started when the attempt began to wait for its limits."""
    sent: float
    """When it held its slot and was sent (``sent - queued`` is its wait)."""
    end: float
    """When its answer or error was in."""
    status: int | None = 200
    """HTTP status of the answer; None when there was none (timeout, dropped connection)."""
    error: str | None = None
    """The error, for a failed attempt."""
    usage: Usage = field(default_factory=Usage)
    """What a successful attempt consumed: its reply's `Usage`, held, not copied."""

    @property
    def wait(self) -> float:
        """Seconds spent waiting for a slot, a rate or a pause."""
        return self.sent - self.queued

    @property
    def duration(self) -> float:
        """Seconds from sending to the answer."""
        return self.end - self.sent

    def span(self) -> dict[str, Any]:
        """Returns the record as a request span of a run report (``RunReport.spans``)."""
        usage = self.usage
        return {
            "endpoint": self.endpoint,
            "alias": self.alias,
            "call": self.call,
            "attempt": self.attempt,
            "queued": self.queued,
            "sent": self.sent,
            "end": self.end,
            "status": self.status,
            "error": self.error,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cost": usage.cost,
        }


@dataclass(frozen=True, slots=True)
class ItemOutcome:
    """A failed batch item (successful ones are only counted)."""

    index: int
    error_type: str
    message: str
    node: str | None = None
    """The node that failed, when the error names one."""


class NodeClock:
    """Times one running node: when it started, and how long its model calls waited.

    While it is open (from `Profiler.start_node` to `stop`), every request
    attempt made inside the node, in its own calls or in those of nodes
    nested in it, adds its wait for limits to ``waited``.
    """

    __slots__ = ("_token", "start", "waited")

    def __init__(self, start: float) -> None:
        self.start = start
        self.waited = 0.0
        self._token = _OPEN_CLOCKS.set((*_OPEN_CLOCKS.get(), self))

    def stop(self) -> None:
        """Closes the clock: later attempts no longer count for this node."""
        _OPEN_CLOCKS.reset(self._token)


_OPEN_CLOCKS: contextvars.ContextVar[tuple[NodeClock, ...]] = contextvars.ContextVar(
    "plait_open_node_clocks", default=()
)
"""The clocks of the profiled nodes running in this context, outermost first."""


def _waited(seconds: float) -> None:
    """Counts ``seconds`` of waiting for limits in every node running here."""
    for clock in _OPEN_CLOCKS.get():
        clock.waited += seconds


class _TimedSlot:
    """Holds a semaphore as ``async with`` does, counting the wait for it as waiting."""

    __slots__ = ("_now", "_slots")

    def __init__(self, slots: Any, now: Callable[[], float]) -> None:
        self._slots = slots
        self._now = now

    async def __aenter__(self) -> None:
        queued = self._now()
        await self._slots.acquire()
        _waited(self._now() - queued)

    async def __aexit__(self, *exc_info: object) -> None:
        self._slots.release()


class _Reservoir:
    """A uniform sample of at most ``size`` of the items offered (Algorithm R), or all of them.

    An item is counted (`place`) before it is made, and made only when the
    sample keeps it (`keep`): a long run's records are mostly passed over, and
    building each of them only to drop it was most of what profiling cost a row.
    """

    __slots__ = ("items", "seen", "size")

    def __init__(self, size: int | None) -> None:
        self.size = size
        self.items: list[Any] = []
        self.seen = 0

    def place(self, rng: random.Random) -> int | None:
        """Counts one item offered; returns its place in the sample (``len(items)``: at
        the end), or None when the sample passes it over."""
        self.seen += 1
        kept = len(self.items)
        if self.size is None or kept < self.size:
            return kept
        slot = rng.randrange(self.seen)
        return slot if slot < self.size else None

    def keep(self, place: int, item: Any) -> None:
        """Puts ``item`` at the ``place`` that `place` gave it."""
        if place == len(self.items):
            self.items.append(item)
        else:
            self.items[place] = item


class _Timeline:
    """Per-bucket sums of one endpoint's traffic: exact, and at most ``_MAX_BUCKETS`` long.

    Buckets start at ``TIMELINE_STEP`` seconds; when a run outlasts
    ``_MAX_BUCKETS`` of them, neighbours merge and the step doubles, so a run
    of any length keeps a bounded timeline.
    """

    __slots__ = ("busy", "errors", "rate_limited", "requests", "step", "waiting")

    def __init__(self) -> None:
        self.step = TIMELINE_STEP
        self.busy: defaultdict[int, float] = defaultdict(float)
        """Request-seconds in flight per bucket (divided by the step: mean requests in flight)."""
        self.waiting: defaultdict[int, float] = defaultdict(float)
        self.requests: defaultdict[int, int] = defaultdict(int)
        self.rate_limited: defaultdict[int, int] = defaultdict(int)
        self.errors: defaultdict[int, int] = defaultdict(int)

    def add(self, queued: float, sent: float, end: float, status: int | None, failed: bool) -> None:
        """Adds one request attempt (the times and status of its `RequestTiming`)."""
        while end / self.step >= _MAX_BUCKETS:
            self._coarsen()
        self._spread(self.waiting, queued, sent)
        self._spread(self.busy, sent, end)
        bucket = int(sent // self.step)
        self.requests[bucket] += 1
        if status == 429:
            self.rate_limited[bucket] += 1
        elif failed:
            self.errors[bucket] += 1

    def _spread(self, buckets: defaultdict[int, float], start: float, end: float) -> None:
        """Adds the seconds of ``[start, end)`` to the buckets they fall in."""
        if end <= start:
            return
        step = self.step
        first, last = int(start // step), int(end // step)
        if first == last:
            buckets[first] += end - start
            return
        buckets[first] += (first + 1) * step - start
        for bucket in range(first + 1, last):
            buckets[bucket] += step
        buckets[last] += end - last * step

    def _coarsen(self) -> None:
        self.step *= 2
        for name in ("busy", "waiting", "requests", "rate_limited", "errors"):
            old = getattr(self, name)
            merged: defaultdict[int, Any] = defaultdict(old.default_factory)
            for bucket, value in old.items():
                merged[bucket // 2] += value
            setattr(self, name, merged)


class Profiler:
    """Collects a `NodeTiming` for every LLM call or async leaf run while active.

    It also collects a `RequestTiming` per request attempt (``requests``), an
    `ItemOutcome` per failed batch item (``failures``), exact counters, and a
    per-second timeline of each endpoint.

    Args:
        max_records: keep at most this many node records and as many request
            records, a uniform sample of the run (None: keep all). Counters,
            usage and the timeline are exact either way.
        max_failures: keep the first this many failed items (all are counted).
    """

    def __init__(self, max_records: int | None = None, max_failures: int = 1000) -> None:
        if max_records is not None and max_records < 1:
            raise ValueError(f"max_records must be at least 1 or None, got {max_records}")
        self._nodes = _Reservoir(max_records)
        self._requests = _Reservoir(max_records)
        self.records: list[NodeTiming] = self._nodes.items
        """The node records (a uniform sample when ``max_records`` is set)."""
        self.requests: list[RequestTiming] = self._requests.items
        """The request attempts (a uniform sample when ``max_records`` is set)."""
        self.failures: list[ItemOutcome] = []
        """The first ``max_failures`` failed batch items, in the order they failed."""
        self.items_ok = 0
        """Batch items that finished with an output."""
        self.items_failed = 0
        """Batch items that failed."""
        self.items_restored = 0
        """Batch items among ``items_ok`` whose output came from a checkpoint, not a run."""
        self.items_refused = 0
        """Batch items among ``items_failed`` that a budget left undone (it refused a call)."""
        self.unpriced: set[str] = set()
        """Aliases some of whose calls an endpoint without a price answered: their cost is
        unknown, not zero (an unpriced primary whose priced backup answered leaves it known)."""
        self.nodes_seen = 0
        """Node records offered, kept or not."""
        self.timelines: dict[str, _Timeline] = {}
        """Per endpoint, the per-second timeline of its requests."""
        self.alias_totals: dict[str, dict[str, float]] = {}
        """Per alias: calls, cache_hits, requests, retries, rate_limited, failures, tokens, cost."""
        self.endpoints: dict[str, dict[str, Any]] = {}
        """Per endpoint: ``served`` (calls it answered), ``failed`` (calls that failed there
        after their last attempt), ``skipped`` (calls that passed it by, its circuit open),
        and its circuit's news: ``circuit_opened_at`` (epoch seconds, while open),
        ``circuit_failures`` (failed calls in a row when it last opened or closed),
        ``circuit_openings``."""
        self.chains: dict[str, list[str]] = {}
        """Per alias, the endpoints its calls went to or skipped, in the order first seen:
        an alias with more than one is a fallback chain at work."""
        self.started_at = time.time()
        """Wall-clock time (epoch seconds) the profiler was created."""
        self._max_failures = max_failures
        self._programs: dict[str, str] = {}
        self._calls = itertools.count(1)
        self._rng = random.Random(0)
        self._origin = time.perf_counter()
        self._token: contextvars.Token[Any] | None = None

    def now(self) -> float:
        """Returns seconds since this profiler started."""
        return time.perf_counter() - self._origin

    def start_node(self) -> NodeClock:
        """Starts timing a node (called by the scheduler); `stop` the clock when it ends."""
        return NodeClock(self.now())

    def timed_slot(self, slots: Any) -> _TimedSlot:
        """Returns ``slots`` (anything with ``acquire``/``release``, such as one of the
        run's LLM-call slots, called by its executor) to hold with ``async with``, the
        wait counted for the running nodes."""
        return _TimedSlot(slots, self.now)

    def record(
        self,
        node_id: str,
        module_path: str,
        index: int | None,
        clock: NodeClock,
        meta: dict[str, Any],
    ) -> None:
        """Adds one finished node (called by the scheduler) timed by ``clock``."""
        self.nodes_seen += 1
        usage = meta.get("usage", _NO_USAGE)
        place = self._nodes.place(self._rng)
        if place is not None:
            if self._programs:
                node_id, module_path = self.shown_path(node_id), self.shown_path(module_path)
            timing = NodeTiming(
                node_id=node_id,
                module_path=module_path,
                input_index=index,
                start=clock.start,
                end=self.now(),
                usage=usage,
                finish_reason=meta.get("finish_reason"),
                wait=clock.waited,
            )
            self._nodes.keep(place, timing)
        if usage.cached:
            self._alias(meta.get("alias") or module_path)["cache_hits"] += 1

    def show_program_at(self, path: str, name: str) -> None:
        """Names the modules of a program that a harness runs at ``path`` as the program does.

        A harness that wraps a program to run it (the Trainer runs it inside
        its training step, at ``step.module``) lengthens the paths of the
        program's modules (``step.module.answer``) and names the program by
        its own attribute. Records then take the paths a call of the program
        alone gives (``answer``), and ``name`` for the program itself.
        """
        self._programs[path] = name

    def shown_path(self, path: str) -> str:
        """Returns ``path`` as the program it belongs to names it (see `show_program_at`)."""
        for prefix, name in self._programs.items():
            if path == prefix:
                return name
            if path.startswith(prefix + "."):
                return path[len(prefix) + 1 :]
        return path

    def next_call(self) -> int:
        """Returns a new call number for the attempts of one model call (resource manager)."""
        return next(self._calls)

    def record_request(
        self,
        endpoint: str,
        alias: str,
        call: int,
        attempt: int,
        queued: float,
        sent: float,
        *,
        status: int | None = 200,
        error: BaseException | None = None,
        usage: Usage | None = None,
        final: bool = True,
        priced: bool = True,
    ) -> None:
        """Adds one finished request attempt (called by the resource manager).

        Its wait counts for every node running it (see `NodeClock`).

        Args:
            endpoint: the configuration entry serving the call.
            alias: the alias the program used.
            call: `next_call` number shared by the attempts of one call.
            attempt: 1, 2, … within the call.
            queued: `now` when the attempt began waiting for its limits.
            sent: `now` when it was sent.
            status: HTTP status of the answer (None: no answer).
            error: the attempt's error; None when it succeeded.
            usage: the `Usage` of a successful attempt.
            final: False when the call will be retried after this attempt.
            priced: False when the endpoint has no price (the cost of its answer is unknown).
        """
        end = self.now()
        _waited(sent - queued)
        if not priced and error is None:  # a failed attempt answered nothing to price
            self.unpriced.add(alias)
        place = self._requests.place(self._rng)
        if place is not None:
            timing = RequestTiming(
                endpoint,
                alias,
                call,
                attempt,
                queued,
                sent,
                end,
                status,
                None if error is None else f"{type(error).__name__}: {error}",
                _NO_USAGE if usage is None else usage,
            )
            self._requests.keep(place, timing)
        timeline = self.timelines.get(endpoint)
        if timeline is None:
            timeline = self.timelines[endpoint] = _Timeline()
        timeline.add(queued, sent, end, status, error is not None)
        totals = self._alias(alias)
        totals["requests"] += 1
        if attempt > 1:
            totals["retries"] += 1
        if status == 429:
            totals["rate_limited"] += 1
        served = self._endpoint(endpoint, alias)
        if error is None:
            self.record_usage(alias, _NO_USAGE if usage is None else usage)
            served["served"] += 1
        elif final:
            totals["failures"] += 1
            served["failed"] += 1

    def record_skip(self, endpoint: str, alias: str) -> None:
        """Counts a call of ``alias`` that skipped ``endpoint``, its circuit open (called by
        the circuit)."""
        self._endpoint(endpoint, alias)["skipped"] += 1

    def record_circuit(
        self, endpoint: str, state: str, failures: int, opened_at: float | None
    ) -> None:
        """Notes that ``endpoint``'s circuit ``state`` (``"opened"`` or ``"closed"``) after
        ``failures`` failed calls in a row (called by the circuit)."""
        news = self._endpoint(endpoint, None)
        news["circuit_failures"] = failures
        if state == "opened":
            news["circuit_openings"] += 1
            news["circuit_opened_at"] = opened_at
        else:
            news["circuit_opened_at"] = None

    def _endpoint(self, endpoint: str, alias: str | None) -> dict[str, Any]:
        if alias is not None:
            members = self.chains.setdefault(alias, [])
            if endpoint not in members:
                members.append(endpoint)
        news = self.endpoints.get(endpoint)
        if news is None:
            news = self.endpoints[endpoint] = {
                "served": 0,
                "failed": 0,
                "skipped": 0,
                "circuit_openings": 0,
                "circuit_failures": 0,
                "circuit_opened_at": None,
            }
        return news

    def record_usage(self, alias: str, usage: Usage, calls: int = 1) -> None:
        """Adds finished calls to an alias's totals (a successful request attempt's, or
        those of a provider batch job, made outside the request path)."""
        totals = self._alias(alias)
        totals["calls"] += calls
        totals["input_tokens"] += usage.input_tokens
        totals["output_tokens"] += usage.output_tokens
        totals["cost"] += usage.cost

    def _alias(self, alias: str) -> dict[str, float]:
        totals = self.alias_totals.get(alias)
        if totals is None:
            totals = self.alias_totals[alias] = dict.fromkeys(_ALIAS_KEYS, 0)
            totals["cost"] = 0.0
        return totals

    def record_item(
        self, index: int, error: BaseException | None, *, restored: bool = False
    ) -> None:
        """Counts one finished batch item and keeps the first failures (called by a batch).

        ``restored``: its output was read back from a checkpoint, not run.
        """
        if error is None:
            self.items_ok += 1
            self.items_restored += restored
            return
        self.items_failed += 1
        self.items_refused += budget_refusal(error) is not None
        if len(self.failures) < self._max_failures:
            node = getattr(error, "node_id", None)
            if node is not None:
                node = self.shown_path(node)
            self.failures.append(ItemOutcome(index, type(error).__name__, str(error)[:2000], node))

    @property
    def wall_time(self) -> float:
        """Seconds from the first node's start to the last node's end."""
        if not self.records:
            return 0.0
        return max(r.end for r in self.records) - min(r.start for r in self.records)

    def table(self) -> str:
        """Returns a plain-text table of the records, in start order (``wait``: the seconds
        of ``secs`` spent waiting for limits)."""
        header = (
            f"{'node':<32} {'start':>8} {'end':>8} {'secs':>7} {'wait':>7} {'tokens in/out':>14}"
        )
        rows = [header]
        for r in sorted(self.records, key=lambda r: r.start):
            label = r.node_id if r.input_index is None else f"{r.node_id}[{r.input_index}]"
            tokens = f"{r.input_tokens}/{r.output_tokens}"
            rows.append(
                f"{label:<32} {r.start:8.2f} {r.end:8.2f} {r.duration:7.2f} {r.wait:7.2f} "
                f"{tokens:>14}" + ("  (cached)" if r.cache_hit else "")
            )
        total = sum(r.duration for r in self.records)
        rows.append(
            f"{len(self.records)} nodes; wall {self.wall_time:.2f} s; "
            f"sum of node times {total:.2f} s"
        )
        return "\n".join(rows)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the run's timeline as a Chrome / Perfetto trace (JSON) to ``path``.

        One process per endpoint and one per module, with a thread per lane of
        overlapping spans: waits for limits, requests (named by status) and
        retries on the endpoint tracks, node runs on the module tracks. Open it
        in ui.perfetto.dev or chrome://tracing.
        """
        self.report().save_trace(path)

    def report(self, **details: Any) -> RunReport:
        """Returns a `plait.report.RunReport` of what this profiler saw.

        Args:
            **details: passed to `RunReport.from_profiler` (``program``,
                ``kind``, ``graph``, ``training``, ``learning``, ``metrics``).
        """
        # cycle: plait.report imports this module (the report builds on it)
        from plait.report import RunReport

        return RunReport.from_profiler(self, **details)

    def __enter__(self) -> Profiler:
        self._token = _context.PROFILE.set(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _context.PROFILE.reset(self._token)
            self._token = None


_ALIAS_KEYS = (
    "calls",
    "cache_hits",
    "requests",
    "retries",
    "rate_limited",
    "failures",
    "input_tokens",
    "output_tokens",
    "cost",
)


def profile(max_records: int | None = None) -> Profiler:
    """Returns a profiler to use as ``with profile() as prof:`` (see `Profiler`)."""
    return Profiler(max_records)


def budget_refusal(error: BaseException) -> BudgetExceededError | None:
    """Returns the budget's refusal (`BudgetExceededError`) that made an item fail, if that
    is what did: the item is then work left undone, told apart from a failure."""
    seen: BaseException | None = error
    for _ in range(8):  # a module of the program may have wrapped it (BestOfN's, say)
        if seen is None:
            return None
        if isinstance(seen, BudgetExceededError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
