"""Response-cache lookups on PostgreSQL read on the event loop itself (nonblocking libpq).

A cache miss waits for its lookup before its request goes, so the lookup's
latency is paid by every call. The database answers a lookup in well under
a millisecond, but a read on the store's threads crosses the loop four or
five times (task, thread, GIL, ``call_soon_threadsafe``, the waiting task),
each crossing queued behind the loop's other work: measured in
``benchmarks/state_bench.py`` W2, 10–15 ms a lookup and +17–20 % wall time.
`LoopReads` instead keeps one nonblocking connection in libpq's pipeline
mode whose socket the loop watches. A lookup is written to the socket by
the call that asks it, not at the loop's next turn nor after an earlier
lookup's reply, and each lookup asked also reads whatever replies have
arrived, answering their callers at once. A turn of the loop can be long
(W2 finishes 64 calls together and each starts its next call in the same
turn), and a reply is otherwise seen only when the loop next looks at its
sockets, after that turn. W2's cost, measured alternately on one busy
machine (load 1.5–2): +7–9 % sending a turn's lookups together at the next
turn and answering them from the reader callback, +4.5–7 % sending each as
asked, +1.6–4.2 % also reading replies as lookups are asked (at load 3:
+12.5 % against +7.3 %). Past `DEPTH` lookups on their way,
the next ones go together (a burst of 64 lookups at once: 40,000/s, as
batched, rather than 8,000–11,000/s one read each).
It is written on psycopg's own libpq layer (`psycopg.pq`) rather than
psycopg's ``AsyncConnection``, which measured +9.5–11 % of W2's wall time
(a read a lookup, each awaited through psycopg's own waiting).

Only this read runs here; everything else of the store (writes, scans,
reconnecting the pool) stays on its threads (`plait.resources.state.on_loop`).
The connection is opened on the store's threads (connecting blocks), so the
loop never waits for a handshake; lookups asked meanwhile go together once
it is open. A lookup that has not answered within the store's timeout, or a
connection that breaks (a server restart), answers every lookup on it with a
miss, drops the connection and marks the store down; the next lookup after
that opens another. Each lookup is its own implicit transaction (a Sync
after each), so it sees every row committed before it was sent. The rows
read are bytes and text capped in the query (``MAX_VALUE_BYTES``, at most
one row per key asked): nothing read chooses code to run.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq

from plait.resources.state.base import MAX_VALUE_BYTES, SCAN_PAGE

__all__ = ["LoopReads"]

_STATEMENT = b"plait_get_many"
"""The name the lookup statement is prepared under on each connection."""

DEPTH = 4
"""Lookups a connection has on their way when the next one is asked alone: past that,
the next ones wait to go together (a ``key = ANY(…)`` read of up to a page of keys) when
a reply makes room or at the loop's next turn, whichever comes first; a burst of lookups
asked at once then costs the server a few reads rather than one each."""

Asked = dict[str, list["asyncio.Future[bytes | None]"]]


class LoopReads:
    """Reads keys of one table on the running loop, each lookup sent as it is asked (past
    `DEPTH` on their way, together).

    Built by `PostgresStore.loop_reads` for one event loop (a response cache's);
    `close` it on that loop.

    Args:
        conninfo: what libpq opens (the store's target with its timeouts).
        query: the ``get_many`` statement of the table, ``$1`` the keys, ``$2`` the cap.
        timeout: seconds a lookup may take before every lookup on its connection misses.
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
        """The loop this reader's socket and callers are on."""
        self._connection: _Connection | None = None
        self._waiting: Asked = {}  # not sent yet: the connection opens, or DEPTH are on their way
        self._scheduled = False  # _send_waiting is to run at the loop's next turn
        self._opening: asyncio.Future[pq.abc.PGconn] | None = None
        self._closed = False

    async def get(self, key: str) -> bytes | None:
        """Returns the value of ``key``, or None (absent, too large, or the store cannot
        answer in time)."""
        if self._closed or not self._usable():
            return None
        future: asyncio.Future[bytes | None] = self.loop.create_future()
        connection = self._connection
        if connection is not None and len(connection.sent) < DEPTH:
            connection.send({key: [future]})
            connection.poll()
            return await future
        self._waiting.setdefault(key, []).append(future)
        if connection is not None:
            connection.poll()  # a reply already here makes room for the waiting lookups
            if self._waiting and not self._scheduled:
                self._scheduled = True
                self.loop.call_soon(self._send_waiting)
        elif self._opening is None:
            self._opening = self.loop.run_in_executor(self._executor, self._connect)
            self._opening.add_done_callback(self._opened)
        return await future

    def _connect(self) -> pq.abc.PGconn:
        """Opens a connection (on the store's threads: it blocks), prepares the lookup and
        puts it in nonblocking pipeline mode."""
        pgconn = pq.PGconn.connect(self._conninfo)
        try:
            if pgconn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError(pgconn.get_error_message())
            prepared = pgconn.prepare(_STATEMENT, self._query)
            if prepared.status != pq.ExecStatus.COMMAND_OK:
                raise psycopg.OperationalError(prepared.get_error_message())
            pgconn.nonblocking = 1
            pgconn.enter_pipeline_mode()
        except BaseException:
            pgconn.finish()
            raise
        return pgconn

    def _opened(self, opening: asyncio.Future[pq.abc.PGconn]) -> None:
        self._opening = None
        failure = None if opening.cancelled() else opening.exception()
        if opening.cancelled() or failure is not None or self._closed:
            if failure is not None:
                self._failed("read", failure)
            if not opening.cancelled() and failure is None:
                opening.result().finish()
            self._miss_waiting()
            return
        self._connection = _Connection(self, opening.result())
        self._send_waiting()

    def _send_waiting(self, depth: int | None = None) -> None:
        """Sends the lookups not sent yet, a page of keys a read, while the connection has
        fewer than ``depth`` on their way (None: all of them)."""
        if depth is None:
            self._scheduled = False
        connection = self._connection
        while (
            self._waiting
            and connection is not None
            and connection is self._connection
            and (depth is None or len(connection.sent) < depth)
        ):
            keys = list(itertools.islice(self._waiting, SCAN_PAGE))
            connection.send({key: self._waiting.pop(key) for key in keys})

    def _lost(self, connection: _Connection, broken: BaseException) -> None:
        """The connection broke or a lookup on it timed out (its lookups have missed)."""
        if self._connection is connection:
            self._connection = None
        self._failed("read", broken)
        self._miss_waiting()

    def _miss_waiting(self) -> None:
        waiting, self._waiting = self._waiting, {}
        for futures in waiting.values():
            _answer(futures, None)

    def close(self) -> None:
        """Closes the connection; lookups still waiting miss."""
        self._closed = True
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self._miss_waiting()


class _Connection:
    """One nonblocking libpq connection in pipeline mode whose socket the loop watches.

    Lookups answer in the order they were sent: ``sent`` holds each one's send
    time and callers, ``found`` the rows read so far of the oldest.
    """

    def __init__(self, reads: LoopReads, pgconn: pq.abc.PGconn) -> None:
        self.reads = reads
        self.pgconn = pgconn
        self.sent: deque[tuple[float, Asked]] = deque()
        self.found: dict[str, bytes] = {}
        self.expiry: asyncio.TimerHandle | None = None
        self.writing = False  # waiting for the socket to take the rest of a send
        self.closed = False
        self.socket = pgconn.socket
        reads.loop.add_reader(self.socket, self.poll)

    def send(self, batch: Asked) -> None:
        """Writes a lookup of ``batch``'s keys (at most a page) and its Sync to the socket."""
        keys = "{" + ",".join(_quoted(key) for key in batch) + "}"
        now = self.reads.loop.time()
        self.sent.append((now, batch))
        try:
            self.pgconn.send_query_prepared(
                _STATEMENT,
                [keys.encode(), str(MAX_VALUE_BYTES).encode()],
                result_format=1,  # binary: bytea arrives as its bytes
            )
            self.pgconn.pipeline_sync()
            if self.pgconn.flush() and not self.writing:  # the socket's buffer is full
                self.writing = True
                self.reads.loop.add_writer(self.socket, self._writable)
        except psycopg.Error as exc:
            self._break(exc)
            return
        if self.expiry is None:
            self.expiry = self.reads.loop.call_at(now + self.reads._timeout, self._expired)

    def _writable(self) -> None:
        try:
            if self.pgconn.flush():
                return
        except psycopg.Error as exc:
            self._break(exc)
            return
        self.writing = False
        self.reads.loop.remove_writer(self.socket)

    def poll(self) -> None:
        """Reads what has arrived (without waiting) and answers the lookups it completes.

        The loop calls it when the socket is readable, and `LoopReads.get` after each
        send: a lookup whose rows arrived during a long turn of the loop is answered
        then, and its caller wakes at the next turn instead of the one after the loop
        next looks at its sockets.
        """
        if self.closed:
            return
        try:
            self.pgconn.consume_input()
            if self.pgconn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError("the server closed the connection")
            self._take_results()
        except psycopg.Error as exc:
            self._break(exc)
            return
        except UnicodeDecodeError as exc:  # a key that is not text: the read is not trusted
            self._break(psycopg.DataError(str(exc)))
            return
        if self.reads._waiting:
            self.reads._send_waiting(DEPTH)

    def _take_results(self) -> None:
        """Answers each lookup whose rows and Sync have arrived, oldest first."""
        pgconn, ended = self.pgconn, False
        while self.sent and not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:  # the end of a lookup's rows; its Sync follows
                if ended:
                    return
                ended = True
                continue
            ended = False
            if result.status == pq.ExecStatus.TUPLES_OK:
                for row in range(result.ntuples):
                    name, value = result.get_value(row, 0), result.get_value(row, 1)
                    if name is not None and value is not None:
                        self.found[bytes(name).decode()] = bytes(value)
            elif result.status == pq.ExecStatus.PIPELINE_SYNC:
                _, batch = self.sent.popleft()
                found, self.found = self.found, {}
                for key, futures in batch.items():
                    _answer(futures, found.get(key))
            else:
                raise psycopg.OperationalError(result.get_error_message())

    def _expired(self) -> None:
        """The oldest lookup's time is up (every lookup on the connection misses), or it has
        answered and the next one's deadline is set."""
        self.expiry = None
        if not self.sent:
            return
        deadline = self.sent[0][0] + self.reads._timeout
        if deadline > self.reads.loop.time():
            self.expiry = self.reads.loop.call_at(deadline, self._expired)
            return
        self._break(TimeoutError(f"no answer within {self.reads._timeout:g} s"))

    def _break(self, broken: BaseException) -> None:
        """Answers every lookup sent with a miss, closes the connection and tells the
        reader (which marks the store down)."""
        if self.closed:
            return
        self.close()
        self.reads._lost(self, broken)

    def close(self) -> None:
        """Closes the connection; its lookups still waiting miss."""
        if self.closed:
            return
        self.closed = True
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        self.reads.loop.remove_reader(self.socket)
        if self.writing:
            self.reads.loop.remove_writer(self.socket)
            self.writing = False
        self.pgconn.finish()
        sent, self.sent = self.sent, deque()
        for _, batch in sent:
            for futures in batch.values():
                _answer(futures, None)


def _quoted(key: str) -> str:
    """Returns ``key`` as an element of a PostgreSQL array literal (double-quoted)."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _answer(futures: list[asyncio.Future[bytes | None]], value: bytes | None) -> None:
    for future in futures:
        if not future.done():  # its caller may have been cancelled
            future.set_result(value)
