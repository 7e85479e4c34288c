"""Response-cache lookups on PostgreSQL read on the event loop itself (nonblocking libpq).

A cache miss waits for its lookup before its request goes, so the lookup's
latency is paid by every call. The database answers a lookup in well under
a millisecond, but a read on the store's threads crosses the loop four or
five times (task, thread, GIL, ``call_soon_threadsafe``, the waiting task),
each crossing queued behind the loop's other work: measured in
``benchmarks/state_bench.py`` W2, 10–15 ms a lookup and +17–20 % wall time.
`LoopReads` instead keeps a few connections in nonblocking mode whose
sockets the loop watches: lookups asked in one turn of the loop go out
together at the start of the next (``key = ANY(…)``), and the loop's reader
callback answers their callers directly when the rows arrive.
It is written on psycopg's own libpq layer (`psycopg.pq`) rather than
psycopg's ``AsyncConnection`` because that measured +9.5–11 % of W2's wall
time against +8 % for this (the same benchmark, the same machine), and
this batches a loop turn's lookups into one read.

Only this read runs here; everything else of the store (writes, scans,
reconnecting the pool) stays on its threads (`plait.resources.state.on_loop`).
A connection is opened on the store's threads (connecting blocks), so the
loop never waits for a handshake. A read that has not answered within the
store's timeout, or a connection that breaks (a server restart), answers
its callers with misses and is dropped; the next lookup opens another. The
rows read are bytes and text capped in the query (``MAX_VALUE_BYTES``, at
most one row per key asked): nothing read chooses code to run.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq

from plait.resources.state.base import MAX_VALUE_BYTES, SCAN_PAGE

__all__ = ["LoopReads"]

CONNECTIONS = 2
"""Nonblocking connections one `LoopReads` keeps: one read waiting for its rows while
the next batch goes on the other."""

Asked = dict[str, list["asyncio.Future[bytes | None]"]]


class LoopReads:
    """Reads keys of one table on the running loop, batching the lookups of a loop turn.

    Built by `PostgresStore.loop_reads` for one event loop (a response cache's);
    `close` it on that loop.

    Args:
        conninfo: what libpq opens (the store's target with its timeouts).
        query: the ``get_many`` statement of the table, ``$1`` the keys, ``$2`` the cap.
        timeout: seconds a read may take before its callers miss.
        executor: the store's threads, where connections are opened.
        failed: called with the action and the error when a connection fails
            (the store logs the outage once and skips itself for a moment).
        usable: whether the store answers now (not closed, not skipped after a failure).
    """

    def __init__(
        self,
        conninfo: str,
        query: str,
        timeout: float,
        executor: Any,
        failed: Callable[[str, BaseException], None],
        usable: Callable[[], bool],
    ) -> None:
        self._conninfo = conninfo.encode()
        self._query = query.encode()
        self._timeout = timeout
        self._executor = executor
        self._failed = failed
        self._usable = usable
        self.loop = asyncio.get_running_loop()
        """The loop this reader's sockets and callers are on."""
        self._asked: Asked = {}
        self._scheduled = False
        self._idle: list[_Connection] = []
        self._open = 0  # connections open or opening
        self._opening: set[asyncio.Future[pq.abc.PGconn]] = set()
        self._closed = False

    async def get(self, key: str) -> bytes | None:
        """Returns the value of ``key``, or None (absent, too large, or the store cannot
        answer in time)."""
        if self._closed or not self._usable():
            return None
        future: asyncio.Future[bytes | None] = self.loop.create_future()
        self._asked.setdefault(key, []).append(future)
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._send)
        return await future

    def _send(self) -> None:
        """Sends the lookups asked so far (a page of keys) on an idle connection, or opens
        one; with none free they wait for the next read to come back."""
        self._scheduled = False
        if not self._asked or self._closed:
            return
        if self._idle:
            connection = self._idle.pop()
            keys = list(itertools.islice(self._asked, SCAN_PAGE))
            batch: Asked = {key: self._asked.pop(key) for key in keys}
            connection.send(batch)
            if self._asked:
                self._send()
        elif self._open < CONNECTIONS:
            self._open += 1
            opening = self.loop.run_in_executor(self._executor, self._connect)
            self._opening.add(opening)
            opening.add_done_callback(self._opened)

    def _connect(self) -> pq.abc.PGconn:
        pgconn = pq.PGconn.connect(self._conninfo)
        if pgconn.status != pq.ConnStatus.OK:
            message = pgconn.get_error_message()
            pgconn.finish()
            raise psycopg.OperationalError(message)
        pgconn.nonblocking = 1
        return pgconn

    def _opened(self, opening: asyncio.Future[pq.abc.PGconn]) -> None:
        self._opening.discard(opening)
        failure = None if opening.cancelled() else opening.exception()
        if opening.cancelled() or failure is not None or self._closed:
            self._open -= 1
            if failure is not None:
                self._failed("read", failure)
            if not opening.cancelled() and failure is None:
                opening.result().finish()
            self._miss_all()
            return
        self._idle.append(_Connection(self, opening.result()))
        self._send()

    def _done(self, connection: _Connection, broken: BaseException | None) -> None:
        """A connection's read came back (or failed): it serves the next batch, or goes."""
        if broken is not None or self._closed:
            self._open -= 1
            if connection in self._idle:  # an idle connection the server closed
                self._idle.remove(connection)
            connection.close()
            if broken is not None:
                self._failed("read", broken)
            if not self._usable():
                self._miss_all()
                return
        else:
            self._idle.append(connection)
        if self._asked and not self._scheduled:
            self._send()

    def _miss_all(self) -> None:
        asked, self._asked = self._asked, {}
        for futures in asked.values():
            _answer(futures, None)

    def close(self) -> None:
        """Closes the connections; lookups still waiting miss."""
        self._closed = True
        for connection in self._idle:
            connection.close()
        self._idle.clear()
        self._miss_all()


class _Connection:
    """One nonblocking libpq connection whose socket the loop watches."""

    def __init__(self, reads: LoopReads, pgconn: pq.abc.PGconn) -> None:
        self.reads = reads
        self.pgconn = pgconn
        self.batch: Asked | None = None
        self.found: dict[str, bytes] = {}
        self.expiry: asyncio.TimerHandle | None = None
        self.socket = pgconn.socket
        reads.loop.add_reader(self.socket, self._readable)

    def send(self, batch: Asked) -> None:
        self.batch = batch
        self.found = {}
        keys = "{" + ",".join(_quoted(key) for key in batch) + "}"
        try:
            self.pgconn.send_query_params(
                self.reads._query,
                [keys.encode(), str(MAX_VALUE_BYTES).encode()],
                result_format=1,  # binary: bytea arrives as its bytes
            )
            while self.pgconn.flush():  # a page of keys fits the socket's buffer at once
                pass
        except psycopg.Error as exc:
            self._finish(exc)
            return
        self.expiry = self.reads.loop.call_later(self.reads._timeout, self._expired)

    def _readable(self) -> None:
        try:
            self.pgconn.consume_input()
            if self.pgconn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError("the server closed the connection")
            while not self.pgconn.is_busy():
                result = self.pgconn.get_result()
                if result is None:
                    self._finish(None)
                    return
                if result.status != pq.ExecStatus.TUPLES_OK:
                    raise psycopg.OperationalError(result.get_error_message())
                for row in range(result.ntuples):
                    key, value = result.get_value(row, 0), result.get_value(row, 1)
                    if key is not None and value is not None:
                        self.found[bytes(key).decode()] = bytes(value)
        except psycopg.Error as exc:
            self._finish(exc)
        except UnicodeDecodeError as exc:  # a key that is not text: the read is not trusted
            self._finish(psycopg.DataError(str(exc)))

    def _expired(self) -> None:
        self.expiry = None
        self._finish(TimeoutError(f"no answer within {self.reads._timeout:g} s"))

    def _finish(self, broken: BaseException | None) -> None:
        """Answers the batch (misses when ``broken``) and hands the connection back."""
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        batch, self.batch, found = self.batch, None, self.found
        if batch is None and broken is None:
            return  # nothing asked: a notice, or the end of an idle connection's input
        if batch is not None:
            for key, futures in batch.items():
                _answer(futures, None if broken is not None else found.get(key))
        self.reads._done(self, broken)

    def close(self) -> None:
        self.reads.loop.remove_reader(self.socket)
        self.pgconn.finish()


def _quoted(key: str) -> str:
    """Returns ``key`` as an element of a PostgreSQL array literal (double-quoted)."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _answer(futures: list[asyncio.Future[bytes | None]], value: bytes | None) -> None:
    for future in futures:
        if not future.done():  # its caller may have been cancelled
            future.set_result(value)
