"""`BudgetFile`: one budget spent by several processes of one machine through an SQLite file.

What only the file does: the holds of a dead process (its pid), a link in its place, a
busy file. What every kind of shared books does (processes spending together, a request
waiting for room another holds) is in test_shared_books.py.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from plait.backends.types import Usage
from plait.errors import FileError
from plait.resources.budget import WAIT, Budget, Claim, hold
from plait.resources.budget_file import BudgetFile
from plait.resources.shared_budget import BudgetStore, SharedBudget


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
