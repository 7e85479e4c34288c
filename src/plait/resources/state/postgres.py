"""The shared state store: a PostgreSQL schema every process and machine uses (``plait[postgres]``).

Imported only when a state URL names PostgreSQL, so ``import plait`` never
loads psycopg. Opening connects once, directly, to create the schema and
its tables (under an advisory lock, so processes starting together do not
race) and to check its version; a server that cannot be reached, or a
schema written by a newer plait, raises `StateError` naming the host and
port with the password masked.

After that, work goes through a psycopg connection pool on the caller's
thread (callers on an event loop use `executor`, a few threads of the
store's own, under a timeout). A failure never raises: a read misses, a
write is dropped, one log line says the store is down, and for the next
second every call skips it at once instead of waiting again; then it is
tried again, and a connection broken by a server restart is replaced (the
pool drops it) so the store reconnects by itself.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.conninfo import make_conninfo

from plait.resources.state.base import (
    MAX_VALUE_BYTES,
    SCAN_PAGE,
    SCHEMA_VERSION,
    TABLES,
    StateError,
    StateUnavailable,
    admit,
    admit_rows,
    check_table,
    prefix_end,
)
from plait.resources.state.pg_loop import LoopReads
from plait.resources.state.pg_watchdog import Watchdog
from plait.resources.state.url import StateURL

__all__ = ["PostgresStore"]

logger = logging.getLogger("plait.resources")

T = TypeVar("T")

_LOCK_ID = 0x706C616974  # "plait": serialises schema creation across processes
_RETRY_AFTER = 1.0  # seconds a failed store is skipped before it is tried again
# `update`'s first statement: the key's lock, and the id of its transaction (asked about
# after a broken connection).
_LOCK_KEY = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0)), txid_current()"


class PostgresStore:
    """A `StateStore` in one PostgreSQL schema (``url.schema``), shared by every process.

    Args:
        url: a ``postgresql://`` state URL.
        timeout: seconds one operation may take (connecting, waiting for a
            pooled connection, the statement); also the connect timeout.
        max_connections: the pool's bound, and the threads of `executor`.

    Raises:
        StateError: the server cannot be reached or refuses the login, or the
            schema was written by a newer plait.
    """

    blocking = True

    def __init__(self, url: StateURL, *, timeout: float = 2.0, max_connections: int = 8) -> None:
        self.url = url
        self.timeout = timeout
        self.error: str | None = None
        """What went wrong in the current outage, or None while the store answers."""
        self._down_until = 0.0
        self._closed = False
        self._lock = threading.Lock()
        connect = {"autocommit": True, "connect_timeout": max(1, math.ceil(timeout))}
        self._prepare(connect)
        self._sql = {
            table: {
                name: sql.SQL(text).format(sql.Identifier(url.schema, table)).as_string(None)
                for name, text in _STATEMENTS.items()
            }
            for table in TABLES
        }
        options = f"-c statement_timeout={int(timeout * 1000)}"
        self._conninfo = make_conninfo(
            url.target, connect_timeout=connect["connect_timeout"], options=options
        )
        self._pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
            url.target,
            kwargs={**connect, "options": options},
            min_size=1,
            max_size=max_connections,
            timeout=timeout,
            name="plait-state",
            open=False,
        )
        self._pool.open(wait=False)
        self._watchdog = Watchdog(2 * timeout + 1.0)
        """Cuts a statement a frozen server never answers (``statement_timeout`` ends a
        slow one on a running server; a transaction may hold several)."""
        self.executor = ThreadPoolExecutor(max_connections, thread_name_prefix="plait-state")
        """Where callers on an event loop run this store's calls."""

    def _prepare(self, connect: dict[str, Any]) -> None:
        """Creates the schema and tables on first use, and refuses a newer schema."""
        schema = sql.Identifier(self.url.schema)
        meta = sql.Identifier(self.url.schema, "meta")
        try:
            with psycopg.connect(self.url.target, **connect) as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, value text NOT NULL)"
                    ).format(meta)
                )
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} VALUES ('schema_version', %s) ON CONFLICT DO NOTHING"
                    ).format(meta),
                    (str(SCHEMA_VERSION),),
                )
                row = conn.execute(
                    sql.SQL("SELECT value FROM {} WHERE name = 'schema_version'").format(meta)
                ).fetchone()
                self._check_version(None if row is None else row[0])
                for table in TABLES:
                    # The C collation orders keys by code point, as SQLite does, so a
                    # prefix is one range of the key's index.
                    conn.execute(
                        sql.SQL(
                            'CREATE TABLE IF NOT EXISTS {} (key text COLLATE "C" PRIMARY KEY, '
                            "value bytea NOT NULL, created double precision NOT NULL)"
                        ).format(sql.Identifier(self.url.schema, table))
                    )
        except psycopg.OperationalError as exc:
            raise StateError(
                f"state store {self.url} is unreachable at {self.url.where}: "
                f"{self._reason(exc)}; start the server or correct the state URL"
            ) from None
        except psycopg.Error as exc:
            raise StateError(
                f"state store {self.url}: cannot prepare schema {self.url.schema!r}: "
                f"{self._reason(exc)}"
            ) from None

    def _check_version(self, found: Any) -> None:
        try:
            version = int(found)
        except (TypeError, ValueError):
            version = -1
        if version > SCHEMA_VERSION:
            raise StateError(
                f"state store {self.url}: schema {self.url.schema!r} is in plait state format "
                f"{version}, newer than this plait reads ({SCHEMA_VERSION}); upgrade plait, "
                "or name another schema with ?schema=NAME in the URL"
            )
        if version < 1:
            raise StateError(
                f"state store {self.url}: schema {self.url.schema!r} has a table 'meta' that "
                "plait did not write; name another schema with ?schema=NAME in the URL"
            )

    def _reason(self, exc: BaseException) -> str:
        """Returns the error's text on one line, with the URL's password masked."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        password = urlsplit(self.url.target).password
        if password:
            text = text.replace(password, "***").replace(unquote(password), "***")
        return text

    @property
    def is_usable(self) -> bool:
        """Whether the store is open (it stays so through an outage, and reconnects)."""
        return not self._closed

    def get(self, table: str, key: str) -> bytes | None:
        """Returns the value of ``key``, or None (absent, or the store is down); a row over
        the cap: `admit`."""
        query = self._sql[check_table(table)]["get"]

        def read(conn: psycopg.Connection[Any]) -> bytes | None:
            row = conn.execute(query, (MAX_VALUE_BYTES, key)).fetchone()
            return (
                None
                if row is None
                else admit(self.url, table, key, row[0], row[1], MAX_VALUE_BYTES)
            )

        return self._call("read", read, None)

    def add(self, table: str, key: str, value: bytes) -> bool:
        """Stores ``value`` unless ``key`` has one (one row per key, whoever writes it)."""
        return self._store("add", table, key, value)

    def put(self, table: str, key: str, value: bytes) -> bool:
        """Stores ``value`` under ``key``, replacing what it had."""
        return self._store("put", table, key, value)

    def _store(self, statement: str, table: str, key: str, value: bytes) -> bool:
        """Runs ``add`` or ``put`` (the table's statement of that name) for one row."""
        query = self._sql[check_table(table)][statement]
        if len(value) > MAX_VALUE_BYTES:
            return False

        def write(conn: psycopg.Connection[Any]) -> bool:
            return conn.execute(query, (key, value, time.time())).rowcount == 1

        return self._call("write", write, False)

    def take(self, table: str, key: str) -> bytes | None:
        """Removes ``key`` and returns its value (``DELETE … RETURNING``: one taker gets it);
        a row over the cap stays (`admit`)."""
        queries = self._sql[check_table(table)]

        def take(conn: psycopg.Connection[Any]) -> bytes | None:
            row = conn.execute(queries["take"], (key, MAX_VALUE_BYTES)).fetchone()
            if row is not None:
                return bytes(row[0])
            large = conn.execute(queries["size"], (key,)).fetchone()
            return (
                None
                if large is None
                else admit(self.url, table, key, None, large[1], MAX_VALUE_BYTES)
            )

        return self._call("take", take, None)

    def update(self, table: str, key: str, change: Callable[[bytes | None], bytes | None]) -> bool:
        """Writes ``change(value)`` over ``key`` in one transaction (see
        `StateStore.update`) holding a transaction-scoped advisory lock of the key (a row
        lock cannot hold a key that has no row yet); waiting for it is bounded by the
        statement timeout.

        Exactly once, also when the connection breaks after the COMMIT was sent and its
        reply is lost (the server may have committed): each try notes its transaction's id,
        and the try after a broken connection first takes the key's lock (so the broken
        try has ended, committed or rolled back) and asks the server how that id ended
        (``txid_status``). Committed: the update is done and ``change`` does not run
        again (a budget's charge is not counted twice); rolled back: it runs again.
        """
        queries = self._sql[check_table(table)]
        lock = f"{self.url.schema}.{table}/{key}"
        tried: list[int] = []
        """The transaction id of the last try, once the server gave it."""

        def work(conn: psycopg.Connection[Any]) -> bool:
            with conn.transaction():
                row = conn.execute(_LOCK_KEY, (lock,)).fetchone()
                if tried:
                    ended = conn.execute("SELECT txid_status(%s)", (tried[-1],)).fetchone()
                    if ended is not None and ended[0] == "committed":
                        return True  # the broken try committed: only its reply was lost
                tried[:] = [] if row is None else [int(row[1])]
                row = conn.execute(queries["get"], (MAX_VALUE_BYTES, key)).fetchone()
                old = (
                    None
                    if row is None
                    else admit(self.url, table, key, row[0], row[1], MAX_VALUE_BYTES)
                )
                new = change(old)
                if new is None:
                    conn.execute(queries["delete"], (key,))
                elif new is not old:
                    if len(new) > MAX_VALUE_BYTES:
                        raise ValueError(
                            f"a state value may be at most {MAX_VALUE_BYTES} bytes, got {len(new)}"
                        )
                    conn.execute(queries["put"], (key, new, time.time()))
            return True

        return self._call("update", work, False)

    def scan(
        self, table: str, prefix: str, *, after: str = "", limit: int = SCAN_PAGE
    ) -> list[tuple[str, bytes]]:
        """Returns a page of the keys under ``prefix`` after ``after`` (see `StateStore`)."""
        end = prefix_end(prefix)
        query = self._sql[check_table(table)]["scan" if end is None else "scan_to"]
        bounds = (prefix, after) if end is None else (prefix, after, end)

        def scan(conn: psycopg.Connection[Any]) -> list[tuple[str, bytes]] | None:
            rows = conn.execute(query, (MAX_VALUE_BYTES, *bounds, limit)).fetchall()
            return admit_rows(self.url, table, rows, MAX_VALUE_BYTES)

        page = self._call("scan", scan, None)
        if page is None:
            raise self._unavailable()
        return page

    def get_many(self, table: str, keys: Sequence[str]) -> dict[str, bytes]:
        """Returns the stored values of ``keys`` (``key = ANY(…)``: one round trip)."""
        if len(keys) > SCAN_PAGE:
            raise ValueError(f"get_many reads at most {SCAN_PAGE} keys a call, not {len(keys)}")
        if not keys:
            return {}
        query = self._sql[check_table(table)]["get_many"]

        def read(conn: psycopg.Connection[Any]) -> dict[str, bytes] | None:
            rows = conn.execute(query, (MAX_VALUE_BYTES, list(keys))).fetchall()
            return dict(admit_rows(self.url, table, rows, MAX_VALUE_BYTES))

        found = self._call("read", read, None)
        if found is None:
            raise self._unavailable()
        return found

    def loop_reads(self, table: str) -> LoopReads:
        """Returns a reader of ``table`` for the running event loop (`LoopReads`): the
        response cache's lookups, read on the loop itself rather than on `executor`."""
        return LoopReads(
            self._conninfo,
            self._sql[check_table(table)]["get_many_loop"],
            self.timeout,
            self.executor,
            self._down,
            lambda: not self._closed and time.monotonic() >= self._down_until,
        )

    def delete_prefix(self, table: str, prefix: str) -> int:
        """Removes every key under ``prefix``."""
        end = prefix_end(prefix)
        query = self._sql[check_table(table)]["delete_from" if end is None else "delete_range"]
        bounds = (prefix,) if end is None else (prefix, end)
        return self._call("delete", lambda conn: conn.execute(query, bounds).rowcount, 0)

    def prune(self, table: str, before: float) -> int:
        """Removes the rows written before ``before``."""
        query = self._sql[check_table(table)]["prune"]
        return self._call("prune", lambda conn: conn.execute(query, (before,)).rowcount, 0)

    def add_many(self, table: str, items: Sequence[tuple[str, bytes]]) -> int:
        """`add` for each ``(key, value)`` in one statement (``unnest`` of two arrays: one
        round trip, and no per-row work in Python that would hold the GIL from the
        event loop); returns how many keys were new."""
        query = self._sql[check_table(table)]["add_many"]
        rows = [(key, value) for key, value in items if len(value) <= MAX_VALUE_BYTES]
        if not rows:
            return 0
        keys, values = [key for key, _ in rows], [value for _, value in rows]

        def write(conn: psycopg.Connection[Any]) -> int:
            return max(conn.execute(query, (time.time(), keys, values)).rowcount, 0)

        return self._call("write", write, 0)

    def delete(self, table: str, key: str) -> bool:
        """Removes ``key``; returns whether it was there."""
        query = self._sql[check_table(table)]["delete"]
        return self._call("delete", lambda conn: conn.execute(query, (key,)).rowcount == 1, False)

    def count(self, table: str) -> int:
        """Returns how many keys ``table`` holds (0 while the store is down)."""
        query = self._sql[check_table(table)]["count"]

        def count(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(query).fetchone()
            return 0 if row is None else int(row[0])

        return self._call("count", count, 0)

    def _call(self, action: str, work: Callable[[psycopg.Connection[Any]], T], default: T) -> T:
        """Runs ``work`` on a pooled connection; ``default`` when the store is down or closed.

        A connection broken under it (a server restart) is tried once more on
        another, since the pool hands out connections it has not checked (``work`` must
        be safe to run again: `update`'s asks whether its broken try committed); one the
        watchdog cut (a server silent past twice the timeout) is not.
        """
        if self._closed or time.monotonic() < self._down_until:
            return default
        failure: BaseException | None = None
        for _ in range(2):
            cuts = self._watchdog.cuts
            try:
                with (
                    self._pool.connection(timeout=self.timeout) as conn,
                    self._watchdog.watching(conn),
                ):
                    result = work(conn)
            except psycopg_pool.PoolTimeout as exc:
                failure = exc
                break
            except psycopg.OperationalError as exc:
                failure = exc
                if self._watchdog.cuts != cuts:  # a silent server: waiting again is no help
                    break
                continue
            except (psycopg.Error, psycopg_pool.PoolClosed) as exc:
                failure = exc
                break
            if self.error is not None:
                self.error = None
                logger.warning("state store %s answers again", self.url)
            return result
        self._down(action, failure)
        return default

    def _unavailable(self) -> StateUnavailable:
        """The error of a read that must be answered (`scan`, `get_many`) when the store
        cannot answer it."""
        return StateUnavailable(
            f"state store {self.url} cannot answer ({self.error or 'closed'}); "
            "try again when it is back"
        )

    def _down(self, action: str, failure: BaseException | None) -> None:
        """Skips the store for a moment and says so once per outage."""
        self._down_until = time.monotonic() + _RETRY_AFTER
        with self._lock:
            if self.error is not None or self._closed:
                return
            self.error = self._reason(failure) if failure is not None else "failed"
        logger.warning(
            "state store %s failed on %s (%s); reads miss and writes are dropped until it "
            "answers again (retried every %.0f s)",
            self.url,
            action,
            self.error,
            _RETRY_AFTER,
        )

    def close(self) -> None:
        """Closes the pool and the threads; later calls miss and drop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.executor.shutdown(wait=False, cancel_futures=True)
        self._watchdog.stop()
        self._pool.close(timeout=self.timeout)

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("down" if self.error else "open")
        return f"PostgresStore({str(self.url)!r}, schema {self.url.schema!r}, {state})"


# A row's value when it is within the cap (%s), and its size: a larger one is measured
# (from its header: never loaded), then refused or missed by `admit`.
_VALUE = "CASE WHEN octet_length(value) <= %s THEN value END, octet_length(value)"

_STATEMENTS = {
    "get": f"SELECT {_VALUE} FROM {{}} WHERE key = %s",
    "size": "SELECT NULL::bytea, octet_length(value) FROM {} WHERE key = %s",
    "add": "INSERT INTO {} (key, value, created) VALUES (%s, %s, %s) ON CONFLICT (key) DO NOTHING",
    "add_many": "INSERT INTO {} (key, value, created) SELECT key, value, %s FROM "
    "unnest(%s::text[], %s::bytea[]) AS t(key, value) ON CONFLICT (key) DO NOTHING",
    "put": "INSERT INTO {} (key, value, created) VALUES (%s, %s, %s) ON CONFLICT (key) "
    "DO UPDATE SET value = excluded.value, created = excluded.created",
    "get_many": f"SELECT key, {_VALUE} FROM {{}} WHERE key = ANY(%s)",
    "get_many_loop": "SELECT key, value FROM {} WHERE key = ANY($1::text[]) "
    "AND octet_length(value) <= $2::bigint",
    "take": "DELETE FROM {} WHERE key = %s AND octet_length(value) <= %s RETURNING value",
    "scan": f"SELECT key, {_VALUE} FROM {{}} WHERE key >= %s AND key > %s ORDER BY key LIMIT %s",
    "scan_to": f"SELECT key, {_VALUE} FROM {{}} WHERE key >= %s AND key > %s AND key < %s "
    "ORDER BY key LIMIT %s",
    "delete_from": "DELETE FROM {} WHERE key >= %s",
    "delete_range": "DELETE FROM {} WHERE key >= %s AND key < %s",
    "prune": "DELETE FROM {} WHERE created < %s",
    "delete": "DELETE FROM {} WHERE key = %s",
    "count": "SELECT count(*) FROM {}",
}
