"""One endpoint's limits shared by many processes, handed out in leases.

One `LeaseLedger` per endpoint (in a Ray actor: `plait.distributed.ray.EndpointLimits`)
owns the endpoint's limits for the whole cluster. Each process's `LeasedLimiter` stands
in for its `Limiter` and takes what its calls need from the ledger a few at a time, so
most calls never leave the process:

* **Permits** (``max_concurrent``) are leased. A worker sends a request only while it
  holds a permit the ledger granted it for that request. A permit freed by a finished
  call goes straight to the worker's next waiting call; permits left unused for
  ``idle`` seconds (50 ms) go back. When another worker waits below its fair share (the
  limit divided among the workers holding or asking), a worker above its own share
  gives permits back as its calls end instead of reusing them: two busy workers settle
  at half each, one alone uses the whole limit. Shares are whole permits; the permits
  left over (fewer than the workers sharing) go round in turns: a worker at its share
  that asks gets one more for a turn of ``turn`` seconds (2), then gives it back as a
  call ends, and the next turn goes to the worker that has waited longest. More workers
  than permits have a share of 0 and take turns at every permit: a turn of many calls,
  not one, so it costs a few messages a turn rather than two a call.
  A lease holding permits whose worker keeps no message open at the ledger (a live
  worker always keeps a watch or an ask there) for ``grace`` seconds (1) is presumably
  dead: its permits stay out until its term ends, but the fair shares split only what
  the others can use, so no live worker goes without while it lapses.
* **A lease lasts** ``term`` seconds (10) from the ledger's last message from its
  worker. A worker holding anything keeps one watch call open at the ledger, answered
  at the latest after a third of the term (at once when the worker's share changes or
  the endpoint is paused), and each call renews the lease. A worker that dies stops
  renewing and its permits come back when the term runs out. A worker counts its lease
  from the moment it *sent* the renewing message, before the ledger received it, so it
  stops sending before the ledger can think the lease lapsed. A worker may open its
  lease as it starts (`LeaseLedger.open`, answered at once, no permits), so that its
  first calls find the way to the ledger made and wait one short ask.
* **Rate tokens** (``rpm`` requests, ``tpm`` tokens) come from the ledger's token
  buckets: the tokens the worker's waiting calls need, which they spend as soon as the
  answer arrives, plus as many as the worker spent since it last asked, kept for at
  most ``hold`` seconds (50 ms) after the ledger took them and then given back. The
  ledger's buckets hold ``hold`` seconds' worth less burst than one process's
  `Limiter`, so tokens spent up to ``hold`` late never let more through in any window
  than one `Limiter` would. Real token usage corrects the estimates within ``hold``.
* A 429's ``Retry-After`` pauses the endpoint for every worker (their watches answer at
  once), and repeated 429s lower the limits at the ledger, once per episode, for all.

The ledger may see one worker's messages in any order (Ray does not order an async
actor's calls). So each message that changes what a worker holds names its lease by
its ``epoch`` (a number the ledger gives every new lease), a message about an ended
lease changes nothing, and the counts a worker sends are amounts to add or remove, not
totals. When a lease lapsed but its worker lives on (it could not reach the ledger for
a whole term), the worker learns it from the next answer's new epoch: it counts no
permit of the old lease any more, and its calls still in flight must be covered by new
permits before it sends again.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from plait.resources.limits import Adaptation, TokenBucket

__all__ = ["LeaseLedger", "LedgerLink", "LocalLink", "PermitReply", "RateReply"]

DEFAULT_TERM = 10.0
"""Seconds a lease lasts without word from its worker."""


class PermitReply(NamedTuple):
    """The ledger's answer to a worker's ask or watch."""

    epoch: int
    """The lease the answer is about (a new number: the worker's old lease ended)."""
    granted: int
    """Permits added to the lease by this answer."""
    keep: int | None
    """Permits the worker may keep (above that it gives back as calls end); None: no limit."""
    paused_for: float
    """Seconds the endpoint stays paused (0: not paused)."""
    term: float
    """Seconds the lease lasts from the worker's message."""
    scale: float
    """The factor 429s have lowered the limits to (1.0: as configured)."""


class RateReply(NamedTuple):
    """The ledger's answer to a worker's ask for rate tokens."""

    requests: int
    tokens: int
    waited: float
    """Seconds the ledger waited for its buckets before taking these."""
    paused_for: float


@dataclass(eq=False)
class _Ask:
    holder: _Holder
    want: int
    seq: int
    future: asyncio.Future[int]


@dataclass(eq=False)
class _Holder:
    name: str
    epoch: int
    expires: float
    permits: int = 0
    ask: _Ask | None = None
    watch: asyncio.Future[None] | None = None
    told_keep: int | None = field(default=None)
    turn_ends: float = 0.0
    """While more workers ask than there are permits: when this holder's turn ends."""
    queued_at: float | None = None
    """Since when the holder has been asking without a grant (an ask answered with none
    and sent again keeps its place in the line of turns)."""

    def silent(self, now: float, grace: float, term: float) -> bool:
        """Holds permits, but has kept no message open at the ledger for ``grace`` seconds
        (its last message came ``term`` before its lease expires)."""
        open_message = self.ask is not None or (self.watch is not None and not self.watch.done())
        return bool(self.permits) and not open_message and now - (self.expires - term) > grace


# size: one ledger's state machine (leases, epochs, fair shares, lapses), read as a whole.
class LeaseLedger:
    """Holds one endpoint's limits for many workers and lends them out (see the module doc).

    Every method is a coroutine, so in a Ray actor all run on the actor's one event loop.

    Args:
        max_concurrent: requests in flight at once across all workers; None for no limit.
        rpm: requests per minute across all workers; None for no limit.
        tpm: tokens per minute across all workers; None for no limit.
        term: seconds a lease lasts without word from its worker.
        hold: seconds a worker may keep rate tokens it did not ask for a waiting call.
        turn: seconds a worker keeps a permit while more workers ask than there are
            permits (a turn of many calls, not one: two messages a turn, not a call).
        grace: seconds a lease holding permits may have no message open at the ledger
            before the fair shares leave its permits out (default: a tenth of the term).
        adaptive: lower the limits on repeated 429s and recover on success, as a `Limiter`.
        burst_seconds: as for `Limiter`; the buckets hold ``hold`` seconds less.
        clock: monotonic seconds (tests may inject one).
        sleep: waits a number of seconds on ``clock``'s scale.
    """

    def __init__(
        self,
        max_concurrent: int | None = None,
        rpm: float | None = None,
        tpm: float | None = None,
        *,
        term: float = DEFAULT_TERM,
        hold: float = 0.05,
        turn: float = 2.0,
        grace: float | None = None,
        adaptive: bool = True,
        burst_seconds: float = 1.0,
        min_scale: float = 0.1,
        recovery_step: float = 0.02,
        decrease_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if term <= 0:
            raise ValueError(f"a lease term must be positive, got {term}")
        now = clock()
        self.max_concurrent = max_concurrent
        self.term = term
        self.hold = hold
        self.turn = turn
        self.grace = term / 10 if grace is None else grace
        self._adaptation = Adaptation(adaptive, min_scale, recovery_step, decrease_interval)
        self._clock = clock
        self._sleep = sleep
        burst = max(burst_seconds - hold, burst_seconds / 2)
        self._requests = None if rpm is None else TokenBucket(rpm, burst, now)
        self._tokens = None if tpm is None else TokenBucket(tpm, burst, now)
        self._limit = max_concurrent
        self._holders: dict[str, _Holder] = {}
        self._asks: list[_Ask] = []
        self._leased = 0
        self._epoch = 0
        self._gate: asyncio.Lock | None = None
        self._paused_until = 0.0
        self._sweeper: asyncio.TimerHandle | None = None
        self.peak_leased = 0
        """The most permits ever leased at once."""
        self.asks = 0
        """Asks for permits so far (each a message that waits for an answer)."""
        self.opened = 0
        """Leases opened ahead of their worker's first call (`open`)."""
        self.messages = 0
        """Messages from workers so far, of every kind (asks, watches, gives, rate tokens…)."""
        self.granted = 0
        """Permits granted so far (a permit given back and granted again counts twice)."""
        self.lapsed = 0
        """Leases that ran out holding permits, without word from their worker (it died,
        or could not reach the ledger for a whole term)."""
        self.rate_limited = 0
        """429s the workers reported."""

    @property
    def heartbeat(self) -> float:
        """Seconds a watch or an unanswerable ask waits before it is answered anyway."""
        return self.term / 3

    # -- permits ------------------------------------------------------------------------

    async def open(self, holder: str, epoch: int | None) -> PermitReply:
        """Renews ``holder``'s lease, or makes one, and answers at once (no permits).

        A worker opens its lease when it starts, so that its first calls find the link
        to the ledger up and wait one short round trip for their permits.
        """
        self.messages += 1
        self.opened += 1
        now = self._clock()
        self._expire(now)
        return self._reply(self._lease(holder, epoch, now), 0)

    async def permits(
        self, holder: str, epoch: int | None, want: int, told_keep: int | None, seq: int = 0
    ) -> PermitReply:
        """Renews ``holder``'s lease; with ``want``, waits for up to that many permits.

        With ``want`` 0 this is the holder's watch: it returns when the number of
        permits the holder may keep is no longer ``told_keep``, when the endpoint is
        paused, or after `heartbeat` seconds. With ``want`` above 0 it returns once some
        permits are granted (at most ``want``), or with none after `heartbeat` seconds
        or when the holder withdraws the ask (by its ``seq``).

        Args:
            holder: the worker's name, unique to its limiter.
            epoch: the lease the worker holds, or None to start a new one (ending any
                lease the ledger still has for it).
            want: permits to wait for (0: watch).
            told_keep: the ``keep`` the worker last heard.
            seq: names the ask, for `withdraw`.
        """
        self.messages += 1
        now = self._clock()
        self._expire(now)
        record = self._lease(holder, epoch, now)
        granted = 0
        if want > 0:
            granted = await self._wait_for_grant(record, want, seq)
        else:
            await self._watch(record, told_keep)
        return self._reply(record, granted)

    async def give(self, holder: str, epoch: int, permits: int) -> None:
        """Takes back ``permits`` of a lease (nothing, if that lease has ended)."""
        self.messages += 1
        record = self._holders.get(holder)
        if record is None or record.epoch != epoch:
            return
        record.expires = self._clock() + self.term
        permits = min(permits, record.permits)
        record.permits -= permits
        self._leased -= permits
        self._changed()

    async def withdraw(self, holder: str, epoch: int, seq: int) -> None:
        """Answers the holder's ask ``seq`` now, with what it has got (its calls no longer wait)."""
        self.messages += 1
        record = self._holders.get(holder)
        if record is None or record.epoch != epoch:
            return
        ask = record.ask
        if ask is not None and ask.seq == seq:
            self._answer(ask, 0)
            self._changed()

    async def drop(self, holder: str, epoch: int) -> None:
        """Ends a lease its worker gave up, taking back all its permits."""
        self.messages += 1
        record = self._holders.get(holder)
        if record is not None and record.epoch == epoch:
            self._end(record)

    def _lease(self, holder: str, epoch: int | None, now: float) -> _Holder:
        """Returns the holder's lease, renewed, or a new one."""
        record = self._holders.get(holder)
        if record is not None and epoch is None:
            self._end(record)  # the worker gave this lease up, and may not have said so yet
            record = None
        if record is None:
            self._epoch += 1
            record = _Holder(holder, self._epoch, now + self.term)
            self._holders[holder] = record
            self._schedule_sweep()
        else:
            record.expires = now + self.term
        return record

    async def _wait_for_grant(self, record: _Holder, want: int, seq: int) -> int:
        self.asks += 1
        if record.queued_at is None:
            record.queued_at = self._clock()
        if record.ask is not None:  # an older ask the worker stopped waiting for
            self._answer(record.ask, 0)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        ask = _Ask(record, want, seq, future)
        record.ask = ask
        self._asks.append(ask)
        self._changed()
        try:
            if not future.done():
                await asyncio.wait((future,), timeout=self.heartbeat)
        except BaseException:  # cancelled: nobody will hear of what was granted
            if future.done():
                self._take_back(record, future.result())
            else:
                self._answer(ask, 0)
            self._changed()
            raise
        if not future.done():
            self._answer(ask, 0)
            self._changed()
        return future.result()

    def _take_back(self, record: _Holder, permits: int) -> None:
        if self._holders.get(record.name) is record:
            permits = min(permits, record.permits)
            record.permits -= permits
            self._leased -= permits

    async def _watch(self, record: _Holder, told_keep: int | None) -> None:
        if self._keeps().get(record) != told_keep:
            return
        if record.watch is not None and not record.watch.done():
            record.watch.set_result(None)
        watch: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        record.watch = watch
        record.told_keep = told_keep
        try:
            await asyncio.wait((watch,), timeout=self.heartbeat)
        finally:
            if record.watch is watch:
                record.watch = None

    def _reply(self, record: _Holder, granted: int) -> PermitReply:
        paused_for = max(0.0, self._paused_until - self._clock())
        keep = self._keeps().get(record, 0 if self._limit is not None else None)
        return PermitReply(
            record.epoch, granted, keep, paused_for, self.term, self._adaptation.scale
        )

    def _answer(self, ask: _Ask, permits: int) -> None:
        """Grants ``permits`` to an ask and takes it out of the queue."""
        record = ask.holder
        record.ask = None
        self._asks.remove(ask)
        if permits:
            record.queued_at = None
            record.permits += permits
            self._leased += permits
            self.granted += permits
            self.peak_leased = max(self.peak_leased, self._leased)
        if not ask.future.done():
            ask.future.set_result(permits)

    def _changed(self) -> None:
        """Grants what can be granted, then tells the watches whose share changed."""
        self._grant()
        keeps = self._keeps()
        for record in self._holders.values():
            watch = record.watch
            if watch is not None and not watch.done() and keeps[record] != record.told_keep:
                watch.set_result(None)

    def _grant(self) -> None:
        """Grants free permits: first to asks below their fair share, then one more each,
        for a turn, to asks at their share (those waiting longest first), then the rest in
        order of asking."""
        if not self._asks:
            return
        if self._limit is None:
            for ask in list(self._asks):
                self._answer(ask, ask.want)
            return
        free = self._limit - self._leased
        if free <= 0:
            return
        fair, _ = self._fair_shares()
        waiting = sorted(self._asks, key=_queued)
        for ask in waiting:
            short = fair[ask.holder] - ask.holder.permits
            if short > 0 and free > 0:
                permits = min(ask.want, short, free)
                self._answer(ask, permits)
                free -= permits
        for ask in waiting:
            if free > 0 and ask.holder.ask is ask and ask.holder.permits == fair[ask.holder]:
                self._start_turn(ask.holder)
                self._answer(ask, 1)
                free -= 1
        for ask in list(self._asks):
            if free <= 0:
                return
            permits = min(ask.want, free)
            self._answer(ask, permits)
            free -= permits

    def _start_turn(self, holder: _Holder) -> None:
        """Starts a holder's turn at one permit above its share, and tells its watch when
        the turn ends."""
        holder.turn_ends = self._clock() + self.turn
        # told a moment after its end, so that the turn has ended by the clock then
        asyncio.get_running_loop().call_later(self.turn + 0.001, self._changed)

    def _fair_shares(self) -> tuple[dict[_Holder, int], int]:
        """Each holder's fair part of the limit, and the permits left over, which the
        holders take in turns.

        The limit, less the permits of silent leases (presumably dead: they keep what
        they hold until they lapse), is split evenly among the other holders that hold
        permits or ask for them, in whole permits; what is left (fewer permits than those
        holders) goes round them in turns of one permit each. With more of those holders
        than permits, each one's share is 0: they take turns at every permit.
        """
        limit = self._limit
        assert limit is not None
        now = self._clock()
        silent = {h for h in self._holders.values() if h.silent(now, self.grace, self.term)}
        shares = {h: h.permits for h in silent}
        pool = max(0, limit - sum(shares.values()))
        active = [
            h
            for h in self._holders.values()
            if (h.permits or h.ask is not None) and h not in silent
        ]
        shares.update(
            (h, pool // (len(active) + 1)) for h in self._holders.values() if h not in shares
        )
        if not active:
            return shares, 0
        base, extra = divmod(pool, len(active))
        shares.update(dict.fromkeys(active, base))
        return shares, extra

    def _keeps(self) -> dict[_Holder, int | None]:
        """How many permits each holder may keep: all of the limit while no other holder
        waits below its fair share (or at it, for a turn at a permit left over), its fair
        share otherwise, one more during its turn (and its fair share alone while 429s
        have lowered the limit below what is leased)."""
        limit = self._limit
        if limit is None:
            return dict.fromkeys(self._holders.values())
        fair, extra = self._fair_shares()
        needy = [
            h
            for h in self._holders.values()
            if h.ask is not None and (h.permits < fair[h] or (extra and h.permits == fair[h]))
        ]
        over = self._leased > limit
        now = self._clock()

        def keep(holder: _Holder) -> int:
            if not over and not any(n is not holder for n in needy):
                return limit
            if not over and holder.turn_ends > now:
                return fair[holder] + 1  # its turn goes on
            return fair[holder]

        return {holder: keep(holder) for holder in self._holders.values()}

    # -- lapsed leases ------------------------------------------------------------------

    def _expire(self, now: float) -> None:
        for record in [r for r in self._holders.values() if r.expires <= now]:
            self.lapsed += record.permits > 0
            self._end(record)

    def _end(self, record: _Holder) -> None:
        """Ends a lease: its permits come back, its ask and watch are answered."""
        if self._holders.get(record.name) is record:
            del self._holders[record.name]
        self._leased -= record.permits
        record.permits = 0
        if record.ask is not None:
            self._answer(record.ask, 0)
        if record.watch is not None and not record.watch.done():
            record.watch.set_result(None)
        self._changed()

    def _schedule_sweep(self) -> None:
        """Makes sure a lease that runs out is ended then, even if no message comes."""
        if self._sweeper is not None or not self._holders:
            return
        due = min(r.expires for r in self._holders.values()) - self._clock()
        loop = asyncio.get_running_loop()
        self._sweeper = loop.call_later(max(due, 0.0) + 0.001, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        self._expire(self._clock())
        self._schedule_sweep()

    # -- rate tokens --------------------------------------------------------------------

    async def rate(
        self,
        needs: list[int],
        extra_requests: int = 0,
        extra_tokens: int = 0,
        returned_requests: int = 0,
        returned_tokens: int = 0,
    ) -> RateReply:
        """Waits until the buckets allow the first waiting call; returns the tokens of the
        waiting calls that may go now, in order, and some more.

        As in `Limiter`: one request and a call's tokens are taken per call, the first
        call waits for the buckets (first come, first served across workers: one waiter
        sleeps for them at a time) and a call whose tokens exceed the burst goes when the
        bucket is full, leaving a debt; the calls after it go only if the buckets hold
        their tokens already, and the extras only from what the buckets hold, never
        waited for nor owed.

        Args:
            needs: the tokens each waiting call reserves (0 each without a tpm limit).
            extra_requests, extra_tokens: what the worker would like to keep for its
                next calls (what it spent since it last asked).
            returned_requests, returned_tokens: unspent tokens the worker gives back.

        Returns:
            The requests (one per call that may go, then the extras) and tokens granted.
        """
        self.messages += 1
        self._give_rate(returned_requests, returned_tokens)
        if self._gate is None:
            self._gate = asyncio.Lock()
        started = self._clock()
        async with self._gate:
            await self._wait_for_rate(needs[0])
            now = self._clock()
            calls, tokens = 1, needs[0]
            for need in needs[1:]:
                if not self._fits_now(need, now):
                    break
                self._take(need)
                calls += 1
                tokens += need
            if self._requests is not None:
                calls += _take_extra(self._requests, extra_requests, now)
            tokens += _take_extra(self._tokens, extra_tokens, now)
        paused_for = max(0.0, self._paused_until - now)
        return RateReply(calls, tokens, now - started, paused_for)

    async def _wait_for_rate(self, tokens: int) -> None:
        bucket_r, bucket_t = self._requests, self._tokens
        while True:
            now = self._clock()
            delay = self._paused_until - now
            if delay <= 0:
                delay = 0.0 if bucket_r is None else bucket_r.delay(1, now)
                if bucket_t is not None:
                    delay = max(delay, bucket_t.delay(tokens, now))
                if delay <= 0:
                    break
            await self._sleep(delay)
        self._take(tokens)

    def _fits_now(self, tokens: int, now: float) -> bool:
        """Whether one more call may go now without waiting and without a debt."""
        if self._paused_until > now:
            return False
        if self._requests is not None and self._requests.delay(1, now) > 0:
            return False
        if self._tokens is None:
            return True
        self._tokens.give(0, now)  # refills to now
        return self._tokens.level >= tokens

    def _take(self, tokens: int) -> None:
        if self._requests is not None:
            self._requests.take(1)
        if self._tokens is not None:
            self._tokens.take(tokens)

    async def give_rate(self, requests: int, tokens: int) -> None:
        """Puts unspent rate tokens back in the buckets."""
        self.messages += 1
        self._give_rate(requests, tokens)

    def _give_rate(self, requests: int, tokens: int) -> None:
        now = self._clock()
        if requests and self._requests is not None:
            self._requests.give(requests, now)
        if tokens and self._tokens is not None:
            self._tokens.give(tokens, now)

    async def settle(self, tokens: int, successes: int) -> None:
        """Corrects the tpm bucket by real usage (``tokens`` over-estimated: negative for
        a charge) and recovers the limits by ``successes`` calls' steps."""
        self.messages += 1
        if tokens and self._tokens is not None:
            self._tokens.give(tokens, self._clock())
        if successes and self._adaptation.recover(successes):
            self._apply_scale()

    # -- pauses and adaptation ----------------------------------------------------------

    async def pause_for(self, seconds: float) -> None:
        """Pauses the endpoint for every worker (extends, never shortens, a pause)."""
        self.messages += 1
        self._pause(seconds)

    def _pause(self, seconds: float) -> None:
        until = self._clock() + seconds
        if until > self._paused_until:
            self._paused_until = until
            self._wake_watches()

    async def on_rate_limited(self, retry_after: float | None) -> None:
        """A worker's 429: pauses for ``retry_after``, lowers the limits once per episode."""
        self.messages += 1
        self.rate_limited += 1
        if retry_after is not None and retry_after > 0:
            self._pause(retry_after)
        if self._adaptation.lower(self._clock()):
            self._apply_scale()

    def _apply_scale(self) -> None:
        scale = self._adaptation.scale
        now = self._clock()
        for bucket in (self._requests, self._tokens):
            if bucket is not None:
                bucket.scale(scale, now)
        if self.max_concurrent is not None:
            self._limit = max(1, int(self.max_concurrent * scale))
        self._changed()
        self._wake_watches()  # workers report successes only while the scale is below 1

    def _wake_watches(self) -> None:
        for record in self._holders.values():
            if record.watch is not None and not record.watch.done():
                record.watch.set_result(None)

    # -- observation --------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """Permits leased now, per holder and at most, messages and asks from the workers,
        leases opened and lapsed, 429s, the scale."""
        return {
            "limit": self._limit,
            "leased": self._leased,
            "peak_leased": self.peak_leased,
            "granted": self.granted,
            "asks": self.asks,
            "opened": self.opened,
            "messages": self.messages,
            "holders": {r.name: r.permits for r in self._holders.values()},
            "asking": len(self._asks),
            "lapsed": self.lapsed,
            "rate_limited": self.rate_limited,
            "scale": self._adaptation.scale,
            "paused_for": max(0.0, self._paused_until - self._clock()),
            "requests_left": _level(self._requests, self._clock()),
            "tokens_left": _level(self._tokens, self._clock()),
        }


def _queued(ask: _Ask) -> float:
    queued_at = ask.holder.queued_at
    return 0.0 if queued_at is None else queued_at


def _level(bucket: TokenBucket | None, now: float) -> float | None:
    """What ``bucket`` holds now (None: no such limit)."""
    if bucket is None:
        return None
    bucket.give(0, now)  # refills to now
    return bucket.level


def _take_extra(bucket: TokenBucket | None, wanted: int, now: float) -> int:
    """Takes up to ``wanted`` whole tokens that ``bucket`` holds now; returns how many."""
    if bucket is None or wanted <= 0:
        return 0
    bucket.give(0, now)  # refills to now
    extra = max(0, min(wanted, math.floor(bucket.level)))
    bucket.take(extra)
    return extra


class LedgerLink(Protocol):
    """How a `LeasedLimiter` reaches its ledger."""

    def call(self, method: str, *args: Any) -> Awaitable[Any]:
        """Sends a message and returns its answer."""
        ...

    def send(self, method: str, *args: Any) -> None:
        """Sends a message without waiting for it to be handled."""
        ...


class LocalLink:
    """Reaches a `LeaseLedger` on this event loop: several limiters of one process sharing
    limits, and the tests of the lease logic.

    Every message runs as a task of its own, as a Ray actor runs each call; ``delay``, if
    given, returns the seconds each message and each answer spends on the way (random
    delays deliver them out of order, as Ray may). `cut` makes the link drop everything
    from then on, as if its worker had died.
    """

    def __init__(self, ledger: LeaseLedger, delay: Callable[[], float] | None = None) -> None:
        self.ledger = ledger
        self._delay = delay
        self._tasks: set[asyncio.Task[Any]] = set()
        self._cut = False

    def cut(self) -> None:
        """Drops every message and answer from now on."""
        self._cut = True

    def close(self) -> None:
        """Cancels the messages still on the way (their callers see a cancellation)."""
        for task in list(self._tasks):
            task.cancel()

    def call(self, method: str, *args: Any) -> Awaitable[Any]:
        return self._spawn(method, args)

    def send(self, method: str, *args: Any) -> None:
        self._spawn(method, args)

    def _spawn(self, method: str, args: tuple[Any, ...]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(self._deliver(method, args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _deliver(self, method: str, args: tuple[Any, ...]) -> Any:
        if self._delay is not None:
            await asyncio.sleep(self._delay())
        if self._cut:
            await asyncio.Event().wait()  # never arrives, never answered
        answer = await getattr(self.ledger, method)(*args)
        if self._delay is not None:
            await asyncio.sleep(self._delay())
        if self._cut:
            await asyncio.Event().wait()
        return answer
