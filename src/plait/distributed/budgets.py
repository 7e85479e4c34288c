"""Budgets shared by the workers of a cluster, whose books one ledger keeps.

One `BudgetAccounts` (in a Ray actor: `plait.distributed.ray.BudgetActor`) keeps the
books of a deployment's or a job's budgets: for each a `Budget`, which every worker's
requests hold their room in. A worker's budgets are `SharedBudget`s over a
`LinkedBudgets`, its way to the actor: a request that finds no room held for it asks
the actor (one message, answered once the room is held: at once, or when settles of
any worker made room; or refused, when it could never fit) and waits meanwhile, as for
room in a budget of its own process; when its reply comes the hold is settled with the
real usage (one more message, not waited for). Two messages per request, and the
actor's one event loop decides every hold in turn, so the workers together never pass
a budget and a request waits only while room held in flight anywhere may come back.

A worker that holds room keeps the actor told it lives: every message counts, and a
worker with holds or asks in flight sends one more every third of the ``term`` (10 s)
when it sent nothing else. A worker silent for a whole term is taken for dead: its
holds are charged as spent at their worst case (its requests may well have been
billed, so the budget stays a hard limit) and its waiting asks are answered with no
room. An ask whose request was cancelled before the answer came gives the room back.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from plait.backends.types import Usage
from plait.distributed.leases import DEFAULT_TERM, LedgerLink
from plait.resources.budget import WAIT, Budget, Claim
from plait.resources.budget_file import books
from plait.resources.shared_budget import SharedBudget

__all__ = ["BudgetAccounts", "LinkedBudgets"]

Limits = tuple[int | None, int | None, float | None, bool]
"""A budget's ``max_calls``, ``max_tokens``, ``max_cost`` and ``unpriced_free``."""
Books = tuple[Limits, tuple[int, int, float], tuple[int, int, float]]
"""A budget's limits, spent and held, as `plait.resources.budget_file.books` takes them."""


class BudgetAccounts:
    """The books of the budgets many workers share (see the module doc).

    Every method is a coroutine, so in a Ray actor all run on the actor's one event loop.

    Args:
        term: seconds after its last message at which a worker counts as dead.
        clock: monotonic seconds (tests may inject one).
    """

    def __init__(
        self, *, term: float = DEFAULT_TERM, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.term = term
        self._clock = clock
        self._budgets: dict[str, Budget] = {}
        self._holds: dict[str, Counter[tuple[str, Claim]]] = {}
        """Per worker, its requests' holds in flight: (budget name, claim) -> how many."""
        self._seen: dict[str, float] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.messages = 0
        """Messages from workers so far (asks, settles, releases, renewals…)."""
        self.charged = 0
        """Holds of dead workers charged as spent."""

    async def ask(
        self, holder: str, name: str, limits: Limits, claim: Claim
    ) -> tuple[str | None, Books]:
        """Holds ``claim`` for ``holder``'s request in budget ``name`` (made with ``limits``
        unless a worker made it already: an ask may overtake any message), waiting while
        room held in flight may come back. Returns None once held, or why it never fits;
        and the books."""
        self._heard(holder)
        budget = self._budgets.get(name)
        if budget is None:
            max_calls, max_tokens, max_cost, unpriced_free = limits
            budget = Budget(max_calls, max_tokens, max_cost, unpriced_free=unpriced_free)
            self._budgets[name] = budget
        while True:
            if holder not in self._seen:
                return "the worker was taken for dead", self._books(name)
            verdict = budget.try_hold(claim)
            if verdict is None:
                self._holds.setdefault(holder, Counter())[name, claim] += 1
                return None, self._books(name)
            if verdict is not WAIT:
                budget.refuse(str(verdict))
                return str(verdict), self._books(name)
            await budget.changed()

    async def settle(self, holder: str, name: str, claim: Claim, usage: Usage | None) -> None:
        """Replaces a hold by what its request spent (None: failed, nothing billed)."""
        self._heard(holder)
        if self._unhold(holder, name, claim):
            self._budgets[name].settle(claim, usage)

    async def release(self, holder: str, name: str, claim: Claim) -> None:
        """Gives back the hold of a request that was never sent."""
        self._heard(holder)
        if self._unhold(holder, name, claim):
            self._budgets[name].release(claim)

    async def add(self, holder: str, name: str, usage: Usage) -> None:
        """Counts usage spent without a hold (a provider batch job)."""
        self._heard(holder)
        self._budgets[name].add(usage)

    async def renew(self, holder: str) -> None:
        """Tells the actor ``holder`` lives (it holds room, and sent nothing for a while)."""
        self._heard(holder)

    async def stats(self) -> dict[str, Any]:
        """Returns the messages received, the holds of dead workers charged, and each
        budget's books (`Budget.snapshot`)."""
        return {
            "messages": self.messages,
            "charged": self.charged,
            "budgets": {name: budget.snapshot() for name, budget in self._budgets.items()},
        }

    async def books(self, name: str) -> Books:
        """Returns the books of budget ``name``."""
        return self._books(name)

    def _books(self, name: str) -> Books:
        budget = self._budgets[name]
        held = budget.held()
        limits = (budget.max_calls, budget.max_tokens, budget.max_cost, budget.unpriced_free)
        settled = budget.calls - held["calls"]
        spent = (settled, budget.input_tokens + budget.output_tokens, budget.cost)
        return limits, spent, (held["calls"], held["tokens"], held["cost"])

    def _unhold(self, holder: str, name: str, claim: Claim) -> bool:
        """Drops one hold of ``holder``; False if it has none such (charged already)."""
        holds = self._holds.get(holder)
        if holds is None or holds[name, claim] <= 0:
            return False
        holds[name, claim] -= 1
        if holds[name, claim] == 0:
            del holds[name, claim]
        return True

    def _heard(self, holder: str) -> None:
        self.messages += 1
        self._seen[holder] = self._clock()
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        """Every third of a term, charges the holds of workers silent for a whole term;
        ends once no worker is left to watch (the next message starts it again)."""
        while self._seen:
            await asyncio.sleep(self.term / 3)
            self.charge_silent()

    def charge_silent(self) -> None:
        """Charges the holds of workers silent for a whole term as spent, at their worst
        case; their waiting asks are answered with no room."""
        now = self._clock()
        for holder in [h for h, seen in self._seen.items() if now - seen >= self.term]:
            del self._seen[holder]
            for (name, claim), count in self._holds.pop(holder, Counter()).items():
                for _ in range(count):
                    usage = Usage(claim.tokens, 0, cost=claim.cost or 0.0)
                    self._budgets[name].settle(claim, usage)
                    self.charged += 1
        for budget in self._budgets.values():
            budget._wake()  # waiting asks of the dead look again, and end

    async def close(self) -> None:
        """Stops watching for silent workers (a ledger in a test's event loop)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None


_PENDING = object()
_ABANDONED = object()


class LinkedBudgets:
    """A worker's way to the `BudgetAccounts` of its deployment or job, over ``link``: the
    keeper (`plait.resources.shared_budget.Books`) of its `SharedBudget`s."""

    poll = None  # the answers wake the waiting requests

    def __init__(self, link: LedgerLink, *, term: float = DEFAULT_TERM) -> None:
        self._link = link
        self.holder = f"{os.getpid()}-{os.urandom(6).hex()}"
        self.term = term
        self._budgets: dict[str, SharedBudget] = {}
        self._asks: dict[tuple[asyncio.Task[Any], str], Any] = {}
        """Per request and budget: an ask on the way, its answer, or its abandonment."""
        self._heard: dict[str, Books] = {}
        self._asking: set[asyncio.Future[None]] = set()
        self._busy = 0
        self._last = 0.0
        self._renewer: asyncio.Task[None] | None = None
        self.messages = 0
        """Messages sent to the actor (two per request: the ask and the settle)."""

    def open(self, name: str, budget: SharedBudget) -> None:
        """Notes budget ``name``; its first ask makes it at the actor."""
        self._budgets[name] = budget

    def try_hold(self, name: str, claim: Claim, waiting: int = 0) -> object | str | None:
        task = asyncio.current_task()
        assert task is not None  # a hold is taken by a request's task
        key = (task, name)
        answer = self._asks.get(key, None)
        if answer is None:
            self._asks[key] = _PENDING
            self._busy += 1
            task.add_done_callback(lambda _: self._abandon(key))
            asking = asyncio.ensure_future(self._ask(key, claim))
            self._asking.add(asking)
            asking.add_done_callback(self._asking.discard)
            return WAIT
        if answer is _PENDING:
            return WAIT
        del self._asks[key]
        if isinstance(answer, str):
            return answer
        return None  # the claim the actor held for it

    async def _ask(self, key: tuple[asyncio.Task[Any], str], claim: Claim) -> None:
        name = key[1]
        budget = self._budgets[name]
        limits = (budget.max_calls, budget.max_tokens, budget.max_cost, budget.unpriced_free)
        self._sent()
        try:
            why, heard = await self._link.call("ask", self.holder, name, limits, claim)
        except Exception as exc:  # the actor is gone: no room can be had
            why, heard = f"the budget ledger cannot be reached ({exc})", None
        if heard is not None:
            self._heard[name] = heard
        if self._asks.get(key) is _ABANDONED:
            del self._asks[key]
            if why is None:
                self._send("release", self.holder, name, claim)
            self._busy -= 1
            return
        self._asks[key] = why if why is not None else claim
        if why is not None:
            self._busy -= 1
        self._budgets[name].wake()

    def _abandon(self, key: tuple[asyncio.Task[Any], str]) -> None:
        """The request's task ended: room held for it and never taken goes back."""
        answer = self._asks.get(key)
        if answer is _PENDING:
            self._asks[key] = _ABANDONED
        elif isinstance(answer, Claim):
            del self._asks[key]
            self._busy -= 1
            self._send("release", self.holder, key[1], answer)
        elif answer is not None:
            del self._asks[key]

    def settle(self, name: str, claim: Claim, usage: Usage | None) -> None:
        self._busy -= 1
        self._send("settle", self.holder, name, claim, usage)

    def release(self, name: str, claim: Claim) -> None:
        self._busy -= 1
        self._send("release", self.holder, name, claim)

    def add(self, name: str, usage: Usage) -> None:
        self._send("add", self.holder, name, usage)

    def totals(self, name: str) -> Budget:
        heard = self._heard.get(name)
        if heard is None:
            budget = self._budgets[name]
            return books((budget.max_calls, budget.max_tokens, budget.max_cost,
                          budget.unpriced_free), (0, 0, 0.0), (0, 0, 0.0))  # fmt: skip
        return books(*heard)

    def _send(self, method: str, *args: Any) -> None:
        self._sent()
        self._link.send(method, *args)

    def _sent(self) -> None:
        self.messages += 1
        self._last = time.monotonic()
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        """While this worker holds room or asks for it, tells the actor it lives when it
        said nothing for a third of the term."""
        beat = self.term / 3
        await asyncio.sleep(0)
        while self._busy > 0:
            quiet = time.monotonic() - self._last
            if quiet >= beat:
                self.messages += 1
                self._last = time.monotonic()
                self._link.send("renew", self.holder)
                quiet = 0.0
            await asyncio.sleep(beat - quiet)

    async def aclose(self) -> None:
        """Stops the renewals (the worker is done)."""
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
