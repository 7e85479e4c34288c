"""CallSlots: the run's limit on LLM calls in flight, handing freed slots out by rank.

A batch keeps enough items in flight that no slot idles, and their calls queue
here when every slot is taken. A FIFO queue would serve them in the order they
became ready, so the last call of an item started long ago waits behind the
first calls of items just admitted: items finish late, out of order, and many
sit half done in memory. Here each call has a rank, ``(item index, height)``,
height being the number of calls on the longest path from it to the end of its
item's graph, and a freed slot goes to the best waiting call:

* while items are still being admitted, the oldest item's first, and within an
  item the one with most work after it (its critical path): started items
  finish, in order, and hold their memory briefly;
* once the last item is admitted and no more items are unfinished than there
  are slots (`last_admitted`), the call with most work after it, whatever its
  item: with nothing left to admit, what decides when the
  batch ends is its longest remaining chain, and highest-first list scheduling
  (Hu's rule) keeps the final rounds full instead of leaving one late call of a
  young item alone in a last round.

Calls of equal rank keep their arrival order. `first_filled` tells when every
slot has been taken: the batch then admits its second set of items, whose calls
wait here so that no freed slot idles (see `plait.execution.batch`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Any

__all__ = ["CallSlots", "Rank"]

Rank = tuple[int, int]
"""``(item index, height)``: the call's item, and the calls on the longest path from
it to the end of that item's graph (itself included)."""


def _oldest_item_first(rank: Rank) -> tuple[int, int]:
    return rank[0], -rank[1]


def _most_work_first(rank: Rank) -> tuple[int, int]:
    return -rank[1], rank[0]


class CallSlots:
    """At most ``limit`` holders at once; a freed slot goes to the best-ranked waiter.

    Hold one with ``async with slots.hold(rank):``. A slot is free only when no
    call waits (a release hands it straight to the best waiter), so a newcomer
    never jumps a waiting call. The slots of one run belong to the event loop that
    first waits for one (an executor's run is on one loop): it is looked up once,
    not per waiting call (on Python 3.11 each lookup is a ``getpid`` system call).
    """

    __slots__ = ("_filled", "_free", "_key", "_loop", "_order", "_waiters", "filled", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free = limit
        self._key = _oldest_item_first
        self._waiters: list[tuple[tuple[int, int], int, Rank, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self.filled = False
        """Whether every slot has been taken at once yet."""
        self._filled: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def hold(self, rank: Rank) -> _Held:
        """Returns one slot to hold with ``async with`` (or `acquire` / `release`)."""
        return _Held(self, rank)

    def last_admitted(self) -> None:
        """Tells that no more items will come: from now on, most work after a call first."""
        self._key = _most_work_first
        self._waiters = [(self._key(rank), n, rank, f) for _, n, rank, f in self._waiters]
        heapq.heapify(self._waiters)

    def take(self) -> bool:
        """Takes a free slot if there is one (no waiting); returns whether it did."""
        if self._free <= 0:
            return False
        self._free -= 1
        if not self._free and not self.filled:
            self._fill()
        return True

    async def acquire(self, rank: Rank) -> None:
        """Waits for a slot: at once if one is free, else until a release picks this call."""
        if self.take():
            return
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        granted = loop.create_future()
        heapq.heappush(self._waiters, (self._key(rank), next(self._order), rank, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release()  # picked, then cancelled before it ran: pass the slot on
            raise

    async def first_filled(self) -> None:
        """Returns once every slot has been taken at the same time (at once if that happened)."""
        if self.filled:
            return
        if self._filled is None:
            self._filled = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._filled)

    def _fill(self) -> None:
        self.filled = True
        if self._filled is not None:
            self._filled.set_result(None)

    def release(self) -> None:
        """Gives the slot to the best live waiter, or frees it."""
        while self._waiters:
            granted = heapq.heappop(self._waiters)[3]
            if not granted.done():  # a waiter cancelled while queued is skipped
                granted.set_result(None)
                return
        self._free += 1


class _Held:
    """One slot of `CallSlots` at one rank, as an async context manager."""

    __slots__ = ("_rank", "_slots")

    def __init__(self, slots: CallSlots, rank: Rank) -> None:
        self._slots = slots
        self._rank = rank

    async def acquire(self) -> None:
        await self._slots.acquire(self._rank)

    def release(self) -> None:
        self._slots.release()

    async def __aenter__(self) -> None:
        if not self._slots.take():  # a free slot is taken without making a coroutine
            await self._slots.acquire(self._rank)

    async def __aexit__(self, *exc_info: Any) -> None:
        self._slots.release()
