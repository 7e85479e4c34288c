"""What every kind of a shared budget's books does: `BudgetFile` (an SQLite file the
processes of one machine share) and `StateBooks` (the state store, on SQLite and on the
session's real PostgreSQL server).

Real processes hold and settle at once through `SharedBudget` and the budget's own
`hold`, and the books say whether they ever passed the budget together. What one kind
alone does is in test_budget_file.py and test_budget_state.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plait.backends.types import Usage
from plait.resources.budget import Budget, Claim, hold
from plait.resources.budget_file import BudgetFile
from plait.resources.budget_state import StateBooks
from plait.resources.shared_budget import Books, SharedBudget
from plait.resources.state import open_store, release_store

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import asyncio, glob, os, sys
from plait.backends.types import Usage
from plait.resources.budget import Budget, Claim, hold
from plait.resources.budget_file import BudgetFile
from plait.resources.budget_state import StateBooks
from plait.resources.shared_budget import SharedBudget
from plait.resources.state import open_store, release_store

async def main(kind, where, go, calls):
    store = open_store(where) if kind == "StateBooks" else None
    books = BudgetFile(where) if store is None else StateBooks(store)
    budget = SharedBudget(books, "llm", Budget(max_cost=1.0))
    open(f"{go}.{os.getpid()}", "w").close()  # ready
    while not os.path.exists(go):  # both processes start spending together
        await asyncio.sleep(0.01)
    sent = 0
    claim = Claim(tokens=100, cost=0.1)  # worst case $0.10
    async def one(held=False):
        nonlocal sent
        if not held and await hold([budget], claim) is not None:
            return  # refused: it could never fit
        sent += 1
        await asyncio.sleep(0.005)
        budget.settle(claim, Usage(10, 10, cost=0.04))  # really $0.04
    # Each holds one call before either settles any (both fit in $1.00), so a process the
    # machine woke late still spends: CI saw the first spend the whole budget alone.
    assert await hold([budget], claim) is None
    open(f"{go}.held.{os.getpid()}", "w").close()
    while len(glob.glob(f"{go}.held.*")) < 2:
        await asyncio.sleep(0.01)
    await asyncio.gather(one(held=True), *(one() for _ in range(calls - 1)))
    if store is not None:
        await asyncio.sleep(0.5)  # the last settles are written off the loop
        release_store(store)
    print(sent)

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
"""


@pytest.fixture(params=["BudgetFile", "StateBooks-sqlite", "StateBooks-postgres"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """Returns the kind of books and where they are kept (a file, or a state URL)."""
    kind, _, store = request.param.partition("-")
    if store == "postgres":
        return kind, str(request.getfixturevalue("state_url"))
    return kind, str(tmp_path / "books.sqlite")


@contextlib.contextmanager
def opened(place: tuple[str, str]) -> Iterator[Books]:
    """Yields books of ``place`` on a connection of their own (another holder's, as it were)."""
    kind, where = place
    if kind == "BudgetFile":
        yield BudgetFile(where)
        return
    store = open_store(where)
    try:
        yield StateBooks(store)
    finally:
        release_store(store)


def test_two_processes_together_spend_one_budget_and_use_it(
    place: tuple[str, str], tmp_path: Path
) -> None:
    go = tmp_path / "go"
    with opened(place) as books:  # made before either process opens them
        books.open("llm", Budget(max_cost=1.0))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, *place, str(go), "40"],
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
    with opened(place) as books:
        books.open("llm", Budget(max_cost=1.0))
        totals = books.totals("llm").snapshot()
    assert totals["held"]["calls"] == 0
    assert sum(sent) == totals["spent"]["calls"]
    # Never past $1.00 whatever is in flight ($0.10 each), and not stopped before $1.00 less
    # one worst case: a call waits for room held in flight instead of being refused.
    assert 0.9 - 1e-9 <= totals["spent"]["cost"] <= 1.0
    assert all(s > 0 for s in sent), sent


async def test_a_request_waits_for_room_another_process_holds(place: tuple[str, str]) -> None:
    with opened(place) as my_books, opened(place) as their_books:
        mine = SharedBudget(my_books, "x", Budget(max_cost=0.3))
        theirs = SharedBudget(their_books, "x", Budget(max_cost=0.3))
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
    assert snapshot["refused"] == 1
