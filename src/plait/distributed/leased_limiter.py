"""`LeasedLimiter`: a worker's side of the leases of `plait.distributed.leases`.

It stands in for the `Limiter` of one endpoint in a worker's `ResourceManager`, and
takes permits and rate tokens from the endpoint's `LeaseLedger` a few at a time; the
module doc of `plait.distributed.leases` tells the protocol. What this side owns: a call
goes when its permit is one of the lease's, its rate tokens were taken for it (or are
extras still within ``hold``), and the endpoint is not paused; freed permits go to the
next waiting call, back to the ledger above ``keep``, or back after ``idle`` seconds
unused; the lease is given up when no answer renewed it for a whole term.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from plait.distributed.leases import LedgerLink, PermitReply, RateReply

if TYPE_CHECKING:
    from plait.resources.limits import EndpointLimiter

__all__ = ["LeasedLimiter"]


# size: a worker's whole side of the lease protocol, read as one state machine.
class LeasedLimiter:
    """Stands in for a worker's `Limiter` (an `EndpointLimiter`), taking permits and rate
    tokens from a shared `LeaseLedger` a few at a time (see the module doc).

    Args:
        link: reaches the ledger (`plait.distributed.ray` links to its Ray actor).
        max_concurrent, rpm, tpm: the endpoint's limits (the ledger holds them; these say
            which to ask for).
        idle: seconds a permit may sit unused before it goes back.
        hold: seconds rate tokens may be kept unspent (the ledger's ``hold``).
        name: names this limiter at the ledger (default: random).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        link: LedgerLink,
        *,
        max_concurrent: int | None,
        rpm: float | None = None,
        tpm: float | None = None,
        idle: float = 0.05,
        hold: float = 0.05,
        name: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._link = link
        self.name = name or os.urandom(8).hex()
        self.max_concurrent = max_concurrent
        self.rpm = rpm
        self.tpm = tpm
        self._idle = idle
        self._hold = hold
        self._clock = clock
        self._unlimited = max_concurrent is None
        self._rated = rpm is not None or tpm is not None
        # the lease
        self._epoch: int | None = None
        self._given_up = 0
        """The newest epoch this limiter gave up: answers under it or older are void."""
        self._granted = 0
        self._keep: int | None = None
        self._deadline = 0.0
        self._scale = 1.0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._asking = False
        self._ask_seq = 0
        self._withdrawn = 0
        self._watching = False
        self._to_give = 0
        self._uses = 0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._withdraw_timer: asyncio.TimerHandle | None = None
        self._lapse_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._paused_until = 0.0
        # rate tokens
        self._pool_requests = 0
        self._pool_tokens = 0
        self._pool_until = 0.0
        self._pool_generation = 0
        self._rate_waiters: deque[tuple[asyncio.Future[None], int]] = deque()
        self._rate_asking = False
        self._spent_requests = 0
        self._spent_tokens = 0
        self._correction = 0
        self._successes = 0
        self._settle_timer: asyncio.TimerHandle | None = None
        # what EndpointStats reads
        self.in_flight = 0
        self.queue_depth = 0
        self.acquired = 0
        self.waited = 0
        self.wait_time_total = 0.0
        self.rate_limited = 0
        # what `stats` adds: the messages calls waited for, and the permits given back
        self.asks = 0
        self.rate_asks = 0
        self.returned = 0

    async def open(self) -> None:
        """Makes this limiter's lease at the ledger ahead of its first call.

        Reaching the ledger the first time costs more than a round trip (Ray resolves the
        actor and connects to it), and the first calls would wait for it; a worker that
        opens its lease when it starts leaves them one short ask. Nothing is held: a
        lease that stays unused ends after its term, and the next ask makes a new one.
        """
        if self._epoch is not None or self._asking or self._watching:
            return  # a call has made (or is making) the lease already
        sent = self._clock()
        reply: PermitReply = await self._link.call("open", self.name, self._epoch)
        self._on_permits(reply, sent)

    def stats(self) -> dict[str, Any]:
        """What this worker's side of the lease holds and has cost so far.

        ``permits`` held now (``in_flight`` of them used), ``keep`` (what the ledger lets
        it keep; None: no limit), ``asks`` and ``rate_asks`` (messages calls waited for:
        permits and rate tokens), ``returned`` (permits given back, unused for ``idle``
        seconds or above its share while another worker waited), and ``waited`` /
        ``wait_time_total`` (calls that waited for a permit, rate tokens or a pause, and
        the seconds they waited). The cluster-wide figures are the ledger's ``stats``.
        """
        return {
            "permits": self._granted,
            "in_flight": self.in_flight,
            "keep": self._keep,
            "asks": self.asks,
            "rate_asks": self.rate_asks,
            "returned": self.returned,
            "acquired": self.acquired,
            "waited": self.waited,
            "wait_time_total": self.wait_time_total,
        }

    # -- the hot path -------------------------------------------------------------------

    async def acquire(self, tokens: int = 0) -> float:
        """Waits until a call may be sent; reserves its permit, request and tokens."""
        self.acquired += 1
        if (
            not self._rated
            and not self._paused_until
            and (self._unlimited or self._may_take_permit())
        ):
            self.in_flight += 1
            self._uses += 1
            if self._unlimited and not self._watching:
                self._start_watch()
            return 0.0
        return await self._acquire_slow(tokens)

    def release(self, reserved: int = 0, used: int | None = None) -> None:
        """Frees the call's permit; with ``used``, corrects its token reservation."""
        self.in_flight -= 1
        if self.tpm is not None and used is not None and used != reserved:
            self._correction += reserved - used
            self._arm_settle()
        if not self._unlimited:
            self._place_permits()

    def on_success(self) -> None:
        # Only limits lowered by 429s have anything to recover; otherwise no message.
        if self._scale < 1.0:
            self._successes += 1
            self._arm_settle()

    def on_rate_limited(self, retry_after: float | None = None) -> None:
        self.rate_limited += 1
        if retry_after:
            self._pause_here(retry_after)
        self._link.send("on_rate_limited", retry_after)

    def pause_for(self, seconds: float) -> None:
        self._pause_here(seconds)
        self._link.send("pause_for", seconds)

    def _may_take_permit(self) -> bool:
        return (
            self._granted > self.in_flight and not self._waiters and self._clock() < self._deadline
        )

    async def _acquire_slow(self, tokens: int) -> float:
        started = self._clock()
        self.queue_depth += 1
        try:
            await self._take_permit()
            try:
                if self._paused_until:
                    await self._wait_out_pause()
                if self._rated:
                    await self._take_rate(tokens)
            except BaseException:
                self.in_flight -= 1
                if not self._unlimited:
                    self._place_permits()
                raise
        finally:
            self.queue_depth -= 1
        waited = self._clock() - started
        if waited > 0.001:
            self.waited += 1
            self.wait_time_total += waited
        return waited

    # -- permits ------------------------------------------------------------------------

    async def _take_permit(self) -> None:
        if self._unlimited or self._may_take_permit():
            self.in_flight += 1
            self._uses += 1
            if self._unlimited and not self._watching:
                self._start_watch()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._ask()
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.in_flight -= 1  # a permit was handed over just as we were cancelled
                self._place_permits()
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                if not self._waiters and self._asking:
                    self._arm_withdraw()
            raise

    def _place_permits(self, granted: bool = False) -> None:
        """Puts the free permits where they belong: back to the ledger above ``keep``, to
        waiting calls in order, or aside, to go back if they stay unused.

        Permits freed by calls that ended go back first when the worker holds more than
        it may keep; permits just ``granted`` serve the calls waiting for them first (with
        more workers than permits, ``keep`` is 0: each permit serves one call, then goes
        back).
        """
        free = self._granted - self.in_flight
        if free > 0 and self._clock() >= self._deadline:
            self._lapse()
            free = 0
        if not granted:
            free -= self._give_excess(free)
        while free > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                self._uses += 1
                free -= 1
                waiter.set_result(None)
        if granted:
            free -= self._give_excess(free)
        if self._waiters:
            self._ask()
        elif self._asking:
            self._arm_withdraw()
        if free > 0 and self._idle_timer is None:
            loop = asyncio.get_running_loop()
            self._idle_timer = loop.call_later(self._idle, self._on_idle, self._uses)

    def _give_excess(self, free: int) -> int:
        """Gives back free permits above ``keep``; returns how many."""
        if free <= 0 or self._keep is None or self._granted <= self._keep:
            return 0
        back = min(free, self._granted - self._keep)
        self._give(back)
        return back

    def _on_idle(self, uses: int) -> None:
        self._idle_timer = None
        free = self._granted - self.in_flight
        if free <= 0:
            return
        if uses == self._uses:
            self._give(free)
        else:
            loop = asyncio.get_running_loop()
            self._idle_timer = loop.call_later(self._idle, self._on_idle, self._uses)

    def _give(self, permits: int) -> None:
        """Gives permits back; the messages of one turn of the loop go as one."""
        self._granted -= permits
        self.returned += permits
        if not self._to_give:
            asyncio.get_running_loop().call_soon(self._send_gives)
        self._to_give += permits

    def _send_gives(self) -> None:
        if self._to_give and self._epoch is not None:
            self._link.send("give", self.name, self._epoch, self._to_give)
        self._to_give = 0

    def _wanted(self) -> int:
        """Permits to ask for: one per waiting call, plus any the calls in flight lack
        (after a lapsed lease)."""
        waiting = sum(not w.done() for w in self._waiters)
        return waiting + max(0, self.in_flight - self._granted)

    def _ask(self) -> None:
        if not self._asking and self._wanted() > 0:
            self._asking = True
            self._spawn(self._asking_loop())

    async def _asking_loop(self) -> None:
        try:
            while (want := self._wanted()) > 0:
                self._ask_seq += 1
                self.asks += 1
                sent = self._clock()
                reply = await self._link.call(
                    "permits", self.name, self._epoch, want, self._keep, self._ask_seq
                )
                self._on_permits(reply, sent)
        except Exception as exc:  # the ledger is gone: the calls waiting for it fail
            self._lapse()
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(exc)
        finally:
            self._asking = False

    def _arm_withdraw(self) -> None:
        """Withdraws the ask out if no call waits for it ``idle`` seconds from now.

        Not at once: calls that end together leave no call waiting for a moment, until
        the next ones ask, and an ask withdrawn and sent again each time would cost two
        messages per round of calls.
        """
        if self._withdraw_timer is None:
            loop = asyncio.get_running_loop()
            self._withdraw_timer = loop.call_later(self._idle, self._withdraw, self._ask_seq)

    def _withdraw(self, seq: int) -> None:
        """Tells the ledger the ask ``seq`` no longer has calls waiting for it (once)."""
        self._withdraw_timer = None
        if not self._asking or seq != self._ask_seq or any(not w.done() for w in self._waiters):
            return
        if self._epoch is not None and self._withdrawn != seq:
            self._withdrawn = seq
            self._link.send("withdraw", self.name, self._epoch, seq)

    def _start_watch(self) -> None:
        self._watching = True
        self._spawn(self._watching_loop())

    async def _watching_loop(self) -> None:
        try:
            while self._granted or self.in_flight or self._waiters:
                sent = self._clock()
                reply = await self._link.call("permits", self.name, self._epoch, 0, self._keep)
                self._on_permits(reply, sent)
        except Exception:
            self._lapse()  # the ledger is gone; an ask will say so to the calls that wait
        finally:
            self._watching = False

    def _on_permits(self, reply: PermitReply, sent: float) -> None:
        epoch, granted, keep, paused_for, term, scale = reply
        deadline = sent + term
        if epoch != self._epoch:
            if epoch <= self._given_up or (self._epoch is not None and epoch < self._epoch):
                return  # about a lease this limiter has left: its permits went with it
            # A new lease: the old one (if any) lapsed at the ledger, its permits with it.
            self._epoch = epoch
            self._granted = 0
            self._to_give = 0
            self._deadline = deadline
        self._granted += granted
        self._keep = keep
        self._scale = scale
        if deadline > self._deadline:
            self._deadline = deadline
        self._arm_lapse()
        if paused_for > 0:
            self._pause_here(paused_for)
        if not self._watching and (self._granted or self.in_flight):
            self._start_watch()
        if not self._unlimited:
            self._place_permits(granted=True)

    def _arm_lapse(self) -> None:
        if self._lapse_timer is None and self._granted:
            delay = max(0.0, self._deadline - self._clock())
            self._lapse_timer = asyncio.get_running_loop().call_later(delay, self._on_deadline)

    def _on_deadline(self) -> None:
        self._lapse_timer = None
        if self._clock() >= self._deadline:
            if self._granted:
                self._lapse()
        else:
            self._arm_lapse()

    def _lapse(self) -> None:
        """Gives the lease up: no word from the ledger for a whole term (it may have lent
        these permits to others by now), or the ledger is gone."""
        if self._epoch is not None:
            self._given_up = max(self._given_up, self._epoch)
            with contextlib.suppress(Exception):
                self._link.send("drop", self.name, self._epoch)
        self._epoch = None
        self._granted = 0
        self._to_give = 0
        self._keep = None

    # -- rate tokens --------------------------------------------------------------------

    async def _take_rate(self, tokens: int) -> None:
        if not self._rate_waiters and self._rate_fits(tokens):
            self._spend(tokens)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._rate_waiters.append((waiter, tokens))
        self._ask_rate()
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # ours, unspent: back in the pool
                self._pool_requests += self.rpm is not None
                self._pool_tokens += tokens if self.tpm is not None else 0
            else:
                with contextlib.suppress(ValueError):
                    self._rate_waiters.remove((waiter, tokens))
            raise

    def _rate_fits(self, tokens: int) -> bool:
        return (
            (self.rpm is None or self._pool_requests >= 1)
            and (self.tpm is None or self._pool_tokens >= tokens)
            and self._clock() < self._pool_until
        )

    def _spend(self, tokens: int) -> None:
        if self.rpm is not None:
            self._pool_requests -= 1
            self._spent_requests += 1
        if self.tpm is not None:
            self._pool_tokens -= tokens
            self._spent_tokens += tokens

    def _ask_rate(self) -> None:
        if not self._rate_asking:
            self._rate_asking = True
            self._spawn(self._rate_loop())

    async def _rate_loop(self) -> None:
        try:
            while self._rate_waiters:
                needs = [tokens for waiter, tokens in self._rate_waiters if not waiter.done()]
                if not needs:
                    self._rate_waiters.clear()
                    break
                if self.tpm is None:
                    needs = [0] * len(needs)
                extra = (self._spent_requests, self._spent_tokens)
                returned = (self._pool_requests, self._pool_tokens)
                self._spent_requests = self._spent_tokens = 0
                self._pool_requests = self._pool_tokens = 0
                self._pool_generation += 1
                sent = self._clock()
                self.rate_asks += 1
                reply: RateReply = await self._link.call("rate", needs, *extra, *returned)
                self._pool_requests, self._pool_tokens = reply.requests, reply.tokens
                # the ledger took them no earlier than `waited` after the ask was sent
                self._pool_until = sent + reply.waited + self._hold
                if reply.paused_for > 0:
                    self._pause_here(reply.paused_for)
                self._serve_rate_waiters(min(reply.requests, len(needs)))
                self._arm_pool_expiry()
        except Exception as exc:
            while self._rate_waiters:
                waiter, _ = self._rate_waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(exc)
        finally:
            self._rate_asking = False

    def _serve_rate_waiters(self, asked_for: int) -> None:
        """Gives the calls that waited their tokens: the first ``asked_for`` whatever the
        time (the ledger took them for these calls), later ones while the pool is valid."""
        while self._rate_waiters:
            waiter, tokens = self._rate_waiters[0]
            if waiter.done():
                self._rate_waiters.popleft()
                continue
            enough = (self.rpm is None or self._pool_requests >= 1) and (
                self.tpm is None or self._pool_tokens >= tokens
            )
            if not enough or (asked_for <= 0 and self._clock() >= self._pool_until):
                break
            self._rate_waiters.popleft()
            asked_for -= 1
            self._spend(tokens)
            waiter.set_result(None)

    def _arm_pool_expiry(self) -> None:
        if self._pool_requests or self._pool_tokens:
            delay = max(0.0, self._pool_until - self._clock())
            loop = asyncio.get_running_loop()
            loop.call_later(delay, self._expire_pool, self._pool_generation)

    def _expire_pool(self, generation: int) -> None:
        """Gives back the rate tokens left unspent ``hold`` seconds after they were taken."""
        if generation != self._pool_generation:
            return
        self._pool_generation += 1
        if self._pool_requests or self._pool_tokens:
            self._link.send("give_rate", self._pool_requests, self._pool_tokens)
        self._pool_requests = self._pool_tokens = 0

    def _arm_settle(self) -> None:
        if self._settle_timer is None:
            loop = asyncio.get_running_loop()
            self._settle_timer = loop.call_later(self._hold, self._settle)

    def _settle(self) -> None:
        self._settle_timer = None
        if self._correction or self._successes:
            self._link.send("settle", self._correction, self._successes)
        self._correction = self._successes = 0

    # -- pauses -------------------------------------------------------------------------

    def _pause_here(self, seconds: float) -> None:
        self._paused_until = max(self._paused_until, self._clock() + seconds)

    async def _wait_out_pause(self) -> None:
        while (delay := self._paused_until - self._clock()) > 0:
            await asyncio.sleep(delay)
        self._paused_until = 0.0

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- what EndpointStats reads (the cluster-wide truth is the ledger's `stats`) ------

    @property
    def effective_max_concurrent(self) -> int | None:
        limit = self.max_concurrent
        return None if limit is None else max(1, int(limit * self._scale))

    @property
    def effective_rpm(self) -> float | None:
        return None if self.rpm is None else self.rpm * self._scale

    @property
    def effective_tpm(self) -> float | None:
        return None if self.tpm is None else self.tpm * self._scale

    @property
    def paused_for(self) -> float:
        return max(0.0, self._paused_until - self._clock()) if self._paused_until else 0.0

    @property
    def permits(self) -> int:
        """Permits this limiter holds now (in flight and unused)."""
        return self._granted


if TYPE_CHECKING:  # mypy checks that LeasedLimiter has every member of the protocol
    _IS_ENDPOINT_LIMITER: type[EndpointLimiter] = LeasedLimiter
