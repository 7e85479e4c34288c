"""The deadlines of one connection pool's waits, kept on one timer of its event loop.

Each wait of `plait.backends.openai._http.Exchange` for its reply ends at the
call's deadline. A timer armed and cancelled per wait cost a timer handle
made, scheduled and cancelled per request (on uvloop a libuv timer opened and
closed each time: ~3 % of the samples of ``plait run``'s event loop in a py-spy
profile, most requests answering long before their deadline). Here a wait is
an entry in a dict, and one timer is armed at the earliest deadline among them;
when it fires, every wait due by then fails with `TimeoutError`, as its own
timer would have failed it, and the timer is armed again at the next deadline.
A wait that ends first leaves the dict, and the timer, if it was the earliest,
fires once for nothing.
"""

from __future__ import annotations

import asyncio
import math

__all__ = ["Deadlines"]


class Deadlines:
    """Fails each future added with `TimeoutError` at its deadline (``loop.time()``) unless
    it is removed, or done, by then."""

    __slots__ = ("_at", "_timer", "_waits", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._waits: dict[asyncio.Future[None], float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf
        """The deadline the timer is armed for (inf: none)."""

    def add(self, waiter: asyncio.Future[None], deadline: float) -> None:
        """Fails ``waiter`` at ``deadline``; `remove` it when it ends before."""
        self._waits[waiter] = deadline
        if deadline < self._at:
            if self._timer is not None:
                self._timer.cancel()
            self._arm(deadline)

    def remove(self, waiter: asyncio.Future[None]) -> None:
        """Forgets ``waiter`` (ended before its deadline, or failed at it already)."""
        self._waits.pop(waiter, None)

    def _arm(self, deadline: float) -> None:
        self._at = deadline
        self._timer = self.loop.call_at(deadline, self._fire)

    def _fire(self) -> None:
        # Due: what the fired timer was armed for, as a wait's own timer would have been
        # (a loop may run a timer a little before its time), and whatever is past now.
        due = max(self._at, self.loop.time())
        self._timer, self._at = None, math.inf
        soonest = math.inf
        expired = []
        for waiter, deadline in self._waits.items():
            if deadline <= due:
                expired.append(waiter)
            elif deadline < soonest:
                soonest = deadline
        for waiter in expired:
            del self._waits[waiter]
            if not waiter.done():
                waiter.set_exception(TimeoutError())
        if soonest < math.inf:
            self._arm(soonest)
