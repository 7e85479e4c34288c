"""Budgets shared by the processes of one machine, kept in one SQLite file.

``plait serve --workers N`` runs N processes that must spend one endpoint budget
between them, not N. Each budget is a row of the file (its limits and what was
spent), and what each process's requests in flight hold is a row per process. A
`SharedBudget` (`plait.resources.shared_budget`) asks the file for every hold:
``try_hold`` is one ``BEGIN IMMEDIATE`` transaction that reads the books of every
process and takes the hold only if the whole still fits, by the same rule as a budget
of one process (the books are loaded into a `Budget`, whose ``try_hold`` decides), so
together the processes never pass the budget. Settles are written together, once per
turn of the event loop (or with the next hold), so a request costs about one
transaction.

A request that does not fit while others are in flight waits: the budget wakes it when
a hold of its own process settles, and otherwise looks at the file again every
``poll`` seconds. A process that dies with requests in flight cannot settle them, and
they may well have been billed: the next process that finds the budget full charges
the holds of a process that no longer runs as spent, at their worst case, so the
budget stays a hard limit and what is left of it is used.

The file lives in a private folder the parent process makes (``tempfile.mkdtemp``,
mode 0700) and removes when the server stops, so it keeps one server's spending, as a
single process's totals do; it is checked to be no link before it is opened, as
plait's other SQLite files are. It holds numbers and names only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from plait import _files
from plait.backends.types import Usage
from plait.errors import FileError
from plait.resources.budget import WAIT, Budget, Claim

__all__ = ["BudgetFile", "books"]

_FORMAT = 2
"""The layout of the file (``PRAGMA user_version``; 2 notes when each holder started); another
is refused, never rewritten (the file lives as long as one server, which makes it)."""


def books(
    limits: tuple[int | None, int | None, float | None, bool],
    spent: tuple[int, int, float],
    held: tuple[int, int, float],
) -> Budget:
    """Returns a `Budget` holding these books, to decide or report by its rules.

    Args:
        limits: ``max_calls``, ``max_tokens``, ``max_cost`` and ``unpriced_free``.
        spent: calls, tokens and dollars of settled requests.
        held: calls, tokens and dollars held by requests in flight.
    """
    max_calls, max_tokens, max_cost, unpriced_free = limits
    budget = Budget(max_calls, max_tokens, max_cost, unpriced_free=bool(unpriced_free))
    budget.calls = spent[0] + held[0]  # a budget counts a call in flight as spent
    budget.input_tokens = spent[1]
    budget.cost = spent[2]
    budget._held_calls, budget._held_tokens, budget._held_cost = held
    return budget


class BudgetFile:
    """Budgets in one SQLite file, shared by every process that opens it (see the module doc).

    Args:
        path: the file (in a private folder; created when missing).
        poll: seconds between looks at the file while a request waits for room.
        busy_timeout: seconds to wait for another process's transaction. A hold waits on
            the event loop (a transaction is a few lookups, well under a millisecond), so
            this bounds how long one busy file can stall the loop: past it the request
            waits as for room and looks again after ``poll``.
        alive: tells whether a process id still runs (tests may inject one).

    Raises:
        FileError: the path is a link or not a regular file, or holds something else.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        poll: float = 0.01,
        busy_timeout: float = 1.0,
        alive: Callable[[int], bool] | None = None,
    ) -> None:
        self.path = Path(path)
        self.poll = poll
        self.pid = os.getpid()
        self.started = _started(self.pid)
        """When this process started (so a later process given its pid is not taken for it)."""
        self._alive = alive or _alive
        self._db = self._open(busy_timeout)
        self._ends: list[tuple[str, Claim, tuple[int, int, float] | None]] = []
        """Settles and releases not written yet: ``(name, claim, (calls, tokens, cost))``."""
        self._applied: list[tuple[str, Claim, tuple[int, int, float] | None]] = []
        """Those of the open transaction: put back to ``_ends`` if it rolls back."""
        self._in_line: set[str] = set()
        """The budgets in whose line of waiting processes this process stands."""
        self.transactions = 0
        """Transactions this process made (a hold per request; settles go together)."""
        self.charged = 0
        """Holds of dead processes this process charged as spent."""

    def _open(self, busy_timeout: float) -> sqlite3.Connection:
        companions = (self.path.with_name(self.path.name + end) for end in ("-wal", "-shm"))
        try:
            _files.check_no_links(self.path, *companions)
            db = sqlite3.connect(self.path, timeout=busy_timeout, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            if isinstance(exc, FileError):
                raise
            raise FileError(f"budget file {self.path} cannot be opened: {exc}") from None
        try:
            db.execute("PRAGMA journal_mode=WAL")
            # The file lives as long as the server: a crash of the machine loses nothing.
            db.execute("PRAGMA synchronous=OFF")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, _FORMAT):
                raise sqlite3.DatabaseError(f"format {version}; this plait reads {_FORMAT}")
            db.executescript(
                """
                CREATE TABLE IF NOT EXISTS budgets (
                    name TEXT PRIMARY KEY, max_calls INTEGER, max_tokens INTEGER,
                    max_cost REAL, unpriced_free INTEGER NOT NULL, calls INTEGER NOT NULL,
                    tokens INTEGER NOT NULL, cost REAL NOT NULL);
                CREATE TABLE IF NOT EXISTS holds (
                    name TEXT NOT NULL, pid INTEGER NOT NULL, calls INTEGER NOT NULL,
                    tokens INTEGER NOT NULL, cost REAL NOT NULL, started INTEGER,
                    PRIMARY KEY (name, pid));
                CREATE TABLE IF NOT EXISTS waiting (
                    name TEXT NOT NULL, pid INTEGER NOT NULL, since REAL NOT NULL,
                    seen REAL NOT NULL, PRIMARY KEY (name, pid));
                """
            )
            db.execute(f"PRAGMA user_version={_FORMAT}")
        except sqlite3.Error as exc:
            db.close()
            raise FileError(f"budget file {self.path} is not usable ({exc})") from None
        return db

    def open(self, name: str, budget: Budget) -> None:
        """Makes budget ``name`` with ``budget``'s limits unless a process made it already."""
        limits = (budget.max_calls, budget.max_tokens, budget.max_cost, budget.unpriced_free)
        self._db.execute(
            "INSERT OR IGNORE INTO budgets VALUES (?, ?, ?, ?, ?, 0, 0, 0.0)", (name, *limits)
        )

    def try_hold(self, name: str, claim: Claim, waiting: int = 0) -> object | str | None:
        """Holds ``claim`` in budget ``name`` if every process's books leave room now.

        Processes take turns at room that comes back: while requests of others wait, a
        process whose requests have waited longer goes first (``waiting``: how many more
        requests of this process wait besides this one).

        Returns:
            As `Budget.try_hold`: None when held, `WAIT`, or why it can never fit.
        """
        try:
            return self._try_hold(name, claim, waiting)
        except sqlite3.OperationalError as exc:  # busy past busy_timeout: look again later
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            return WAIT

    def _try_hold(self, name: str, claim: Claim, waiting: int) -> object | str | None:
        with self._transaction() as db:
            self._apply_ends(db)
            verdict = self._books(db, name).try_hold(claim)
            if verdict is WAIT and self._charge_the_dead(db, name):
                verdict = self._books(db, name).try_hold(claim)
            now = time.monotonic()
            if verdict is None and self._behind(db, name, now):
                verdict = WAIT
            if verdict is WAIT:
                db.execute(
                    "INSERT INTO waiting VALUES (?, ?, ?, ?) ON CONFLICT (name, pid) DO UPDATE "
                    "SET seen = excluded.seen",
                    (name, self.pid, now, now),
                )
                self._in_line.add(name)
                return verdict
            if verdict is None:
                db.execute(
                    "INSERT INTO holds VALUES (?, ?, 1, ?, ?, ?) ON CONFLICT (name, pid) "
                    "DO UPDATE SET calls = calls + 1, tokens = tokens + excluded.tokens, "
                    "cost = cost + excluded.cost",
                    (name, self.pid, claim.tokens, claim.cost or 0.0, self.started),
                )
            if name in self._in_line:
                self._leave_line(db, name, now, waiting)
        return verdict

    def _leave_line(self, db: sqlite3.Connection, name: str, now: float, waiting: int) -> None:
        """Ends this process's turn in the line of budget ``name``: to the back of it while
        more of its requests wait, else out of it."""
        if waiting:
            db.execute(
                "UPDATE waiting SET since = ?, seen = ? WHERE name = ? AND pid = ?",
                (now, now, name, self.pid),
            )
        else:
            db.execute("DELETE FROM waiting WHERE name = ? AND pid = ?", (name, self.pid))
            self._in_line.discard(name)

    def _behind(self, db: sqlite3.Connection, name: str, now: float) -> bool:
        """Whether another process's requests have waited longer than this one's (a process
        whose waiting requests have not looked for a while has none left)."""
        mine = db.execute(
            "SELECT since FROM waiting WHERE name = ? AND pid = ?", (name, self.pid)
        ).fetchone()
        first = db.execute(
            "SELECT min(since) FROM waiting WHERE name = ? AND pid != ? AND seen > ?",
            (name, self.pid, now - 5 * self.poll - 0.05),
        ).fetchone()[0]
        return first is not None and (mine is None or first < mine[0])

    def settle(self, name: str, claim: Claim, usage: Usage | None) -> None:
        """Replaces a hold by what its request spent (None: failed, nothing billed; the call
        counts either way).

        Settles and releases are written together: in the next transaction of this
        process, or at the end of this turn of its event loop, whichever comes first. Until
        then the hold stays whole, so a late write only gives room back later.
        """
        spent = (
            (0, 0.0) if usage is None else (usage.input_tokens + usage.output_tokens, usage.cost)
        )
        self._end(name, claim, (1, *spent))

    def release(self, name: str, claim: Claim) -> None:
        """Gives back the hold of a request that was never sent (written as `settle` is)."""
        self._end(name, claim, None)

    def add(self, name: str, usage: Usage) -> None:
        """Counts usage spent without a hold (a provider batch job)."""
        with self._transaction() as db:
            self._apply_ends(db)
            self._spend(db, name, 0, usage.input_tokens + usage.output_tokens, usage.cost)

    def _end(self, name: str, claim: Claim, spent: tuple[int, int, float] | None) -> None:
        self._ends.append((name, claim, spent))
        if len(self._ends) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop: write it now
                self.flush()

    def flush(self) -> None:
        """Writes the settles and releases not written yet; when the file stays busy past
        the busy timeout, they are kept and tried again after ``poll``."""
        if not self._ends:
            return
        try:
            with self._transaction() as db:
                self._apply_ends(db)
        except sqlite3.OperationalError:
            with contextlib.suppress(RuntimeError):  # no loop: the next transaction writes them
                asyncio.get_running_loop().call_later(self.poll, self.flush)

    def _apply_ends(self, db: sqlite3.Connection) -> None:
        ends, self._ends = self._ends, []
        self._applied += ends
        for name, claim, spent in ends:
            self._unhold(db, name, claim)
            if spent is not None:
                self._spend(db, name, *spent)

    def totals(self, name: str) -> Budget:
        """Returns the books of budget ``name`` across every process, as a `Budget`."""
        with self._transaction() as db:
            self._apply_ends(db)
            return self._books(db, name)

    def close(self) -> None:
        """Writes what is left to write and closes the file."""
        self.flush()
        self._db.close()

    # -- inside a transaction -------------------------------------------------------------

    def _transaction(self) -> _Transaction:
        self.transactions += 1
        return _Transaction(self)

    def _books(self, db: sqlite3.Connection, name: str) -> Budget:
        row = db.execute(
            "SELECT max_calls, max_tokens, max_cost, unpriced_free, calls, tokens, cost "
            "FROM budgets WHERE name = ?",
            (name,),
        ).fetchone()
        if row is None:
            raise FileError(f"budget file {self.path}: no budget {name!r}; it was not opened")
        held = db.execute(
            "SELECT total(calls), total(tokens), total(cost) FROM holds WHERE name = ?", (name,)
        ).fetchone()
        return books(row[:4], row[4:], (int(held[0]), int(held[1]), held[2]))

    def _unhold(self, db: sqlite3.Connection, name: str, claim: Claim) -> None:
        db.execute(
            "UPDATE holds SET calls = calls - 1, tokens = tokens - ?, cost = cost - ? "
            "WHERE name = ? AND pid = ?",
            (claim.tokens, claim.cost or 0.0, name, self.pid),
        )
        # No float dust once nothing of this process is in flight.
        db.execute("DELETE FROM holds WHERE name = ? AND pid = ? AND calls <= 0", (name, self.pid))

    def _spend(
        self, db: sqlite3.Connection, name: str, calls: int, tokens: int, cost: float
    ) -> None:
        db.execute(
            "UPDATE budgets SET calls = calls + ?, tokens = tokens + ?, cost = cost + ? "
            "WHERE name = ?",
            (calls, tokens, cost, name),
        )

    def _charge_the_dead(self, db: sqlite3.Connection, name: str) -> bool:
        """Charges the holds of processes that no longer run as spent; True if there were."""
        rows = db.execute(
            "SELECT pid, calls, tokens, cost, started FROM holds WHERE name = ? AND pid != ?",
            (name, self.pid),
        ).fetchall()
        # a pid that runs may be another process's now: it counts only if it started then
        dead = [row for row in rows if not self._alive(row[0]) or _reused(row[0], row[4])]
        for pid, calls, tokens, cost, _ in dead:
            self._spend(db, name, calls, tokens, cost)
            db.execute("DELETE FROM holds WHERE name = ? AND pid = ?", (name, pid))
            self.charged += calls
        return bool(dead)


class _Transaction:
    """``BEGIN IMMEDIATE`` (the write lock first, so no two processes decide at once) …
    ``COMMIT``, or ``ROLLBACK`` on any error, the settles it was writing kept for the next."""

    __slots__ = ("_file",)

    def __init__(self, file: BudgetFile) -> None:
        self._file = file

    def __enter__(self) -> sqlite3.Connection:
        self._file._db.execute("BEGIN IMMEDIATE")
        self._file._applied = []
        return self._file._db

    def __exit__(self, kind: object, *rest: object) -> None:
        file, applied = self._file, self._file._applied
        file._applied = []
        if kind is None:
            file._db.execute("COMMIT")
            return
        file._db.execute("ROLLBACK")
        file._ends[:0] = applied


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it runs, as another user
    return True


def _started(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux's ``/proc``), or None
    where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        return int(fields[19])  # field 22 of the line; the name before ")" may hold spaces
    except (OSError, IndexError, ValueError):
        return None


def _reused(pid: int, started: int | None) -> bool:
    """Whether ``pid`` now names another process than the one that started at ``started``."""
    if started is None:
        return False
    now = _started(pid)
    return now is not None and now != started
