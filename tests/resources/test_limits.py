"""Limiter: slots, rpm and tpm buckets, pauses and adaptation, on a fake clock."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from plait.resources import ResourceConfig
from plait.resources.limits import Limiter, limiter_shares, too_small_to_share


class FakeClock:
    """A clock that only moves when someone sleeps on it.

    The limiter lets one waiter at a time sleep for a rate (the others queue
    on its gate), so moving time forward by each sleep is exact.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(0)  # let everyone ready at this instant run first
        self.now += seconds


def limiter(clock: FakeClock, **kwargs: object) -> Limiter:
    return Limiter(clock=clock, sleep=clock.sleep, **kwargs)  # type: ignore[arg-type]


async def acquire_times(lim: Limiter, clock: FakeClock, count: int, tokens: int = 0) -> list:
    """Starts ``count`` acquirers at once; returns the clock time each got through."""
    times: list[float] = []

    async def one() -> None:
        await lim.acquire(tokens)
        times.append(clock.now)
        lim.release()

    await asyncio.gather(*(one() for _ in range(count)))
    return times


async def test_plain_limiter_is_a_slot_count_that_never_touches_the_clock() -> None:
    clock = FakeClock()
    lim = limiter(clock)
    assert [await lim.acquire() for _ in range(100)] == [0.0] * 100
    assert lim.in_flight == 100 and lim.queue_depth == 0 and clock.sleeps == []


async def test_max_concurrent_queues_in_order_and_hands_slots_over() -> None:
    clock = FakeClock()
    lim = limiter(clock, max_concurrent=2)
    await lim.acquire()
    await lim.acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        await lim.acquire()
        order.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
    await asyncio.sleep(0)
    assert lim.queue_depth == 3 and lim.in_flight == 2 and order == []
    lim.release()
    await asyncio.sleep(0)
    assert order == [0] and lim.in_flight == 2
    lim.release()
    lim.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2] and lim.queue_depth == 0 and lim.in_flight == 2


async def test_a_cancelled_waiter_leaves_no_trace() -> None:
    clock = FakeClock()
    lim = limiter(clock, max_concurrent=1)
    await lim.acquire()
    task = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lim.queue_depth == 0
    lim.release()
    assert lim.in_flight == 0
    assert await lim.acquire() == 0.0  # the slot is free again


async def test_a_waiter_cancelled_as_a_slot_frees_stays_cancelled() -> None:
    # Ctrl-C cancels every waiter at once while the requests in flight end and
    # free their slots: the freed slot skips the cancelled waiter and goes to
    # the next one, and the cancelled waiter must still end cancelled (it once
    # raised ValueError there, which turned the cancel into a failed item and
    # let the batch go on sending requests).
    clock = FakeClock()
    lim = limiter(clock, max_concurrent=1)
    await lim.acquire()
    cancelled = asyncio.create_task(lim.acquire())
    next_in_line = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0)
    cancelled.cancel()
    lim.release()  # before the cancelled waiter has run
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert await next_in_line == 0.0
    assert lim.in_flight == 1 and lim.queue_depth == 0
    lim.release()
    assert await lim.acquire() == 0.0  # nothing stale is left queued


async def test_rpm_allows_a_one_second_burst_then_spaces_requests() -> None:
    clock = FakeClock()
    lim = limiter(clock, rpm=600)  # 10 per second, burst of 10
    times = await acquire_times(lim, clock, 20)
    assert times[:10] == [0.0] * 10
    gaps = [b - a for a, b in itertools.pairwise(times[10:])]
    assert times[10] == pytest.approx(0.1)
    assert gaps == pytest.approx([0.1] * 9)
    assert lim.waited == 10
    assert lim.wait_time_total == pytest.approx(sum(t for t in times))


async def test_rpm_refills_while_idle() -> None:
    clock = FakeClock()
    lim = limiter(clock, rpm=60)  # one per second, burst of one
    await acquire_times(lim, clock, 2)
    assert clock.now == pytest.approx(1.0)
    clock.now += 5.0  # idle: the bucket refills, but only up to its capacity
    times = await acquire_times(lim, clock, 2)
    assert times == pytest.approx([6.0, 7.0])


async def test_tpm_reserves_the_estimate_and_corrects_it_from_real_usage() -> None:
    clock = FakeClock()
    lim = limiter(clock, tpm=600)  # 10 tokens per second, capacity 10
    assert await lim.acquire(10) == 0.0
    lim.release(reserved=10, used=4)  # 6 of the reserved tokens come back
    assert await lim.acquire(10) == pytest.approx(0.4)
    lim.release(reserved=10, used=10)
    # larger than the capacity: goes once the bucket is full, and leaves a debt
    assert await lim.acquire(30) == pytest.approx(1.0)
    lim.release(reserved=30, used=30)
    assert clock.now == pytest.approx(1.4)
    await lim.acquire(5)
    assert clock.now == pytest.approx(1.4 + 2.5)  # 20 of debt + 5, at 10 per second
    lim.release(reserved=5, used=15)  # used more than reserved: charged extra
    await lim.acquire(1)
    assert clock.now == pytest.approx(3.9 + 1.1)


async def test_pause_holds_every_new_request_until_it_ends() -> None:
    clock = FakeClock()
    lim = limiter(clock, max_concurrent=4)
    lim.on_rate_limited(retry_after=2.5)
    assert lim.paused_for == pytest.approx(2.5)
    times = await acquire_times(lim, clock, 3)
    assert times == pytest.approx([2.5, 2.5, 2.5])
    assert lim.paused_for == 0.0
    lim.pause_for(1.0)
    lim.pause_for(0.5)  # a shorter pause never shortens the current one
    assert await lim.acquire() == pytest.approx(1.0)


async def test_repeated_429s_halve_the_rate_down_to_a_floor_and_success_recovers_it() -> None:
    clock = FakeClock()
    lim = limiter(clock, rpm=600, max_concurrent=40, decrease_interval=1.0)
    lim.on_rate_limited()
    lim.on_rate_limited()  # the same episode: counted, not halved again
    assert lim.rate_limited == 2
    assert lim.effective_rpm == pytest.approx(300)
    assert lim.effective_max_concurrent == 20
    for _ in range(6):
        clock.now += 1.0
        lim.on_rate_limited()
    assert lim.scale == pytest.approx(0.1)  # the floor
    assert lim.effective_rpm == pytest.approx(60)
    assert lim.effective_max_concurrent == 4
    for _ in range(10):
        lim.on_success()
    assert lim.scale == pytest.approx(0.3)
    for _ in range(100):
        lim.on_success()
    assert lim.scale == 1.0 and lim.effective_rpm == 600 and lim.effective_max_concurrent == 40


async def test_a_lowered_rate_spaces_requests_further() -> None:
    clock = FakeClock()
    lim = limiter(clock, rpm=60)
    await acquire_times(lim, clock, 1)
    lim.on_rate_limited()
    start = clock.now
    times = await acquire_times(lim, clock, 3)
    assert [t - start for t in times] == pytest.approx([2.0, 4.0, 6.0])


async def test_non_adaptive_limiter_keeps_its_rate() -> None:
    clock = FakeClock()
    lim = limiter(clock, rpm=60, adaptive=False)
    lim.on_rate_limited()
    assert lim.effective_rpm == 60 and lim.scale == 1.0


async def test_growing_window_wakes_waiters() -> None:
    clock = FakeClock()
    lim = limiter(clock, max_concurrent=2, recovery_step=0.5)
    lim.on_rate_limited()
    assert lim.effective_max_concurrent == 1
    await lim.acquire()
    task = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0)
    assert not task.done()
    lim.on_success()
    await asyncio.wait_for(task, 1)
    assert lim.in_flight == 2


def test_a_share_holds_its_part_of_each_limit_and_too_small_ones_are_named() -> None:
    config = ResourceConfig(
        {
            "a": {"provider": "openai", "model": "m", "max_concurrent": 9, "rpm": 600},
            "b": {"provider": "openai", "model": "m", "max_concurrent": 2, "tpm": 3000},
            "c": {"provider": "openai", "model": "m"},
        }
    )
    share = limiter_shares(4)
    a, b, c = (share(config.resolve(alias)) for alias in "abc")
    assert (a.max_concurrent, a.rpm, a.tpm) == (2, 150, None)  # 4 x 2 <= 9
    assert (b.max_concurrent, b.rpm, b.tpm) == (1, None, 750)
    assert (c.max_concurrent, c.rpm, c.tpm) == (None, None, None)
    assert too_small_to_share(config.endpoints(), 4) == ["b (max_concurrent=2)"]
    assert too_small_to_share(config.endpoints(), 2) == []
