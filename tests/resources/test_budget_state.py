"""`StateBooks`: one budget spent by processes on any machines, its books in the state store.

Run on SQLite and on the session's real PostgreSQL server: real processes hold and settle
at once through `SharedBudget` and the budget's own `hold`, and the store's books say
whether they ever passed the budget together.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plait.backends.types import Usage
from plait.resources.budget import Budget, Claim, hold
from plait.resources.budget_state import StateBooks
from plait.resources.shared_budget import SharedBudget
from plait.resources.state import StateStore, open_store, release_store

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import asyncio, os, sys
from plait.backends.types import Usage
from plait.resources.budget import Budget, Claim, hold
from plait.resources.budget_state import StateBooks
from plait.resources.shared_budget import SharedBudget
from plait.resources.state import open_store, release_store

async def main(url, go, calls):
    store = open_store(url)
    budget = SharedBudget(StateBooks(store), "llm", Budget(max_cost=1.0))
    open(f"{go}.{os.getpid()}", "w").close()  # ready
    while not os.path.exists(go):  # both processes start spending together
        await asyncio.sleep(0.01)
    sent = 0
    claim = Claim(tokens=100, cost=0.1)  # worst case $0.10
    async def one():
        nonlocal sent
        if await hold([budget], claim) is not None:
            return  # refused: it could never fit
        sent += 1
        await asyncio.sleep(0.005)
        budget.settle(claim, Usage(10, 10, cost=0.04))  # really $0.04
    await asyncio.gather(*(one() for _ in range(calls)))
    await asyncio.sleep(0.5)  # the last settles are written off the loop
    release_store(store)
    print(sent)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def test_two_processes_together_spend_one_budget_and_use_it(url: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, str(go), "40"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    for _ in range(6000):  # both are ready (a late one would only find the budget spent)
        if len(list(tmp_path.glob("go.*"))) == 2:
            break
        time.sleep(0.01)
    go.write_text("")
    sent = [int(w.communicate(timeout=120)[0]) for w in workers]
    store = open_store(url)
    books = StateBooks(store)
    books.open("llm", Budget(max_cost=1.0))
    totals = books.totals("llm").snapshot()
    release_store(store)
    assert totals["held"]["calls"] == 0
    assert sum(sent) == totals["spent"]["calls"]
    # Never past $1.00 whatever is in flight ($0.10 each), and not stopped before $1.00 less
    # one worst case: a call waits for room held in flight instead of being refused.
    assert 0.9 - 1e-9 <= totals["spent"]["cost"] <= 1.0
    assert all(s > 0 for s in sent), sent


async def test_a_request_waits_for_room_another_process_holds(store: StateStore) -> None:
    mine = SharedBudget(StateBooks(store), "x", Budget(max_cost=0.3))
    theirs = SharedBudget(StateBooks(store), "x", Budget(max_cost=0.3))  # another holder
    claim = Claim(tokens=10, cost=0.2)
    assert await hold([theirs], claim) is None
    waiting = asyncio.ensure_future(hold([mine], claim))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # $0.2 held + $0.2 > $0.3, but it fits once that settles
    theirs.settle(claim, Usage(1, 1, cost=0.05))  # no wake reaches `mine`: it looks again
    assert await asyncio.wait_for(waiting, 10) is None
    refusal = await hold([mine], Claim(tokens=10, cost=0.29))  # $0.05 spent: never fits
    assert refusal is not None and "leaves no room" in refusal.why
    snapshot = mine.snapshot()
    assert snapshot["spent"]["cost"] == pytest.approx(0.05)
    assert snapshot["held"]["cost"] == pytest.approx(0.2)


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
