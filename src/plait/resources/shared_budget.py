"""One budget spent by several processes: a `Budget` whose books are kept elsewhere.

One process keeps a budget's books in memory (`plait.resources.budget.Budget`).
Processes that serve one deployment (``plait serve --workers N``, Ray Serve replicas,
Ray Data workers) must spend each budget once between them, so each gets a
`SharedBudget` over one `Books` keeper they share: an SQLite file on one machine
(`plait.resources.budget_file.BudgetFile`) or a ledger actor on a cluster
(`plait.distributed.budgets.LinkedBudgets`). It keeps the promises of every budget
(never passed whatever is in flight anywhere; a request waits while room held in
flight anywhere may come back, and is refused only when it could never fit), with the
books of all the processes: ``try_hold`` asks the keeper, which decides atomically by
the same rule; settles and releases go to the keeper too.

A `BudgetStore` gives a manager its shared budgets (`ResourceManager(...,
budget_store=...)`): the endpoints' ``budget`` as ``endpoint:NAME`` and the manager's
own as ``manager``; a run's budget (``map_dataset(..., max_cost=...)``) is one more name.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from plait.backends.types import Usage
from plait.resources.budget import WAIT, Budget, Claim

__all__ = ["Books", "BudgetStore", "SharedBudget"]


class Books(Protocol):
    """Where the books of budgets shared by processes are kept, by budget name."""

    @property
    def poll(self) -> float | None:
        """Seconds between looks while a request waits (None: the keeper wakes its budgets)."""
        ...

    def open(self, name: str, budget: SharedBudget) -> None:
        """Makes budget ``name`` with ``budget``'s limits unless a process made it already."""
        ...

    def try_hold(self, name: str, claim: Claim, waiting: int = 0) -> object | str | None:
        """As `Budget.try_hold`, against every process's books, atomically (``waiting``:
        this process's other requests waiting for room)."""
        ...

    def settle(self, name: str, claim: Claim, usage: Usage | None) -> None: ...

    def release(self, name: str, claim: Claim) -> None: ...

    def add(self, name: str, usage: Usage) -> None: ...

    def totals(self, name: str) -> Budget:
        """The books of budget ``name`` across every process (or as last heard)."""
        ...


class SharedBudget(Budget):
    """A `Budget` whose books are kept by ``books``, shared with other processes.

    Its own counters (``calls``, ``cost``…) count this process's part, and its waiters
    are this process's requests; `snapshot` and the decisions use the books of all.

    Args:
        books: the keeper.
        name: the budget's name there.
        limits: a `Budget` with the limits (its books are not used).
    """

    __slots__ = ("_books", "_poller", "name")

    def __init__(self, books: Books, name: str, limits: Budget) -> None:
        super().__init__(
            limits.max_calls, limits.max_tokens, limits.max_cost, unpriced_free=limits.unpriced_free
        )
        self._books = books
        self._poller: asyncio.TimerHandle | None = None
        self.name = name
        books.open(name, self)

    def __repr__(self) -> str:
        return f"SharedBudget({self.name!r}, {self.limits()}; spent {self.spent()})"

    def try_hold(self, claim: Claim) -> Any | str | None:
        waiting = sum(not w.done() for w in self._waiters)
        verdict = self._books.try_hold(self.name, claim, waiting)
        if verdict is None:
            self.calls += 1
            self._held_calls += 1
            self._held_tokens += claim.tokens
            self._held_cost += claim.cost or 0.0
        if verdict is not WAIT and waiting:
            self._wake()  # room may be left: the next waiting request looks too
        return verdict

    def settle(self, claim: Claim, usage: Usage | None) -> None:
        self._books.settle(self.name, claim, usage)
        super().settle(claim, usage)

    def release(self, claim: Claim) -> None:
        self._books.release(self.name, claim)
        super().release(claim)

    def add(self, usage: Usage) -> None:
        self._books.add(self.name, usage)
        super().add(usage)

    def changed(self) -> asyncio.Future[None]:
        """Done when this process's requests may find room: after one of its settles or
        releases, or the keeper's news; a keeper others change without telling (a file)
        is looked at again every ``poll`` seconds while requests wait."""
        waiter = super().changed()
        poll = self._books.poll
        if poll is not None and self._poller is None:
            self._poller = asyncio.get_running_loop().call_later(poll, self._poll)
        return waiter

    def _poll(self) -> None:
        self._poller = None
        self._wake()
        poll = self._books.poll
        if poll is not None and any(not w.done() for w in self._waiters):
            self._poller = asyncio.get_running_loop().call_later(poll, self._poll)

    def _wake(self) -> None:
        """Wakes the longest-waiting request only: each look at shared books costs a
        message or a transaction, so waiting requests look one after another (a request
        that got room, or was refused, wakes the next) instead of all at once."""
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    def wake(self) -> None:
        """Wakes every waiting request of this process: the keeper has news for one of
        them (an answer to its own ask), which each finds without a message."""
        super()._wake()

    def snapshot(self) -> dict[str, Any]:
        """The books of every process (`Budget.snapshot`), with this process's refusals
        and waiting requests."""
        whole = self._books.totals(self.name).snapshot()
        mine = super().snapshot()
        whole["refused"], whole["waiting"] = mine["refused"], mine["waiting"]
        return whole


class BudgetStore:
    """Makes a manager's budgets shared ones, in one keeper (`ResourceManager`'s
    ``budget_store``): each budget by its name there."""

    def __init__(self, books: Books) -> None:
        self.books = books

    def share(self, name: str, budget: Budget | None) -> Budget | None:
        """Returns ``budget`` as the shared budget ``name`` (None stays None)."""
        return None if budget is None else SharedBudget(self.books, name, budget)
