"""Runs that wait for a person's approval, kept until someone answers them or they expire.

A run that pauses for confirmation is answered with its pending calls and a run id; what is
needed to resume it later (the program's name, the request's inputs, the sealed pause and who
started it) is a `PendingRun` put in the server's `PendingStore`. Two stores implement it:

- `SQLitePendingStore`, what ``plait serve`` uses: one SQLite file, so paused runs survive a
  restart and every worker process sees the same runs; ``take`` deletes the row in a
  transaction, so of several processes resuming one run, exactly one gets it. The same file is
  the server's approval ledger (`use`), so an approval used once is refused after a restart too.
- `MemoryPendingStore`, the default of `plait.serve.app`: this process's memory.
- `plait.serve.pending_state.StatePendingStore`, when the server is given a state store:
  its ``pauses`` table, shared by every process and replica using it (they keep the rules
  of this module: `read_run`, the size and room checks).

Both are bounded: a run's stored state may be at most ``max_state_bytes`` (a larger one is
refused when it pauses: `PendingRunTooLarge`), at most ``max_runs`` wait at once and at most
``max_per_owner`` of one API key (a pause past either is refused: `PendingStoreFull`), and a run
nobody answers expires after ``ttl`` seconds. A store remembers, for as long again, why a run it
no longer holds is gone (``"resumed"`` or ``"expired"``) and whose it was, so a second resume
is told so rather than "unknown".

A run's inputs are kept as a client sends them (`PendingRun.inputs`): an image, audio clip or
document as its ``data:`` URI (its bytes) or its URL, so the resume runs on the same bytes; the
pause records their hashes under its seal, so bytes changed in the store are refused.

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
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

from plait import _files
from plait import _jsontext as jsontext
from plait.errors import FileError, PlaitError

__all__ = [
    "DEFAULT_MAX_PER_OWNER",
    "DEFAULT_MAX_RUNS",
    "DEFAULT_MAX_STATE_BYTES",
    "DEFAULT_TTL",
    "Gone",
    "GoneRun",
    "MemoryPendingStore",
    "PendingRun",
    "PendingRunTooLarge",
    "PendingStore",
    "PendingStoreFull",
    "PendingStoreUnavailable",
    "SQLitePendingStore",
    "read_run",
]

logger = logging.getLogger("plait.serve")

DEFAULT_TTL = 86_400.0
"""Seconds a paused run waits for its answer (a day) before it expires."""

DEFAULT_MAX_STATE_BYTES = 4 * 1_048_576
"""Largest stored state of one paused run (its inputs and pause as JSON text)."""

DEFAULT_MAX_RUNS = 1_000
"""Paused runs a store keeps at once, of every key together."""

DEFAULT_MAX_PER_OWNER = 100
"""Paused runs a store keeps at once for one API key."""

Gone = Literal["resumed", "expired"]
"""Why a run a store no longer holds is gone."""


class GoneRun(NamedTuple):
    """A run a store no longer holds, while it remembers it: why it is gone, and whose it was."""

    why: Gone
    owner: str | None


class PendingRunTooLarge(PlaitError):
    """A paused run's state is larger than the store keeps, so it cannot be resumed later."""


class PendingStoreUnavailable(PlaitError):
    """The store of paused runs does not answer now (a database down or restarting): a run
    is neither found nor taken, so it waits on; the client retries (503)."""


class PendingStoreFull(PlaitError):
    """The store keeps as many paused runs as it may (of this key, or of all), so a new pause
    cannot be kept; nothing of it was approved or run.

    Attributes:
        per_owner: True when the caller's own runs fill its share (``max_per_owner``), False
            when the store as a whole is full (``max_runs``).
    """

    def __init__(self, message: str, *, per_owner: bool) -> None:
        super().__init__(message)
        self.per_owner = per_owner


@dataclass(frozen=True)
class PendingRun:
    """A paused run, as stored until it is resumed.

    Attributes:
        run_id: the id the client was given.
        program: the name the program is served under.
        inputs: the request's inputs as JSON data, as a client sends them (media as their
            ``data:`` URI or URL); the resume validates them again and runs with them.
        pause: the sealed pause (`ConfirmationRequired.to_dict`).
        created: when it paused (``time.time()``).
        owner: the fingerprint of the API key that started it (`plait.serve.owners`; never
            the key), or None on a server without keys; only that key reads or resumes it.
    """

    run_id: str
    program: str
    inputs: dict[str, Any]
    pause: dict[str, Any]
    created: float = field(default_factory=time.time)
    owner: str | None = None

    def state_text(self) -> tuple[str, str]:
        """Returns the inputs and the pause as JSON text, as a store keeps them."""
        return (
            json.dumps(self.inputs, ensure_ascii=False, separators=(",", ":")),
            json.dumps(self.pause, ensure_ascii=False, separators=(",", ":")),
        )


class PendingStore(Protocol):
    """Where paused runs wait. Implement it to keep them elsewhere (a database, a service).

    A store keeps runs by id and hands each out once; who may see a run (its ``owner``) is
    the server's to check, not the store's.
    """

    async def put(self, run: PendingRun) -> None:
        """Keeps ``run`` under its ``run_id``.

        Raises:
            PendingRunTooLarge: its state is over the store's limit.
            PendingStoreFull: the store, or ``run.owner``'s share of it, is full.
        """

    async def get(self, run_id: str) -> PendingRun | None:
        """Returns the run, or None when none waits (never paused, taken, or expired)."""

    async def take(self, run_id: str) -> PendingRun | None:
        """Removes and returns the run; of concurrent callers, exactly one gets it."""

    async def restore(self, run: PendingRun) -> None:
        """Puts back a run `take` returned, as it was (its ``created`` unchanged, so its
        expiry too), and forgets that it was resumed: its resume failed before its approval
        was used. It takes back the place it had, so the bounds are not checked."""

    async def gone(self, run_id: str) -> GoneRun | None:
        """Why a run that does not wait is gone, and whose it was, when the store still
        remembers; else None."""

    async def aclose(self) -> None:
        """Releases what the store holds open (called when the server stops)."""


def _check_size(run: PendingRun, limit: int) -> tuple[str, str]:
    """Returns the run's state as text, refusing one over ``limit`` bytes."""
    inputs, pause = run.state_text()
    size = len(inputs.encode()) + len(pause.encode())
    if size > limit:
        raise PendingRunTooLarge(
            f"the paused run's state is {size} bytes (its inputs, media included, and its "
            f"conversation), over this server's limit of {limit} (max_pending_bytes, "
            "--max-pending-bytes); raise it, or send smaller inputs or shorter conversations"
        )
    return inputs, pause


def _check_room(total: int, of_owner: int, owner: str | None, bounds: _Bounds) -> None:
    """Refuses a new run when ``total`` runs wait already, or ``of_owner`` of its owner's.

    Raises:
        PendingStoreFull: naming the bound, and what to do.
    """
    if owner is not None and of_owner >= bounds.max_per_owner:
        raise PendingStoreFull(
            f"this API key has {of_owner} runs waiting for approval, the most this server "
            f"keeps per key (max_pending_per_key, --max-pending-per-key); answer or let some "
            "expire, then run again",
            per_owner=True,
        )
    if total >= bounds.max_runs:
        raise PendingStoreFull(
            f"{total} runs wait for approval, the most this server keeps (max_pending_runs, "
            "--max-pending-runs); retry later, or ask its operator to raise the bound",
            per_owner=False,
        )


def read_run(
    run_id: str,
    program: str,
    owner: str | None,
    created: float,
    size: int,
    inputs: str | None,
    pause: str | None,
    *,
    limit: int,
) -> PendingRun:
    """Reads a stored run back, refusing a state over ``limit`` bytes (measured, never
    parsed: ``inputs`` and ``pause`` may then be None) and any that is not a JSON object
    of bounded depth: what a store holds is data, never code.

    Raises:
        ValueError: naming the run, and what is wrong.
    """
    if size > limit or inputs is None or pause is None:
        raise ValueError(
            f"the run {run_id} holds {size} bytes, over this server's limit of {limit} "
            "(--max-pending-bytes); serve with the limit it was kept under"
        )
    try:
        state = jsontext.loads(inputs), jsontext.loads(pause)
    except ValueError as exc:
        raise ValueError(f"the run {run_id} is not JSON ({exc}); it was changed") from None
    if not all(isinstance(part, dict) for part in state):
        raise ValueError(f"the run {run_id} holds no JSON object; it was changed")
    return PendingRun(run_id, program, *state, created, owner)


@dataclass(frozen=True)
class _Bounds:
    ttl: float
    max_state_bytes: int
    max_runs: int
    max_per_owner: int

    def __post_init__(self) -> None:
        if self.ttl <= 0:
            raise ValueError(f"a pending run's ttl must be > 0 seconds, got {self.ttl}")
        for name in ("max_state_bytes", "max_runs", "max_per_owner"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class MemoryPendingStore:
    """Paused runs in this process's memory: lost when it stops, bounded in number and age.

    Args:
        max_runs: runs kept at once; a pause past it is refused (`PendingStoreFull`).
        ttl: seconds a run waits before it expires.
        max_state_bytes: largest state of one run.
        max_per_owner: runs of one API key kept at once (runs without an owner count only
            towards ``max_runs``).
    """

    def __init__(
        self,
        max_runs: int = DEFAULT_MAX_RUNS,
        *,
        ttl: float = DEFAULT_TTL,
        max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
        max_per_owner: int = DEFAULT_MAX_PER_OWNER,
    ) -> None:
        self._bounds = _Bounds(ttl, max_state_bytes, max_runs, max_per_owner)
        self.max_runs = max_runs
        self.max_per_owner = max_per_owner
        self.ttl = ttl
        self.max_state_bytes = max_state_bytes
        self._runs: OrderedDict[str, PendingRun] = OrderedDict()
        self._owned: Counter[str | None] = Counter()
        self._gone: OrderedDict[str, GoneRun] = OrderedDict()

    async def put(self, run: PendingRun) -> None:
        _check_size(run, self.max_state_bytes)
        if run.run_id in self._runs:  # kept again: its place is its own
            self._drop(run.run_id)
        elif len(self._runs) >= self.max_runs or (
            run.owner is not None and self._owned[run.owner] >= self.max_per_owner
        ):
            self._expire_all()
            _check_room(len(self._runs), self._owned[run.owner], run.owner, self._bounds)
        self._keep(run)

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

    async def restore(self, run: PendingRun) -> None:
        self._gone.pop(run.run_id, None)
        if run.run_id in self._runs:
            self._drop(run.run_id)
        self._keep(run)

    async def gone(self, run_id: str) -> GoneRun | None:
        await self.get(run_id)  # an expired run is noted as such
        return self._gone.get(run_id)

    def _keep(self, run: PendingRun) -> None:
        self._runs[run.run_id] = run
        self._owned[run.owner] += 1

    def _drop(self, run_id: str) -> PendingRun:
        run = self._runs.pop(run_id)
        self._owned[run.owner] -= 1
        if not self._owned[run.owner]:
            del self._owned[run.owner]
        return run

    def _expire_all(self) -> None:
        """Notes every run past its ttl as expired (when a bound is reached: runs are
        otherwise found expired as they are asked for)."""
        old = time.time() - self.ttl
        for run_id in [run_id for run_id, run in self._runs.items() if run.created < old]:
            self._forget(run_id, "expired")

    def _forget(self, run_id: str, why: Gone) -> None:
        run = self._drop(run_id)
        self._gone[run_id] = GoneRun(why, run.owner)
        while len(self._gone) > self.max_runs:
            self._gone.popitem(last=False)

    async def aclose(self) -> None:
        self._runs.clear()
        self._owned.clear()
        self._gone.clear()

    def __len__(self) -> int:
        return len(self._runs)


_FORMAT = 2
"""The layout of the file (``PRAGMA user_version``): 2 keeps each run's owner; a file of
format 1 (plait before owners were kept) is brought to 2 when opened, its runs without an
owner; another is refused, never rewritten."""

_TABLES = ("pending_runs", "gone_runs", "used_approvals")


class SQLitePendingStore:
    """Paused runs in one SQLite file: they survive restarts and are shared by processes.

    The file is opened as plait opens its own files: a symbolic link or other non-regular
    file at the path (or at its ``-wal`` / ``-shm`` companions) is refused, never followed.
    ``take`` deletes the run's row in a transaction, so across threads and processes one
    caller gets it; ``put`` counts the runs waiting in the same transaction as it adds one,
    so the bounds hold across processes. The store is also an approval ledger (`use`):
    install it with `plait.confirmation.set_approval_ledger` (the server does) and a used
    approval stays used across restarts, as long as the file is kept. A run's state is read
    back only within ``max_state_bytes`` and as JSON of bounded depth, never unpickled.

    Args:
        path: the file (created with its directory when missing).
        ttl: seconds a run waits before it expires; a resumed or expired run is remembered
            for as long again, then forgotten.
        max_state_bytes: largest state of one run.
        max_runs: runs kept at once, of every owner; a pause past it is refused.
        max_per_owner: runs of one API key kept at once.
        busy_timeout: seconds to wait for another process's write.

    Raises:
        FileError: the path is a link or not a regular file, cannot be opened, or holds
            something other than this store (or a later format of it).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        ttl: float = DEFAULT_TTL,
        max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
        max_runs: int = DEFAULT_MAX_RUNS,
        max_per_owner: int = DEFAULT_MAX_PER_OWNER,
        busy_timeout: float = 5.0,
    ) -> None:
        self._bounds = _Bounds(ttl, max_state_bytes, max_runs, max_per_owner)
        self.path = Path(path)
        self.ttl = ttl
        self.max_state_bytes = max_state_bytes
        self.max_runs = max_runs
        self.max_per_owner = max_per_owner
        size = "length(CAST(inputs AS BLOB)) + length(CAST(pause AS BLOB))"
        within = f"CASE WHEN {size} <= {int(max_state_bytes)} THEN"
        # a state over the limit is measured, never read (see `_run_of`)
        state = f"{within} inputs END, {within} pause END"
        self._columns = f"run_id, program, owner, created, {size}, {state}"
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
        db.execute("BEGIN IMMEDIATE")  # one process makes or brings up the tables
        try:
            self._layout(db)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _layout(self, db: sqlite3.Connection) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, 1, _FORMAT):
            raise sqlite3.DatabaseError(
                f"it is in format {version}, written by a later plait; this plait reads "
                f"formats up to {_FORMAT}"
            )
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables - set(_TABLES):
            names = ", ".join(sorted(tables))
            raise sqlite3.DatabaseError(f"it is an SQLite database of something else ({names})")
        if version == 1:  # plait before owners: its runs stay, without an owner
            db.execute("ALTER TABLE pending_runs ADD COLUMN owner TEXT")
            db.execute("ALTER TABLE gone_runs ADD COLUMN owner TEXT")
        db.execute(
            """CREATE TABLE IF NOT EXISTS pending_runs (
                run_id TEXT PRIMARY KEY, program TEXT NOT NULL, inputs TEXT NOT NULL,
                pause TEXT NOT NULL, created REAL NOT NULL, owner TEXT)"""
        )
        db.execute(
            """CREATE TABLE IF NOT EXISTS gone_runs (
                run_id TEXT PRIMARY KEY, why TEXT NOT NULL, at REAL NOT NULL, owner TEXT)"""
        )
        db.execute(
            """CREATE TABLE IF NOT EXISTS used_approvals (
                approval_id TEXT PRIMARY KEY, at REAL NOT NULL)"""
        )
        db.execute("CREATE INDEX IF NOT EXISTS pending_runs_owner ON pending_runs (owner)")
        db.execute(f"PRAGMA user_version={_FORMAT}")

    # -- the store ------------------------------------------------------------------------

    async def put(self, run: PendingRun) -> None:
        inputs, pause = _check_size(run, self.max_state_bytes)
        row = (run.run_id, run.program, inputs, pause, run.created, run.owner)
        await self._in_thread(self._write, self._put, row)

    def _put(self, db: sqlite3.Connection, row: tuple[Any, ...]) -> None:
        run_id, owner = row[0], row[-1]
        kept = db.execute("SELECT 1 FROM pending_runs WHERE run_id = ?", (run_id,)).fetchone()
        if kept is None:  # a run kept again takes its own place
            (total,) = db.execute("SELECT count(*) FROM pending_runs").fetchone()
            (of_owner,) = db.execute(
                "SELECT count(*) FROM pending_runs WHERE owner IS ?", (owner,)
            ).fetchone()
            _check_room(total, of_owner, owner, self._bounds)
        db.execute(
            "INSERT OR REPLACE INTO pending_runs (run_id, program, inputs, pause, created, owner)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            row,
        )

    async def get(self, run_id: str) -> PendingRun | None:
        return await self._in_thread(self._write, self._get, run_id)

    def _get(self, db: sqlite3.Connection, run_id: str) -> PendingRun | None:
        row = db.execute(
            f"SELECT {self._columns} FROM pending_runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        return None if row is None else self._run_of(row)

    async def take(self, run_id: str) -> PendingRun | None:
        return await self._in_thread(self._write, self._take, run_id)

    def _take(self, db: sqlite3.Connection, run_id: str) -> PendingRun | None:
        row = db.execute(
            f"DELETE FROM pending_runs WHERE run_id = ? RETURNING {self._columns}", (run_id,)
        ).fetchone()
        if row is None:
            return None
        run = self._run_of(row)  # a state this store refuses stays in the file (rolled back)
        db.execute(
            "INSERT OR REPLACE INTO gone_runs (run_id, why, at, owner) VALUES (?, 'resumed', ?, ?)",
            (run_id, time.time(), run.owner),
        )
        return run

    async def restore(self, run: PendingRun) -> None:
        inputs, pause = run.state_text()
        row = (run.run_id, run.program, inputs, pause, run.created, run.owner)
        await self._in_thread(self._write, self._restore, row)

    def _restore(self, db: sqlite3.Connection, row: tuple[Any, ...]) -> None:
        db.execute("DELETE FROM gone_runs WHERE run_id = ?", (row[0],))
        db.execute(
            "INSERT OR REPLACE INTO pending_runs (run_id, program, inputs, pause, created, owner)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            row,
        )

    async def gone(self, run_id: str) -> GoneRun | None:
        return await self._in_thread(self._write, self._gone, run_id)

    def _gone(self, db: sqlite3.Connection, run_id: str) -> GoneRun | None:
        row = db.execute("SELECT why, owner FROM gone_runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else GoneRun(*row)

    def _write(self, db: sqlite3.Connection, work: Any, *args: Any) -> Any:
        """Runs ``work(db, *args)`` in one write transaction, after expiring old runs: the
        write lock is taken first, so of processes doing the same, one goes at a time."""
        db.execute("BEGIN IMMEDIATE")
        try:
            self._expire(db)
            result = work(db, *args)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return result

    def _expire(self, db: sqlite3.Connection) -> None:
        """Moves runs past their ttl to the gone ones; forgets gone ones after as long again."""
        now = time.time()
        db.execute(
            "INSERT OR REPLACE INTO gone_runs (run_id, why, at, owner) "
            "SELECT run_id, 'expired', ?, owner FROM pending_runs WHERE created < ?",
            (now, now - self.ttl),
        )
        db.execute("DELETE FROM pending_runs WHERE created < ?", (now - self.ttl,))
        db.execute("DELETE FROM gone_runs WHERE at < ?", (now - self.ttl,))

    def _run_of(self, row: tuple[Any, ...]) -> PendingRun:
        """Reads a run's row (``_columns``) by `read_run`'s rules.

        Raises:
            FileError: naming the run, and what is wrong.
        """
        try:
            return read_run(*row, limit=self.max_state_bytes)
        except ValueError as exc:
            raise FileError(
                f"pending runs file {self.path}: {exc}; let it expire, or move the file away"
            ) from None

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

    def is_used(self, approval_id: str) -> bool:
        """Whether an approval was used (in any process), so its run may not be restored."""
        with self._lock:
            found = self._db.execute(
                "SELECT 1 FROM used_approvals WHERE approval_id = ?", (approval_id,)
            ).fetchone()
        return found is not None

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
