"""`BudgetFile`: one budget spent by several processes of one machine through an SQLite file.

Real processes hold and settle against one file at once, through `SharedBudget` and the
budget's own `hold`; the file's books say whether they ever passed the budget together.
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
from plait.errors import FileError
from plait.resources.budget import WAIT, Budget, Claim, hold
from plait.resources.budget_file import BudgetFile
from plait.resources.shared_budget import BudgetStore, SharedBudget

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import asyncio, os, sys
from plait.backends.types import Usage
from plait.resources.budget import WAIT, Budget, Claim, hold
from plait.resources.budget_file import BudgetFile
from plait.resources.shared_budget import SharedBudget

async def main(path, go, calls):
    budget = SharedBudget(BudgetFile(path), "llm", Budget(max_cost=1.0))
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
    print(sent)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def test_two_processes_together_spend_one_budget_and_use_it(tmp_path: Path) -> None:
    path, go = tmp_path / "budget.db", tmp_path / "go"
    BudgetFile(path)  # made before either process opens it
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(path), str(go), "40"],
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
    books = BudgetFile(path).totals("llm").snapshot()
    assert books["held"]["calls"] == 0
    assert sum(sent) == books["spent"]["calls"]
    # Never past $1.00 whatever is in flight ($0.10 each), and not stopped before $1.00 less
    # one worst case: a call waits for room held in flight instead of being refused.
    assert 0.9 - 1e-9 <= books["spent"]["cost"] <= 1.0
    assert all(s > 0 for s in sent), sent


async def test_a_request_waits_for_room_another_process_holds(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    mine = SharedBudget(BudgetFile(path), "x", Budget(max_cost=0.3))
    theirs = SharedBudget(BudgetFile(path), "x", Budget(max_cost=0.3))  # another connection
    claim = Claim(tokens=10, cost=0.2)
    assert await hold([theirs], claim) is None
    waiting = asyncio.ensure_future(hold([mine], claim))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # $0.2 held + $0.2 > $0.3, but it fits once that settles
    theirs.settle(claim, Usage(1, 1, cost=0.05))  # no wake reaches `mine`: it looks again
    assert await asyncio.wait_for(waiting, 10) is None
    refusal = await hold([mine], Claim(tokens=10, cost=0.29))  # $0.05 spent: never fits
    assert refusal is not None and "leaves no room" in refusal.why
    snapshot = mine.snapshot()
    assert snapshot["spent"]["cost"] == pytest.approx(0.05)
    assert snapshot["held"]["cost"] == pytest.approx(0.2)
    assert snapshot["refused"] == 1


async def test_the_holds_of_a_process_that_died_are_charged_and_the_rest_fits(
    tmp_path: Path,
) -> None:
    dead: set[int] = set()
    path = tmp_path / "b.db"
    file = BudgetFile(path, alive=lambda pid: pid not in dead)
    budget = SharedBudget(file, "x", Budget(max_cost=1.0))
    other_file = BudgetFile(path)
    other_file.pid = 999_999_999  # another process's holds
    other = SharedBudget(other_file, "x", Budget(max_cost=1.0))
    for _ in range(3):
        assert await hold([other], Claim(10, 0.3)) is None
    dead.add(999_999_999)  # it dies with three requests in flight ($0.90 held)
    # $0.20 does not fit beside them; the dead process's holds are charged at their worst
    # case, so it is refused at once, as it can never fit, and $0.05 still fits.
    refusal = await asyncio.wait_for(hold([budget], Claim(10, 0.2)), 10)
    assert refusal is not None and "leaves no room" in refusal.why
    assert file.charged == 3
    assert await hold([budget], Claim(10, 0.05)) is None
    books = file.totals("x").snapshot()
    assert books["spent"]["cost"] == pytest.approx(0.9) and books["held"]["calls"] == 1


def test_a_store_shares_a_budget_and_leaves_none_alone(tmp_path: Path) -> None:
    store = BudgetStore(BudgetFile(tmp_path / "b.db"))
    assert store.share("manager", None) is None
    shared = store.share("endpoint:llm", Budget(max_cost=2.0))
    assert isinstance(shared, SharedBudget) and shared.max_cost == 2.0


def test_a_link_in_place_of_the_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.db"
    target.write_bytes(b"")
    (tmp_path / "budget.db").symlink_to(target)
    with pytest.raises(FileError, match=r"budget\.db"):
        BudgetFile(tmp_path / "budget.db")


async def test_a_reused_pid_does_not_keep_a_dead_process_holds(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    file = BudgetFile(path)
    budget = SharedBudget(file, "x", Budget(max_cost=1.0))
    other_file = BudgetFile(path)
    other_file.pid = os.getppid()  # a pid that runs, as a reused one does
    other_file.started = 1  # but the process holding it started at another time
    other = SharedBudget(other_file, "x", Budget(max_cost=1.0))
    for _ in range(3):
        assert await hold([other], Claim(10, 0.3)) is None
    refusal = await asyncio.wait_for(hold([budget], Claim(10, 0.2)), 10)
    assert refusal is not None and "leaves no room" in refusal.why
    assert file.charged == 3


async def test_a_busy_file_makes_a_hold_wait_and_keeps_the_settles(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "b.db"
    file = BudgetFile(path, busy_timeout=0.05)
    budget = SharedBudget(file, "x", Budget(max_cost=1.0))
    claim = Claim(10, 0.3)
    assert await hold([budget], claim) is None
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process writes, and takes its time
    budget.settle(claim, Usage(1, 1, cost=0.1))
    await asyncio.sleep(0.2)  # the flush found the file busy: the settle is kept
    assert budget.try_hold(Claim(10, 0.1)) is WAIT  # busy: it waits, the loop is not stalled
    other.execute("ROLLBACK")
    other.close()
    assert await asyncio.wait_for(hold([budget], Claim(10, 0.1)), 10) is None
    books = file.totals("x").snapshot()
    assert books["spent"]["cost"] == pytest.approx(0.1)  # the settle was written after all
    assert books["held"]["calls"] == 1
