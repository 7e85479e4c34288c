"""Per-endpoint limits: concurrency slots, request and token buckets, pauses.

One `Limiter` guards one endpoint. A call acquires it before it is sent and
releases it when its answer (or error) is in, and in between it holds:

* a **slot**, of at most ``max_concurrent``;
* one **request** from the ``rpm`` bucket and an estimate of its **tokens**
  from the ``tpm`` bucket (the estimate is corrected on release, from the
  usage the provider reported);

and it is not sent while the endpoint is **paused** (a ``Retry-After`` from
the provider pauses the whole endpoint, not only the request that got it).

On repeated 429s the limiter lowers its rates and its concurrency window
(halving, down to a floor) and raises them back a little on every success,
so a run settles just under what the provider accepts. With neither rate
nor ``max_concurrent`` configured there is nothing to lower, and pauses and
backoff are the only brakes.

Waiting is first come, first served: slot waiters queue in order, and the
rate gate is a FIFO lock held by the one waiter that is sleeping for tokens.
A slot is taken before tokens, so tokens are spent only when the request can
go at once; taking them first and then waiting for a slot would let queued
requests burst together when slots free up.

Time comes from an injected ``clock`` and ``sleep``, so tests drive the
limiter with a fake clock instead of real sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from plait.backends import providers

if TYPE_CHECKING:
    from plait.resources.config import EndpointConfig

__all__ = [
    "Adaptation",
    "EndpointLimiter",
    "Limiter",
    "TokenBucket",
    "limiter_shares",
    "runs_in_each_process",
    "too_small_to_share",
]

_EPSILON = 1e-9


class EndpointLimiter(Protocol):
    """What the manager asks of an endpoint's limiter: the interface `Limiter` has.

    `Limiter` keeps the limits in this process; `plait.distributed`'s
    `LeasedLimiter` leases them from a ledger shared by workers. A
    ``limiter_factory`` given to `ResourceManager` returns one of these; mypy
    checks that both limiters have every member.
    """

    @property
    def tpm(self) -> float | None:
        """The configured tokens per minute (None: not limited): whether to estimate tokens."""
        ...

    async def acquire(self, tokens: int = 0) -> float:
        """Waits until a call may be sent, reserving ``tokens``; returns the seconds waited."""
        ...

    def release(self, reserved: int = 0, used: int | None = None) -> None:
        """Frees the call's slot; with ``used``, corrects its token reservation."""
        ...

    def on_success(self) -> None:
        """Records a successful call (limits lowered by 429s recover a step)."""
        ...

    def on_rate_limited(self, retry_after: float | None = None) -> None:
        """Records a 429: pauses for ``retry_after`` and lowers the limits."""
        ...

    def pause_for(self, seconds: float) -> None:
        """Sends nothing new for ``seconds``."""
        ...

    # What `EndpointStats` reads.
    @property
    def acquired(self) -> int: ...
    @property
    def rate_limited(self) -> int: ...
    @property
    def wait_time_total(self) -> float: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def effective_rpm(self) -> float | None: ...
    @property
    def effective_tpm(self) -> float | None: ...
    @property
    def effective_max_concurrent(self) -> int | None: ...
    @property
    def paused_for(self) -> float: ...


class TokenBucket:
    """A bucket refilled at a steady rate, allowed to go into debt by one large take.

    A take waits until the bucket holds ``min(amount, capacity)``, so a single
    request larger than the burst capacity still goes (when the bucket is
    full) and the debt it leaves delays the next ones.
    """

    __slots__ = ("base_capacity", "base_rate", "capacity", "level", "rate", "stamp")

    def __init__(self, per_minute: float, burst_seconds: float, now: float) -> None:
        self.base_rate = per_minute / 60.0
        self.base_capacity = max(1.0, self.base_rate * burst_seconds)
        self.rate = self.base_rate
        self.capacity = self.base_capacity
        self.level = self.capacity
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
            self.stamp = now

    def delay(self, amount: float, now: float) -> float:
        """Returns the seconds until ``amount`` may be taken (0 when it may now)."""
        self._refill(now)
        missing = min(amount, self.capacity) - self.level
        return 0.0 if missing <= _EPSILON else missing / self.rate

    def take(self, amount: float) -> None:
        """Removes ``amount`` (after `delay` said it may); the level may go negative."""
        self.level -= amount

    def give(self, amount: float, now: float) -> None:
        """Returns ``amount`` (negative to charge more), never above capacity."""
        self._refill(now)
        self.level = min(self.capacity, self.level + amount)

    def scale(self, factor: float, now: float) -> None:
        """Sets rate and capacity to ``factor`` times their configured values."""
        self._refill(now)
        self.rate = self.base_rate * factor
        self.capacity = max(1.0, self.base_capacity * factor)
        self.level = min(self.level, self.capacity)


class Adaptation:
    """The factor 429s scale an endpoint's limits by: halved once per episode of 429s (those
    closer together than ``decrease_interval`` are one: a burst of in-flight requests
    rejected together halves once), never below ``min_scale``, and raised ``recovery_step``
    per successful call back to 1. `Limiter` and `plait.distributed.leases.LeaseLedger`
    both keep one, so an endpoint adapts the same way on one machine and across a cluster.
    """

    __slots__ = (
        "_last_decrease",
        "adaptive",
        "decrease_interval",
        "min_scale",
        "recovery_step",
        "scale",
    )

    def __init__(
        self, adaptive: bool, min_scale: float, recovery_step: float, decrease_interval: float
    ) -> None:
        self.adaptive = adaptive
        self.min_scale = min_scale
        self.recovery_step = recovery_step
        self.decrease_interval = decrease_interval
        self.scale = 1.0
        """The factor now (1.0: the limits as configured)."""
        self._last_decrease = -math.inf

    def lower(self, now: float) -> bool:
        """Halves the factor for a 429 seen at ``now``, unless adaptation is off or this
        episode already did; returns whether it did."""
        if not self.adaptive or now - self._last_decrease < self.decrease_interval:
            return False
        self._last_decrease = now
        self.scale = max(self.min_scale, self.scale / 2)
        return True

    def recover(self, successes: int = 1) -> bool:
        """Raises the factor by ``successes`` calls' steps; returns whether it was below 1."""
        if self.scale >= 1.0:
            return False
        self.scale = min(1.0, self.scale + self.recovery_step * successes)
        return True


class Limiter:
    """Concurrency, rpm, tpm and pause limits of one endpoint (an `EndpointLimiter`).

    Args:
        max_concurrent: calls in flight at once; None for no limit.
        rpm: requests per minute; None for no limit.
        tpm: tokens per minute; None for no limit.
        adaptive: lower rates and window on repeated 429s, recover on success.
        clock: monotonic seconds; `time.monotonic` unless a test injects one.
        sleep: coroutine that waits a number of seconds on ``clock``'s scale.
        burst_seconds: a bucket holds this many seconds' worth of its rate, so
            rpm=600 lets 10 requests go at once and then one per 0.1 s.
        min_scale: floor of the adaptive factor (0.1: never below 10 %).
        recovery_step: added to the adaptive factor per successful call.
        decrease_interval: 429s closer together than this count as one episode
            (a burst of in-flight requests rejected together halves once).

    Example::

        limiter = Limiter(max_concurrent=8, rpm=600)
        waited = await limiter.acquire(tokens=0)
        try:
            response = await send()
        finally:
            limiter.release()
    """

    def __init__(
        self,
        *,
        max_concurrent: int | None = None,
        rpm: float | None = None,
        tpm: float | None = None,
        adaptive: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        burst_seconds: float = 1.0,
        min_scale: float = 0.1,
        recovery_step: float = 0.02,
        decrease_interval: float = 1.0,
    ) -> None:
        now = clock()
        self.max_concurrent = max_concurrent
        self.rpm = rpm
        self.tpm = tpm
        self._adaptation = Adaptation(adaptive, min_scale, recovery_step, decrease_interval)
        self._clock = clock
        self._sleep = sleep
        self._requests = None if rpm is None else TokenBucket(rpm, burst_seconds, now)
        self._tokens = None if tpm is None else TokenBucket(tpm, burst_seconds, now)
        self._plain = rpm is None and tpm is None
        self._limit = max_concurrent
        self._in_flight = 0
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._gate = asyncio.Lock()
        self._paused_until = 0.0
        self._waiting = 0
        self.acquired = 0
        """Acquisitions so far."""
        self.waited = 0
        """Acquisitions that had to wait."""
        self.wait_time_total = 0.0
        """Seconds spent waiting in `acquire`, summed over all callers."""
        self.rate_limited = 0
        """429s reported through `on_rate_limited`."""

    # -- the hot path -------------------------------------------------------------------

    async def acquire(self, tokens: int = 0) -> float:
        """Waits until a call may be sent and reserves its slot, request and tokens.

        Args:
            tokens: estimated tokens of the call (prompt + completion), taken
                from the tpm bucket; correct it with `release(reserved, used)`.

        Returns:
            The seconds this caller waited.
        """
        self.acquired += 1
        limit = self._limit
        if (
            self._plain
            and not self._slot_waiters
            and (limit is None or self._in_flight < limit)
            and (not self._paused_until or self._paused_until <= self._clock())
        ):
            self._in_flight += 1
            return 0.0
        return await self._acquire_slow(tokens)

    def release(self, reserved: int = 0, used: int | None = None) -> None:
        """Frees the slot; with ``used`` set, corrects the token reservation to it.

        Args:
            reserved: the ``tokens`` passed to `acquire`.
            used: the tokens the call really consumed (0 for a rejected call);
                None keeps the reservation as it was.
        """
        self._in_flight -= 1
        if self._slot_waiters:
            self._wake()
        if self._tokens is not None and used is not None and used != reserved:
            self._tokens.give(reserved - used, self._clock())

    def on_success(self) -> None:
        """Records a successful call; recovers the adaptive factor a step."""
        if self._adaptation.scale < 1.0 and self._adaptation.recover():
            self._apply_scale()

    # -- waiting ------------------------------------------------------------------------

    async def _acquire_slow(self, tokens: int) -> float:
        clock = self._clock
        start = clock()
        self._waiting += 1
        try:
            await self._take_slot()
            try:
                if not self._plain or self._paused_until:
                    async with self._gate:
                        await self._wait_for_rate(tokens)
            except BaseException:
                self._release_slot()
                raise
        finally:
            self._waiting -= 1
        waited = clock() - start
        if waited > 0:
            self.waited += 1
            self.wait_time_total += waited
        return waited

    async def _wait_for_rate(self, tokens: int) -> None:
        requests, token_bucket = self._requests, self._tokens
        while True:
            now = self._clock()
            delay = self._paused_until - now
            if delay <= 0:
                self._paused_until = 0.0
                delay = 0.0 if requests is None else requests.delay(1, now)
                if token_bucket is not None:
                    delay = max(delay, token_bucket.delay(tokens, now))
                if delay <= 0:
                    break
            await self._sleep(delay)
        if requests is not None:
            requests.take(1)
        if token_bucket is not None:
            token_bucket.take(tokens)

    async def _take_slot(self) -> None:
        limit = self._limit
        if not self._slot_waiters and (limit is None or self._in_flight < limit):
            self._in_flight += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release_slot()  # a slot was handed over just as we were cancelled
            else:
                # `_wake` may have dropped it already, when a slot freed after
                # the cancel but before this task ran; the cancel must survive.
                with contextlib.suppress(ValueError):
                    self._slot_waiters.remove(waiter)
            raise

    def _release_slot(self) -> None:
        self._in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        """Hands free slots to waiters in order (the slot is counted for them here)."""
        waiters, limit = self._slot_waiters, self._limit
        while waiters and (limit is None or self._in_flight < limit):
            waiter = waiters.popleft()
            if not waiter.done():
                self._in_flight += 1
                waiter.set_result(None)

    # -- pauses and adaptation ----------------------------------------------------------

    def pause_for(self, seconds: float) -> None:
        """Sends nothing new for ``seconds`` from now (extends, never shortens a pause)."""
        until = self._clock() + seconds
        if until > self._paused_until:
            self._paused_until = until

    def on_rate_limited(self, retry_after: float | None = None) -> None:
        """Records a 429: pauses for ``retry_after`` and lowers the rate once per episode."""
        self.rate_limited += 1
        if retry_after is not None and retry_after > 0:
            self.pause_for(retry_after)
        if self._adaptation.lower(self._clock()):
            self._apply_scale()

    def _apply_scale(self) -> None:
        scale = self._adaptation.scale
        now = self._clock()
        if self._requests is not None:
            self._requests.scale(scale, now)
        if self._tokens is not None:
            self._tokens.scale(scale, now)
        if self.max_concurrent is not None:
            self._limit = max(1, int(self.max_concurrent * scale))
            if self._slot_waiters:
                self._wake()

    # -- observation --------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Calls holding a slot now."""
        return self._in_flight

    @property
    def queue_depth(self) -> int:
        """Callers waiting in `acquire` now (for a slot, a rate or a pause)."""
        return self._waiting

    @property
    def scale(self) -> float:
        """The adaptive factor applied to the configured limits (1.0 = as configured)."""
        return self._adaptation.scale

    @property
    def effective_rpm(self) -> float | None:
        """Requests per minute allowed now, or None when rpm is not limited."""
        return None if self.rpm is None else self.rpm * self._adaptation.scale

    @property
    def effective_tpm(self) -> float | None:
        """Tokens per minute allowed now, or None when tpm is not limited."""
        return None if self.tpm is None else self.tpm * self._adaptation.scale

    @property
    def effective_max_concurrent(self) -> int | None:
        """The concurrency window now, or None when concurrency is not limited."""
        return self._limit

    @property
    def paused_for(self) -> float:
        """Seconds left of the current pause (0 when not paused)."""
        return max(0.0, self._paused_until - self._clock()) if self._paused_until else 0.0


def limiter_shares(parts: int) -> Callable[[EndpointConfig], Limiter]:
    """Returns a ``limiter_factory`` for `ResourceManager` whose limiters hold one
    ``parts``-th of each endpoint's limits: ``max_concurrent // parts`` slots (at least one),
    ``rpm / parts`` and ``tpm / parts``. ``parts`` processes that each hold one share stay
    within the endpoint's limits together, without talking to each other, as long as every
    ``max_concurrent`` is at least ``parts`` (`too_small_to_share` finds those that are not);
    the price is that a share left idle by one process is not lent to another. An endpoint
    whose model runs in each process (`runs_in_each_process`) keeps its whole limits in each.
    """

    def share(config: EndpointConfig) -> Limiter:
        shares = 1 if runs_in_each_process(config) else parts

        def part(value: float | None) -> float | None:
            return None if value is None else value / shares

        concurrent = config.max_concurrent
        return Limiter(
            max_concurrent=None if concurrent is None else max(1, concurrent // shares),
            rpm=part(config.rpm),
            tpm=part(config.tpm),
            adaptive=config.adaptive,
        )

    return share


def too_small_to_share(endpoints: list[EndpointConfig], parts: int) -> list[str]:
    """Returns the endpoints whose ``max_concurrent`` is below ``parts``, described as
    ``"name (max_concurrent=N)"``: split ``parts`` ways, each share would still hold one slot,
    so together they would pass the limit. An endpoint whose model runs in each process is
    never one: it is not shared."""
    return [
        f"{endpoint.name} (max_concurrent={endpoint.max_concurrent})"
        for endpoint in endpoints
        if endpoint.max_concurrent is not None
        and endpoint.max_concurrent < parts
        and not runs_in_each_process(endpoint)
    ]


def runs_in_each_process(endpoint: EndpointConfig) -> bool:
    """Whether the endpoint's model runs inside each process that calls it (the ``local``
    embedded model: `ProviderSpec.in_process`), so processes share none of its limits."""
    spec = providers.get(endpoint.provider)
    return spec is not None and spec.in_process


if TYPE_CHECKING:  # mypy checks that Limiter has every member of the protocol
    _IS_ENDPOINT_LIMITER: type[EndpointLimiter] = Limiter
