"""`StateBooks`: one budget spent by processes on any machines, its books in the state store.

Run on SQLite and on the session's real PostgreSQL server. What only the store's books
do: the lease of a silent holder, renewals, books that are not plait's. What every kind
of shared books does (processes spending together, a request waiting for room another
holds) is in test_shared_books.py.
"""

from __future__ import annotations

import asyncio

import pytest

from plait.resources.budget import Budget, Claim, hold
from plait.resources.budget_state import StateBooks
from plait.resources.shared_budget import SharedBudget
from plait.resources.state import StateStore


async def test_the_holds_of_a_holder_silent_for_a_lease_are_charged(store: StateStore) -> None:
    now = [1000.0]
    books = StateBooks(store, lease=30.0, clock=lambda: now[0])
    budget = SharedBudget(books, "x", Budget(max_cost=1.0))
    other = SharedBudget(
        StateBooks(store, lease=30.0, clock=lambda: now[0]), "x", Budget(max_cost=1.0)
    )
    for _ in range(3):
        assert await hold([other], Claim(10, 0.3)) is None
    now[0] += 31.0  # it went silent (died, on whatever machine) with $0.90 held
    refusal = await asyncio.wait_for(hold([budget], Claim(10, 0.2)), 10)
    assert refusal is not None and "leaves no room" in refusal.why
    assert books.charged == 3
    assert await hold([budget], Claim(10, 0.05)) is None
    totals = books.totals("x").snapshot()
    assert totals["spent"]["cost"] == pytest.approx(0.9) and totals["held"]["calls"] == 1


async def test_a_live_holder_renews_its_holds_and_keeps_them(store: StateStore) -> None:
    now = [1000.0]
    books = StateBooks(store, lease=0.3, clock=lambda: now[0])
    other = StateBooks(store, lease=0.3, clock=lambda: now[0])
    budget = SharedBudget(books, "x", Budget(max_cost=1.0))
    watcher = SharedBudget(other, "x", Budget(max_cost=1.0))
    assert await hold([budget], Claim(10, 0.5)) is None
    for _ in range(4):  # time passes past the lease, while the holder renews its stamp
        now[0] += 0.2
        await asyncio.sleep(0.25)
    assert await hold([watcher], Claim(10, 0.4)) is None
    assert other.charged == 0  # the holder lives: its $0.50 stays held, not charged
    assert watcher.snapshot()["held"]["cost"] == pytest.approx(0.9)


def test_books_that_are_not_plaits_refuse_rather_than_pass(store: StateStore) -> None:
    books = StateBooks(store)
    budget = SharedBudget(books, "x", Budget(max_calls=1))
    store.put("budgets", books._keys["x"], b'{"spent": "lots"}')
    verdict = budget.try_hold(Claim(10, None))
    assert isinstance(verdict, str) and "unreadable" in verdict
