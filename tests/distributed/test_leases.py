"""The lease logic in one process: `LeasedLimiter`s sharing a real `LeaseLedger`.

Each limiter reaches the ledger through a `LocalLink`, which runs every message as a
task of its own, as a Ray actor runs each call; some tests delay messages at random, so
that they arrive out of order, and `LocalLink.cut` plays a worker that died. The
`Wire` counts what a server would see: calls between their acquire and release.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from plait.backends.types import Message, Request
from plait.distributed.leased_limiter import LeasedLimiter
from plait.distributed.leases import LeaseLedger, LocalLink
from plait.resources import ResourceManager
from plait.testing import ScriptedServer

LIMIT = 4


class Wire:
    """What a server would see of the calls: how many at once, at most, and in all."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.sent = 0
        self.overlap = False
        """Whether calls of two limiters were ever on the wire at once."""
        self._by: dict[int, int] = {}

    async def call(self, limiter: LeasedLimiter, seconds: float = 0.0, tokens: int = 0) -> None:
        await limiter.acquire(tokens)
        self.now += 1
        self.sent += 1
        self.peak = max(self.peak, self.now)
        self._by[id(limiter)] = self._by.get(id(limiter), 0) + 1
        self.overlap = self.overlap or sum(1 for n in self._by.values() if n) > 1
        try:
            await asyncio.sleep(seconds)
        finally:
            self.now -= 1
            self._by[id(limiter)] -= 1
            limiter.release(tokens, tokens)


class Workers:
    """Limiters on one ledger, each with its own link; closes the links at the end."""

    def __init__(self, ledger: LeaseLedger, delay: Callable[[], float] | None = None) -> None:
        self.ledger = ledger
        self.delay = delay
        self.links: list[LocalLink] = []

    def add(self, **options: Any) -> tuple[LeasedLimiter, LocalLink]:
        link = LocalLink(self.ledger, self.delay)
        self.links.append(link)
        ledger = self.ledger
        options.setdefault("max_concurrent", ledger.max_concurrent)
        return LeasedLimiter(link, **options), link

    def close(self) -> None:
        for link in self.links:
            link.close()


@pytest.fixture
def workers() -> Iterator[Callable[..., Workers]]:
    made: list[Workers] = []

    def make(ledger: LeaseLedger, delay: Callable[[], float] | None = None) -> Workers:
        made.append(Workers(ledger, delay))
        return made[-1]

    yield make
    for group in made:
        group.close()


async def until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    """Waits for ``condition`` to hold (a guard against hanging, not a timing assertion)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.002)


async def settle() -> None:
    """Lets every message already on the way be handled."""
    for _ in range(50):
        await asyncio.sleep(0)


async def test_one_worker_alone_leases_the_whole_limit_once_and_reuses_it(workers):
    ledger = LeaseLedger(max_concurrent=LIMIT)
    limiter, _ = workers(ledger).add()
    wire = Wire()

    await asyncio.gather(*(wire.call(limiter, 0.002) for _ in range(40)))

    assert wire.sent == 40 and wire.peak == LIMIT
    assert ledger.granted == LIMIT, "one ask, then every call reused a permit it held"
    await until(lambda: limiter.permits == 0)  # unused for `idle`: given back
    await until(lambda: ledger.peak_leased == LIMIT and ledger._leased == 0)


async def test_two_busy_workers_share_the_limit_and_never_pass_it(workers):
    ledger = LeaseLedger(max_concurrent=LIMIT)
    group = workers(ledger)
    first, _ = group.add()
    second, _ = group.add()
    wire = Wire()

    await asyncio.gather(
        *(wire.call(first, 0.003) for _ in range(60)),
        *(wire.call(second, 0.003) for _ in range(60)),
    )

    assert wire.sent == 120
    assert wire.peak <= LIMIT
    # the first took the whole limit; the second got its share while the first was busy
    assert wire.overlap
    await until(lambda: ledger._leased == 0)


async def test_calls_ending_together_do_not_make_a_worker_ask_again(workers):
    ledger = LeaseLedger(max_concurrent=LIMIT)
    group = workers(ledger)
    limiters = [group.add()[0] for _ in range(2)]
    wire = Wire()

    async def rounds(limiter: LeasedLimiter) -> None:
        for _ in range(30):  # 4 calls at a time, 2 on the wire: each round leaves none waiting
            await asyncio.gather(*(wire.call(limiter, 0.002) for _ in range(LIMIT)))

    await asyncio.gather(*(rounds(limiter) for limiter in limiters))

    assert wire.sent == 240 and wire.peak <= LIMIT
    assert ledger.asks < 20, "an ask stays out while calls come and go"


async def test_a_worker_above_its_share_gives_freed_permits_to_the_waiting_one(workers):
    ledger = LeaseLedger(max_concurrent=LIMIT)
    group = workers(ledger)
    busy, _ = group.add(idle=60)
    other, _ = group.add(idle=60)
    for _ in range(LIMIT):
        await busy.acquire()
    busy_next = asyncio.ensure_future(busy.acquire())
    other_calls = [asyncio.ensure_future(other.acquire()) for _ in range(2)]

    def both_ask() -> bool:  # and the busy one has heard that its share is now 2 of 4
        return len(ledger._asks) == 2 and busy._keep == 2

    for call in other_calls:
        await until(both_ask)
        busy.release()  # its own next call waits, but it is above its share
        await asyncio.wait_for(call, 10)
        assert not busy_next.done()

    busy.release()  # the other wants no more: the permit freed goes to its own next call
    await asyncio.wait_for(busy_next, 10)
    assert (busy.permits, other.permits) == (2, 2)
    assert (await ledger.stats())["holders"] == {busy.name: 2, other.name: 2}
    for limiter in (busy, busy, other, other):
        limiter.release()


async def test_more_workers_than_permits_take_turns(workers):
    ledger = LeaseLedger(max_concurrent=2)
    group = workers(ledger)
    limiters = [group.add()[0] for _ in range(5)]
    wire = Wire()

    await asyncio.gather(*(wire.call(limiter, 0.001) for limiter in limiters for _ in range(8)))

    assert wire.sent == 40 and wire.peak <= 2


async def test_messages_out_of_order_never_let_more_than_the_limit_through(workers):
    shuffle = random.Random(27)
    ledger = LeaseLedger(max_concurrent=LIMIT)
    group = workers(ledger, delay=lambda: shuffle.uniform(0, 0.004))
    limiters = [group.add(idle=shuffle.choice([0.001, 0.01, 0.05]))[0] for _ in range(3)]
    wire = Wire()

    async def burst(limiter: LeasedLimiter) -> None:
        for _ in range(4):
            n = shuffle.randint(1, 12)
            await asyncio.gather(*(wire.call(limiter, shuffle.uniform(0, 0.006)) for _ in range(n)))
            await asyncio.sleep(shuffle.uniform(0, 0.06))

    await asyncio.gather(*(burst(limiter) for limiter in limiters))

    assert wire.peak <= LIMIT
    assert wire.overlap
    await until(lambda: ledger._leased == 0 and all(x.permits == 0 for x in limiters))


async def test_a_dead_workers_permits_come_back_when_its_lease_lapses(workers):
    ledger = LeaseLedger(max_concurrent=LIMIT, term=0.3)
    group = workers(ledger)
    dying, link = group.add(idle=60)
    survivor, _ = group.add()
    for _ in range(LIMIT):
        await dying.acquire()
    link.cut()  # the worker dies holding every permit: nothing it sends arrives

    for _ in range(LIMIT):
        await asyncio.wait_for(survivor.acquire(), 10)

    assert ledger.lapsed == 1
    assert survivor.permits == LIMIT
    assert dying.name not in (await ledger.stats())["holders"]


async def test_a_worker_cut_off_from_the_ledger_stops_using_its_permits_when_its_term_ends(
    workers,
):
    ledger = LeaseLedger(max_concurrent=LIMIT, term=0.3)
    group = workers(ledger)
    cut_off, link = group.add(idle=60)
    await asyncio.gather(*(cut_off.acquire() for _ in range(LIMIT)))
    for _ in range(LIMIT):
        cut_off.release()  # it holds LIMIT unused permits (idle=60 keeps them)
    assert cut_off.permits == LIMIT
    link.cut()

    await until(lambda: cut_off.permits == 0)  # its own count of the term ran out
    late = asyncio.ensure_future(cut_off.acquire())
    await settle()

    assert not late.done(), "no call goes on a lease its holder cannot renew"
    late.cancel()


async def test_a_live_worker_whose_lease_lapsed_covers_its_calls_in_flight_before_sending(
    workers,
):
    skew = [0.0]
    ledger = LeaseLedger(max_concurrent=LIMIT, clock=lambda: time.monotonic() + skew[0])
    group = workers(ledger)
    lapsing, _ = group.add(idle=60)
    other, _ = group.add()
    for _ in range(2):
        await lapsing.acquire()  # two calls in flight...
    old_lease = lapsing._epoch
    skew[0] = ledger.term + 1  # ...when the ledger stops hearing from it for a whole term

    for _ in range(LIMIT):  # the ledger lends the lapsed lease's permits to another worker
        await asyncio.wait_for(other.acquire(), 10)
    await until(lambda: lapsing._epoch != old_lease)  # told by its next answer
    assert lapsing.permits == 0 and lapsing.in_flight == 2
    third = asyncio.ensure_future(lapsing.acquire())
    await settle()
    assert not third.done(), "its two calls in flight hold no permit of the new lease"

    for _ in range(LIMIT):
        other.release()
    await asyncio.wait_for(third, 10)
    assert lapsing.permits == 3 and lapsing.in_flight == 3
    assert ledger.lapsed == 1
    for _ in range(3):
        lapsing.release()


class FakeTime:
    """A clock that moves only when told, and a sleep on it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sleepers.append((self.now + seconds, future))
        await future

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for due, future in list(self.sleepers):
            if due <= self.now + 1e-9:
                self.sleepers.remove((due, future))
                if not future.done():
                    future.set_result(None)


async def test_two_workers_together_never_pass_the_request_rate(workers):
    clock = FakeTime()
    ledger = LeaseLedger(rpm=600, clock=clock.clock, sleep=clock.sleep)  # 10/s, burst 9.5
    group = workers(ledger)
    limiters = [group.add(rpm=600, clock=clock.clock)[0] for _ in range(2)]
    wire = Wire()
    calls = asyncio.gather(*(wire.call(limiter) for limiter in limiters for _ in range(25)))

    elapsed = 0.0
    while wire.sent < 50:
        await until(lambda: clock.sleepers or wire.sent == 50)  # all that may go has gone
        await settle()
        assert wire.sent <= 9.5 + 10 * elapsed
        clock.advance(0.25)
        elapsed += 0.25
    await calls

    assert wire.sent == 50
    assert elapsed >= 4.0


async def test_token_estimates_are_charged_and_corrected_at_the_ledger(workers):
    clock = FakeTime()
    ledger = LeaseLedger(tpm=6000, clock=clock.clock, sleep=clock.sleep)  # 100/s, burst 95
    limiter, _ = workers(ledger).add(tpm=6000, clock=clock.clock, hold=0.005)
    calls = [asyncio.ensure_future(limiter.acquire(30)) for _ in range(4)]
    await until(lambda: clock.sleepers)
    await settle()

    assert [c.done() for c in calls] == [True, True, True, False], "90 of 95: the 4th waits"
    assert (await ledger.stats())["tokens_left"] == pytest.approx(5)
    for _ in range(3):
        limiter.release(30, 10)  # each call used 10 of the 30 it reserved
    await until(lambda: ledger._tokens is not None and ledger._tokens.level > 64)
    assert (await ledger.stats())["tokens_left"] == pytest.approx(65)

    clock.advance(0.25)  # the 4th slept for the 25 tokens it lacked
    await asyncio.wait_for(calls[3], 10)
    limiter.release(30, 30)


async def test_a_429_pauses_every_worker_and_lowers_the_limit_for_all(workers):
    ledger = LeaseLedger(max_concurrent=LIMIT)
    group = workers(ledger)
    hit, _ = group.add(idle=60)
    other, _ = group.add(idle=60)
    for limiter in (hit, other):
        await asyncio.gather(limiter.acquire(), limiter.acquire())
        limiter.release()
        limiter.release()
    await until(lambda: hit.permits + other.permits == LIMIT and ledger._asks == [])

    hit.on_rate_limited(retry_after=60)

    await until(lambda: other.paused_for > 0)  # its watch heard of the pause at once
    assert ledger.rate_limited == 1
    await until(lambda: ledger._leased <= LIMIT // 2)  # the limit halved: both gave back
    waiting = asyncio.ensure_future(other.acquire())
    await settle()
    assert not waiting.done()
    waiting.cancel()


async def test_two_managers_on_one_ledger_keep_the_servers_peak_within_the_limit():
    ledger = LeaseLedger(max_concurrent=3)
    links: list[LocalLink] = []

    def leased(config: Any) -> LeasedLimiter:
        links.append(LocalLink(ledger))
        return LeasedLimiter(links[-1], max_concurrent=config.max_concurrent)

    async with ScriptedServer(latency=0.02) as server:
        endpoint = {"llm": server.endpoint(max_concurrent=3, max_retries=0)}
        async with (
            ResourceManager(endpoint, limiter_factory=leased) as one,
            ResourceManager(endpoint, limiter_factory=leased) as two,
        ):

            def ask(i: int) -> Request:
                return Request(messages=(Message("user", f"q{i}"),))

            replies = await asyncio.gather(
                *(one.complete("llm", ask(i)) for i in range(30)),
                *(two.complete("llm", ask(i)) for i in range(30, 60)),
            )

        assert [r.text for r in replies] == [f"echo: q{i}" for i in range(60)]
        assert server.stats.requests == 60
        assert 1 <= server.stats.peak_concurrency <= 3
    for link in links:
        link.close()


async def test_an_opened_lease_holds_nothing_and_the_first_calls_ask_under_it(workers):
    ledger = LeaseLedger(max_concurrent=LIMIT)
    limiter, _ = workers(ledger).add()

    await limiter.open()

    stats = await ledger.stats()
    assert stats["opened"] == 1 and stats["holders"] == {limiter.name: 0}
    assert stats["leased"] == 0 and limiter.permits == 0
    opened_epoch = limiter._epoch
    await limiter.open()  # a lease already made is not made again
    assert ledger.opened == 1

    wire = Wire()
    await asyncio.gather(*(wire.call(limiter, 0.002) for _ in range(12)))

    assert wire.sent == 12 and wire.peak == LIMIT
    assert limiter._epoch == opened_epoch, "the calls asked under the opened lease"
    # the first ask got the whole limit; a second one waited for more until withdrawn
    assert limiter.stats()["asks"] == ledger.asks == 2


async def test_the_limiters_stats_count_its_asks_and_the_permits_it_gave_back(workers):
    ledger = LeaseLedger(max_concurrent=LIMIT)
    limiter, _ = workers(ledger).add()
    wire = Wire()

    await asyncio.gather(*(wire.call(limiter, 0.002) for _ in range(8)))
    await until(lambda: limiter.permits == 0)  # unused for `idle`: given back

    stats = limiter.stats()
    assert stats["asks"] == 2 and stats["returned"] == LIMIT
    assert stats["acquired"] == 8 and stats["in_flight"] == 0 and stats["keep"] == LIMIT
    assert stats["waited"] >= 1  # the first calls waited for the ask's answer
    await until(lambda: ledger._leased == 0)
    # the ask, the watch the granted permits started, the give: the ledger counts each
    assert ledger.messages >= 3
