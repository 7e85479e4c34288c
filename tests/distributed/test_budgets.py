"""The shared budget logic in one process: `SharedBudget`s of several workers over their own
`LinkedBudgets`, on one real `BudgetAccounts`, each through a `LocalLink` (every message a
task of its own, as a Ray actor runs each call; random delays deliver them out of order;
`cut` plays a worker that died)."""

from __future__ import annotations

import asyncio
import random

import pytest

from plait.backends.types import Usage
from plait.distributed.budgets import BudgetAccounts, LinkedBudgets
from plait.distributed.leases import LocalLink
from plait.resources.budget import Budget, Claim, hold
from plait.resources.shared_budget import SharedBudget


async def test_workers_together_stay_within_one_budget_and_use_it() -> None:
    accounts = BudgetAccounts()
    rng = random.Random(7)
    links = [LocalLink(accounts, delay=lambda: rng.random() * 0.002) for _ in range(3)]
    keepers = [LinkedBudgets(link) for link in links]
    budgets = [SharedBudget(k, "llm", Budget(max_cost=1.0)) for k in keepers]
    claim = Claim(tokens=100, cost=0.1)  # worst case $0.10, real $0.03
    sent = 0

    async def one(budget: SharedBudget) -> None:
        nonlocal sent
        if await hold([budget], claim) is not None:
            return
        sent += 1
        await asyncio.sleep(rng.random() * 0.005)
        budget.settle(claim, Usage(5, 5, cost=0.03))

    await asyncio.gather(*(one(b) for b in budgets for _ in range(30)))
    await asyncio.sleep(0.05)  # the last settles arrive
    books = await accounts.books("llm")
    assert books[2][0] == 0  # nothing held
    assert books[1][0] == sent
    # Never past $1.00 whatever is in flight, and not stopped before $1.00 less one worst
    # case ($0.10): a call waits for room held in flight instead of being refused.
    assert 0.9 - 1e-9 <= books[1][2] <= 1.0
    assert sum(k.messages for k in keepers) <= 2 * sent + 90  # asks and settles
    for link in links:
        link.close()
    await accounts.close()


async def test_a_silent_worker_is_charged_its_holds_and_a_waiting_one_goes_on() -> None:
    accounts = BudgetAccounts(term=0.3)
    dying_link, live_link = LocalLink(accounts), LocalLink(accounts)
    dying = SharedBudget(LinkedBudgets(dying_link, term=0.3), "x", Budget(max_cost=1.0))
    live = SharedBudget(LinkedBudgets(live_link, term=0.3), "x", Budget(max_cost=1.0))
    for _ in range(3):
        assert await hold([dying], Claim(10, 0.3)) is None
    dying_link.cut()  # it dies with three requests in flight ($0.90 held)
    # $0.20 does not fit beside them: it waits until the dead worker's holds are charged
    # at their worst case, and is then refused, as it can never fit; $0.05 still fits.
    refusal = await asyncio.wait_for(hold([live], Claim(10, 0.2)), 5)
    assert refusal is not None and "leaves no room" in refusal.why
    assert accounts.charged == 3
    books = await accounts.books("x")
    assert books[1][0] == 3 and books[1][2] == pytest.approx(0.9)
    assert await hold([live], Claim(10, 0.05)) is None
    dying_link.close()
    live_link.close()
    await accounts.close()


async def test_a_worker_with_a_long_call_in_flight_keeps_its_hold() -> None:
    accounts = BudgetAccounts(term=0.2)
    link = LocalLink(accounts)
    keeper = LinkedBudgets(link, term=0.2)
    budget = SharedBudget(keeper, "x", Budget(max_cost=1.0))
    assert await hold([budget], Claim(10, 0.5)) is None
    await asyncio.sleep(0.6)  # three terms: its renewals keep it alive
    assert accounts.charged == 0
    budget.settle(Claim(10, 0.5), Usage(1, 1, cost=0.1))
    await asyncio.sleep(0.01)
    books = await accounts.books("x")
    assert books[1][2] == pytest.approx(0.1) and books[2][0] == 0
    link.close()
    await keeper.aclose()
    await accounts.close()


async def test_room_granted_to_a_cancelled_request_goes_back() -> None:
    accounts = BudgetAccounts()
    link = LocalLink(accounts, delay=lambda: 0.05)
    keeper = LinkedBudgets(link)
    budget = SharedBudget(keeper, "x", Budget(max_cost=1.0))
    waiting = asyncio.ensure_future(hold([budget], Claim(10, 0.6)))
    await asyncio.sleep(0.01)  # its ask is on the way
    waiting.cancel()
    await asyncio.sleep(0.3)  # the answer came, for nobody: the room went back
    books = await accounts.books("x")
    assert books[2][0] == 0 and books[1][0] == 0
    assert await hold([budget], Claim(10, 0.6)) is None  # so it fits again
    link.close()
    await keeper.aclose()
    await accounts.close()
