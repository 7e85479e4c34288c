"""The embedded state store: one SQLite file in WAL mode, shared by the processes of one machine.

A file that SQLite cannot read (overwritten, truncated, from another program
or a newer plait) is reported once with a `StateWarning` naming it and then
bypassed: reads miss and writes are dropped, so the work goes on without it.
Its work runs inline: a read is one indexed lookup (about 15 µs) and a write
one autocommitted insert (about 70 µs, no fsync: WAL with
``synchronous=NORMAL``), cheaper than a thread hop.

The layout is the response cache file of earlier plait versions (table
``responses``, ``PRAGMA user_version`` 1), so an existing cache keeps working.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from plait import _files
from plait.resources.state.base import (
    MAX_VALUE_BYTES,
    SCAN_PAGE,
    SCHEMA_VERSION,
    TABLES,
    StateUnavailable,
    StateWarning,
    admit,
    admit_rows,
    check_table,
    prefix_end,
)
from plait.resources.state.url import StateURL

__all__ = ["SQLiteStore"]

logger = logging.getLogger("plait.resources")

# A row's value when it is within the cap, and its size: a larger one is measured, never loaded.
_VALUE = "CASE WHEN length(value) <= ? THEN value END, length(value)"

# SQLite answers BUSY/LOCKED while another process writes; that passes, so the
# lookup is a miss (or the write is skipped) and the file stays in use.
_TRANSIENT = frozenset({"SQLITE_BUSY", "SQLITE_LOCKED"})


class SQLiteStore:
    """A `StateStore` in one SQLite file; opened (and its tables made) on construction.

    Any SQLite error other than a passing lock makes the store unusable: it
    warns once (`StateWarning`, naming the file and the reason), closes the
    file and from then on every `get` misses and every `add` is dropped.
    `error` then says why. Thread-safe (one lock per store).
    """

    blocking = False

    def __init__(self, path: str | os.PathLike[str] | StateURL, *, busy_timeout: float = 2.0):
        self.url = path if isinstance(path, StateURL) else StateURL.parse(Path(path))
        self.path = Path(self.url.target)
        self.error: str | None = None
        """Why the store is bypassed, or None while it works."""
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            companions = (self.path.with_name(self.path.name + end) for end in ("-wal", "-shm"))
            _files.check_no_links(self.path, *companions)
            db = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            self._fail(exc)
            return
        self._db = db
        try:
            self._prepare(db)
        except sqlite3.Error as exc:
            self._fail(exc)

    def _prepare(self, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA journal_mode=WAL")  # reads the header: garbage fails here
        db.execute("PRAGMA synchronous=NORMAL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master")]
            if tables and not set(tables) & set(TABLES):
                raise sqlite3.DatabaseError(
                    f"it is an SQLite database of another program (tables {', '.join(tables)})"
                )
        elif version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(
                f"it is in cache format {version}; this plait reads format {SCHEMA_VERSION}"
                " (upgrade plait, or name another file)"
            )
        for table in TABLES:
            db.execute(
                f"CREATE TABLE IF NOT EXISTS {table} "
                "(key TEXT PRIMARY KEY, value BLOB NOT NULL, created REAL NOT NULL) WITHOUT ROWID"
            )
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @property
    def is_usable(self) -> bool:
        """Whether the file is open and working."""
        return self._db is not None

    def get(self, table: str, key: str) -> bytes | None:
        """Returns the stored value of ``key``, or None (also when the store is bypassed);
        a row over the cap: `admit`."""
        if self._db is None:
            return None
        sql = f"SELECT {_VALUE} FROM {check_table(table)} WHERE key = ?"
        try:
            with self._lock:
                row = self._db.execute(sql, (MAX_VALUE_BYTES, key)).fetchone()
        except sqlite3.Error as exc:
            self._on_error(exc, "read")
            return None
        return None if row is None else admit(self.url, table, key, row[0], row[1], MAX_VALUE_BYTES)

    def add(self, table: str, key: str, value: bytes) -> bool:
        """Stores ``value`` unless ``key`` has one; dropped when the store is bypassed."""
        if self._db is None or len(value) > MAX_VALUE_BYTES:
            return False
        sql = (
            f"INSERT INTO {check_table(table)} (key, value, created) VALUES (?, ?, ?) "
            "ON CONFLICT (key) DO NOTHING"
        )
        return self._write(sql, (key, value, time.time()), "write") == 1

    def put(self, table: str, key: str, value: bytes) -> bool:
        """Stores ``value`` under ``key``, replacing what it had."""
        sql = (
            f"INSERT INTO {check_table(table)} (key, value, created) VALUES (?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value, created = excluded.created"
        )
        if self._db is None or len(value) > MAX_VALUE_BYTES:
            return False
        return self._write(sql, (key, value, time.time()), "write") == 1

    def take(self, table: str, key: str) -> bytes | None:
        """Removes ``key`` and returns its value (one statement: one taker gets it); a row
        over the cap stays (`admit`)."""
        if self._db is None:
            return None
        name = check_table(table)
        sql = f"DELETE FROM {name} WHERE key = ? AND length(value) <= ? RETURNING value"
        large = None
        try:
            with self._lock:
                row = self._db.execute(sql, (key, MAX_VALUE_BYTES)).fetchone()
                if row is None:
                    sizes = f"SELECT NULL, length(value) FROM {name} WHERE key = ?"
                    large = self._db.execute(sizes, (key,)).fetchone()
        except sqlite3.Error as exc:
            self._on_error(exc, "take")
            return None
        if row is not None:
            return bytes(row[0])
        return (
            None if large is None else admit(self.url, table, key, None, large[1], MAX_VALUE_BYTES)
        )

    def update(self, table: str, key: str, change: Callable[[bytes | None], bytes | None]) -> bool:
        """Writes ``change(value)`` over ``key`` in one ``BEGIN IMMEDIATE`` transaction
        (see `StateStore.update`): the file's write lock first, so of processes updating
        at once one goes at a time; waiting for it is bounded by the busy timeout."""
        if self._db is None:
            return False
        name = check_table(table)
        try:
            with self._lock:
                db = self._db
                db.execute("BEGIN IMMEDIATE")
                try:
                    row = db.execute(
                        f"SELECT {_VALUE} FROM {name} WHERE key = ?", (MAX_VALUE_BYTES, key)
                    ).fetchone()
                    old = (
                        None
                        if row is None
                        else admit(self.url, table, key, row[0], row[1], MAX_VALUE_BYTES)
                    )
                    new = change(old)
                    if new is None:
                        db.execute(f"DELETE FROM {name} WHERE key = ?", (key,))
                    elif new is not old:
                        _check_size(new)
                        db.execute(
                            f"INSERT INTO {name} (key, value, created) VALUES (?, ?, ?) "
                            "ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
                            "created = excluded.created",
                            (key, new, time.time()),
                        )
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            self._on_error(exc, "update")
            return False
        return True

    def scan(
        self, table: str, prefix: str, *, after: str = "", limit: int = SCAN_PAGE
    ) -> list[tuple[str, bytes]]:
        """Returns a page of the keys under ``prefix`` after ``after`` (see `StateStore`)."""
        end = prefix_end(prefix)
        sql = (
            f"SELECT key, {_VALUE} FROM {check_table(table)} WHERE key >= ? AND key > ?"
            + ("" if end is None else " AND key < ?")
            + " ORDER BY key LIMIT ?"
        )
        bounds = (prefix, after) if end is None else (prefix, after, end)
        if self._db is None:
            raise StateUnavailable(f"state store {self.path} is bypassed: {self.error}")
        try:
            with self._lock:
                rows = self._db.execute(sql, (MAX_VALUE_BYTES, *bounds, limit)).fetchall()
        except sqlite3.Error as exc:
            self._on_error(exc, "scan")
            raise StateUnavailable(f"state store {self.path} failed on a scan: {exc}") from None
        return admit_rows(self.url, table, rows, MAX_VALUE_BYTES)

    def get_many(self, table: str, keys: Sequence[str]) -> dict[str, bytes]:
        """Returns the stored values of ``keys`` (see `StateStore.get_many`)."""
        if len(keys) > SCAN_PAGE:
            raise ValueError(f"get_many reads at most {SCAN_PAGE} keys a call, not {len(keys)}")
        if not keys:
            return {}
        if self._db is None:
            raise StateUnavailable(f"state store {self.path} is bypassed: {self.error}")
        marks = ", ".join("?" * len(keys))
        sql = f"SELECT key, {_VALUE} FROM {check_table(table)} WHERE key IN ({marks})"
        try:
            with self._lock:
                rows = self._db.execute(sql, (MAX_VALUE_BYTES, *keys)).fetchall()
        except sqlite3.Error as exc:
            self._on_error(exc, "read")
            raise StateUnavailable(f"state store {self.path} failed on a read: {exc}") from None
        return dict(admit_rows(self.url, table, rows, MAX_VALUE_BYTES))

    def delete_prefix(self, table: str, prefix: str) -> int:
        """Removes every key under ``prefix``."""
        end = prefix_end(prefix)
        sql = f"DELETE FROM {check_table(table)} WHERE key >= ?" + (
            "" if end is None else " AND key < ?"
        )
        return self._write(sql, (prefix,) if end is None else (prefix, end), "delete")

    def prune(self, table: str, before: float) -> int:
        """Removes the rows written before ``before``."""
        sql = f"DELETE FROM {check_table(table)} WHERE created < ?"
        return self._write(sql, (before,), "prune")

    def _write(self, sql: str, parameters: tuple[object, ...], action: str) -> int:
        """Runs one writing statement; returns the rows it changed (0 on a failure)."""
        if self._db is None:
            return 0
        try:
            with self._lock:
                return int(self._db.execute(sql, parameters).rowcount)
        except sqlite3.Error as exc:
            self._on_error(exc, action)
            return 0

    def add_many(self, table: str, items: Sequence[tuple[str, bytes]]) -> int:
        """`add` for each ``(key, value)``, in one transaction."""
        if self._db is None:
            return 0
        sql = (
            f"INSERT INTO {check_table(table)} (key, value, created) VALUES (?, ?, ?) "
            "ON CONFLICT (key) DO NOTHING"
        )
        now = time.time()
        rows = [(key, value, now) for key, value in items if len(value) <= MAX_VALUE_BYTES]
        try:
            with self._lock, self._db:  # one transaction: committed, or rolled back whole
                self._db.execute("BEGIN")
                return self._db.executemany(sql, rows).rowcount
        except sqlite3.Error as exc:
            self._on_error(exc, "write")
            return 0

    def delete(self, table: str, key: str) -> bool:
        """Removes ``key``; returns whether it was there."""
        if self._db is None:
            return False
        try:
            with self._lock:
                sql = f"DELETE FROM {check_table(table)} WHERE key = ?"
                return self._db.execute(sql, (key,)).rowcount == 1
        except sqlite3.Error as exc:
            self._on_error(exc, "delete")
            return False

    def count(self, table: str) -> int:
        """Returns how many keys ``table`` holds (0 when bypassed)."""
        if self._db is None:
            return 0
        try:
            with self._lock:
                sql = f"SELECT count(*) FROM {check_table(table)}"
                return int(self._db.execute(sql).fetchone()[0])
        except sqlite3.Error as exc:
            self._on_error(exc, "count")
            return 0

    def close(self) -> None:
        """Closes the file (a WAL checkpoint folds pending writes into it)."""
        with self._lock:
            db, self._db = self._db, None
        if db is not None:
            try:
                db.close()
            except sqlite3.Error as exc:  # closing a broken file: nothing left to save
                logger.debug("closing state store %s failed: %s", self.path, exc)

    def _on_error(self, exc: sqlite3.Error, action: str) -> None:
        name = getattr(exc, "sqlite_errorname", "")
        if name in _TRANSIENT or "locked" in str(exc):
            logger.debug("state store %s busy on %s; skipped: %s", self.path, action, exc)
            return
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """Bypasses the store from now on and says so, once."""
        if self.error is not None:
            return
        self.error = str(exc) or type(exc).__name__
        self.close()
        # The state is final before the warning: under ``-W error`` it raises.
        warnings.warn(
            f"response cache {self.path} is unusable ({self.error}); it is bypassed and "
            "calls go to the provider. Delete or move the file to start a new cache.",
            StateWarning,
            stacklevel=2,
        )

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r}, {'open' if self._db else 'bypassed'})"


def _check_size(value: bytes) -> None:
    if len(value) > MAX_VALUE_BYTES:
        raise ValueError(f"a state value may be at most {MAX_VALUE_BYTES} bytes, got {len(value)}")
