"""Runs that wait for a person's approval, kept until someone answers them or they expire.

A run that pauses for confirmation is answered with its pending calls and a run id; what is
needed to resume it later (the program's name, the request's inputs and the sealed pause) is a
`PendingRun` put in the server's `PendingStore`. Two stores implement it:

- `SQLitePendingStore`, what ``plait serve`` uses: one SQLite file, so paused runs survive a
  restart and every worker process sees the same runs; ``take`` deletes the row in a
  transaction, so of several processes resuming one run, exactly one gets it. The same file is
  the server's approval ledger (`use`), so an approval used once is refused after a restart too.
- `MemoryPendingStore`, the default of `plait.serve.app`: this process's memory.

Both are bounded: a run's stored state may be at most ``max_state_bytes`` (a larger one is
refused when it pauses: `PendingRunTooLarge`), and a run nobody answers expires after ``ttl``
seconds. A store remembers, for as long again, why a run it no longer holds is gone
(``"resumed"`` or ``"expired"``), so a second resume is told so rather than "unknown".

The pause itself is sealed (`plait.confirmation`), so a store holds data a client could not
forge; the server checks the seal again when it reads a run back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from plait import _files
from plait import _jsontext as jsontext
from plait.errors import FileError, PlaitError

__all__ = [
    "DEFAULT_MAX_STATE_BYTES",
    "DEFAULT_TTL",
    "Gone",
    "MemoryPendingStore",
    "PendingRun",
    "PendingRunTooLarge",
    "PendingStore",
    "SQLitePendingStore",
]

logger = logging.getLogger("plait.serve")

DEFAULT_TTL = 86_400.0
"""Seconds a paused run waits for its answer (a day) before it expires."""

DEFAULT_MAX_STATE_BYTES = 4 * 1_048_576
"""Largest stored state of one paused run (its inputs and pause as JSON text)."""

Gone = Literal["resumed", "expired"]
"""Why a run a store no longer holds is gone."""


class PendingRunTooLarge(PlaitError):
    """A paused run's state is larger than the store keeps, so it cannot be resumed later."""


@dataclass(frozen=True)
class PendingRun:
    """A paused run, as stored until it is resumed.

    Attributes:
        run_id: the id the client was given.
        program: the name the program is served under.
        inputs: the request's inputs (JSON data, as validated); the resume runs with them.
        pause: the sealed pause (`ConfirmationRequired.to_dict`).
        created: when it paused (``time.time()``).
    """

    run_id: str
    program: str
    inputs: dict[str, Any]
    pause: dict[str, Any]
    created: float = field(default_factory=time.time)

    def state_text(self) -> tuple[str, str]:
        """Returns the inputs and the pause as JSON text, as a store keeps them."""
        return (
            json.dumps(self.inputs, ensure_ascii=False, separators=(",", ":")),
            json.dumps(self.pause, ensure_ascii=False, separators=(",", ":")),
        )


class PendingStore(Protocol):
    """Where paused runs wait. Implement it to keep them elsewhere (a database, a service)."""

    async def put(self, run: PendingRun) -> None:
        """Keeps ``run`` under its ``run_id``.

        Raises:
            PendingRunTooLarge: its state is over the store's limit.
        """

    async def get(self, run_id: str) -> PendingRun | None:
        """Returns the run, or None when none waits (never paused, taken, or expired)."""

    async def take(self, run_id: str) -> PendingRun | None:
        """Removes and returns the run; of concurrent callers, exactly one gets it."""

    async def gone(self, run_id: str) -> Gone | None:
        """Why a run that does not wait is gone, when the store still remembers; else None."""

    async def aclose(self) -> None:
        """Releases what the store holds open (called when the server stops)."""


def _check_size(run: PendingRun, limit: int) -> tuple[str, str]:
    """Returns the run's state as text, refusing one over ``limit`` bytes."""
    inputs, pause = run.state_text()
    size = len(inputs.encode()) + len(pause.encode())
    if size > limit:
        raise PendingRunTooLarge(
            f"the paused run's state is {size} bytes, over this server's limit of {limit} "
            "(max_pending_bytes, --max-pending-bytes); raise it, or keep conversations shorter"
        )
    return inputs, pause


def _check_bounds(ttl: float, max_state_bytes: int) -> None:
    if ttl <= 0:
        raise ValueError(f"a pending run's ttl must be > 0 seconds, got {ttl}")
    if max_state_bytes < 1:
        raise ValueError(f"max_state_bytes must be positive, got {max_state_bytes}")


class MemoryPendingStore:
    """Paused runs in this process's memory: lost when it stops, bounded in number and age.

    Args:
        max_runs: runs kept; past it the oldest is forgotten (and logged), so a flood of
            paused runs no one answers cannot grow the server without bound.
        ttl: seconds a run waits before it expires.
        max_state_bytes: largest state of one run.
    """

    def __init__(
        self,
        max_runs: int = 10_000,
        *,
        ttl: float = DEFAULT_TTL,
        max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    ) -> None:
        if max_runs < 1:
            raise ValueError(f"max_runs must be at least 1, got {max_runs}")
        _check_bounds(ttl, max_state_bytes)
        self.max_runs = max_runs
        self.ttl = ttl
        self.max_state_bytes = max_state_bytes
        self._runs: OrderedDict[str, PendingRun] = OrderedDict()
        self._gone: OrderedDict[str, Gone] = OrderedDict()

    async def put(self, run: PendingRun) -> None:
        _check_size(run, self.max_state_bytes)
        self._runs[run.run_id] = run
        while len(self._runs) > self.max_runs:
            forgotten, _ = self._runs.popitem(last=False)
            logger.warning(
                "pending run %s forgotten: more than %d runs wait for approval",
                forgotten,
                self.max_runs,
            )

    async def get(self, run_id: str) -> PendingRun | None:
        run = self._runs.get(run_id)
        if run is not None and time.time() - run.created > self.ttl:
            self._forget(run_id, "expired")
            return None
        return run

    async def take(self, run_id: str) -> PendingRun | None:
        run = await self.get(run_id)
        if run is not None:
            self._forget(run_id, "resumed")
        return run

    async def gone(self, run_id: str) -> Gone | None:
        await self.get(run_id)  # an expired run is noted as such
        return self._gone.get(run_id)

    def _forget(self, run_id: str, why: Gone) -> None:
        del self._runs[run_id]
        self._gone[run_id] = why
        while len(self._gone) > self.max_runs:
            self._gone.popitem(last=False)

    async def aclose(self) -> None:
        self._runs.clear()
        self._gone.clear()

    def __len__(self) -> int:
        return len(self._runs)


_FORMAT = 1
"""The layout of the file (``PRAGMA user_version``); another is refused, never rewritten."""

_TABLES = ("pending_runs", "gone_runs", "used_approvals")


class SQLitePendingStore:
    """Paused runs in one SQLite file: they survive restarts and are shared by processes.

    The file is opened as plait opens its own files: a symbolic link or other non-regular
    file at the path (or at its ``-wal`` / ``-shm`` companions) is refused, never followed.
    ``take`` deletes the run's row in a transaction, so across threads and processes one
    caller gets it. The store is also an approval ledger (`use`): install it with
    `plait.confirmation.set_approval_ledger` (the server does) and a used approval stays
    used across restarts, as long as the file is kept.

    Args:
        path: the file (created with its directory when missing).
        ttl: seconds a run waits before it expires; a resumed or expired run is remembered
            for as long again, then forgotten.
        max_state_bytes: largest state of one run.
        busy_timeout: seconds to wait for another process's write.

    Raises:
        FileError: the path is a link or not a regular file, cannot be opened, or holds
            something other than this store.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        ttl: float = DEFAULT_TTL,
        max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
        busy_timeout: float = 5.0,
    ) -> None:
        _check_bounds(ttl, max_state_bytes)
        self.path = Path(path)
        self.ttl = ttl
        self.max_state_bytes = max_state_bytes
        self._lock = threading.Lock()
        self._db = self._open(busy_timeout)

    def _open(self, busy_timeout: float) -> sqlite3.Connection:
        companions = (self.path.with_name(self.path.name + end) for end in ("-wal", "-shm"))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _files.check_no_links(self.path, *companions)
            db = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            if isinstance(exc, FileError):
                raise
            raise FileError(f"pending runs file {self.path} cannot be opened: {exc}") from None
        try:
            self._prepare(db)
        except sqlite3.Error as exc:
            db.close()
            raise FileError(
                f"pending runs file {self.path} is not usable ({exc}); give --pending-db "
                "another path, or move that file away"
            ) from None
        return db

    def _prepare(self, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA journal_mode=WAL")  # reads the header: garbage fails here
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, _FORMAT):
            raise sqlite3.DatabaseError(f"it is in format {version}; this plait reads {_FORMAT}")
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables - set(_TABLES):
            names = ", ".join(sorted(tables))
            raise sqlite3.DatabaseError(f"it is an SQLite database of something else ({names})")
        db.executescript(
            """
            CREATE TABLE IF NOT EXISTS pending_runs (
                run_id TEXT PRIMARY KEY, program TEXT NOT NULL, inputs TEXT NOT NULL,
                pause TEXT NOT NULL, created REAL NOT NULL);
            CREATE TABLE IF NOT EXISTS gone_runs (
                run_id TEXT PRIMARY KEY, why TEXT NOT NULL, at REAL NOT NULL);
            CREATE TABLE IF NOT EXISTS used_approvals (
                approval_id TEXT PRIMARY KEY, at REAL NOT NULL);
            """
        )
        db.execute(f"PRAGMA user_version={_FORMAT}")

    # -- the store ------------------------------------------------------------------------

    async def put(self, run: PendingRun) -> None:
        inputs, pause = _check_size(run, self.max_state_bytes)
        row = (run.run_id, run.program, inputs, pause, run.created)
        await self._in_thread(self._put, row)

    def _put(self, db: sqlite3.Connection, row: tuple[Any, ...]) -> None:
        self._expire(db)
        db.execute("INSERT OR REPLACE INTO pending_runs VALUES (?, ?, ?, ?, ?)", row)

    async def get(self, run_id: str) -> PendingRun | None:
        return await self._in_thread(self._get, run_id)

    def _get(self, db: sqlite3.Connection, run_id: str) -> PendingRun | None:
        self._expire(db)
        row = db.execute("SELECT * FROM pending_runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else self._run_of(row)

    async def take(self, run_id: str) -> PendingRun | None:
        return await self._in_thread(self._take, run_id)

    def _take(self, db: sqlite3.Connection, run_id: str) -> PendingRun | None:
        self._expire(db)
        db.execute("BEGIN IMMEDIATE")  # the write lock first: one process deletes the row
        try:
            row = db.execute(
                "DELETE FROM pending_runs WHERE run_id = ? RETURNING *", (run_id,)
            ).fetchone()
            if row is not None:
                db.execute(
                    "INSERT OR REPLACE INTO gone_runs VALUES (?, 'resumed', ?)",
                    (run_id, time.time()),
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return None if row is None else self._run_of(row)

    async def gone(self, run_id: str) -> Gone | None:
        return await self._in_thread(self._gone, run_id)

    def _gone(self, db: sqlite3.Connection, run_id: str) -> Gone | None:
        self._expire(db)
        row = db.execute("SELECT why FROM gone_runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else row[0]

    def _expire(self, db: sqlite3.Connection) -> None:
        """Moves runs past their ttl to the gone ones; forgets gone ones after as long again."""
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "INSERT OR REPLACE INTO gone_runs SELECT run_id, 'expired', ? FROM pending_runs "
                "WHERE created < ?",
                (now, now - self.ttl),
            )
            db.execute("DELETE FROM pending_runs WHERE created < ?", (now - self.ttl,))
            db.execute("DELETE FROM gone_runs WHERE at < ?", (now - self.ttl,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _run_of(self, row: tuple[Any, ...]) -> PendingRun:
        run_id, program, inputs, pause, created = row
        try:
            state = jsontext.loads(inputs), jsontext.loads(pause)
        except ValueError as exc:
            raise FileError(
                f"pending runs file {self.path}: the run {run_id} is not JSON ({exc}); the "
                "file was changed by something other than plait"
            ) from None
        return PendingRun(run_id, program, *state, created)

    # -- the approval ledger --------------------------------------------------------------

    def use(self, approval_id: str) -> bool:
        """Records an approval as used; False when it was used before (in any process)."""
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO used_approvals VALUES (?, ?)", (approval_id, time.time())
                )
            except sqlite3.IntegrityError:
                return False
        return True

    # -- lifetime -------------------------------------------------------------------------

    async def _in_thread(self, work: Any, *args: Any) -> Any:
        """Runs ``work(db, *args)`` on a worker thread: a busy file never blocks the loop."""

        def locked() -> Any:
            with self._lock:
                return work(self._db, *args)

        return await asyncio.to_thread(locked)

    async def aclose(self) -> None:
        with self._lock:
            self._db.close()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM pending_runs").fetchone()[0])
