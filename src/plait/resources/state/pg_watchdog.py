"""A client-side bound on a PostgreSQL statement, for a server that answers nothing.

The store bounds a statement on the server (``statement_timeout``), which
holds while the server runs. A server that is frozen (stopped, swapped out,
a VM paused) or a network that drops packets without a reset never answers
and never times out, and a blocking psycopg call waits on its socket for
as long: a budget hold on the event loop would stop every other call of
the process. `Watchdog` notes the connections in use and, once one has
been silent past its limit, shuts its socket down, so the waiting call
fails with `psycopg.OperationalError` (the pool then drops the connection)
and the store goes down as for any outage. A statement cut before its
COMMIT was sent never commits. One cut while its COMMIT waits for the frozen
server may commit when the server goes on: the caller is told the write
failed (``update`` returns False, a budget settle is put back), so such a
write can count twice; bounding that would need a token kept past one call.

One thread per store, waking twice a second, rather than a timer per
statement: a budget on the store runs a transaction for every call.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg

__all__ = ["Watchdog"]

_TICK = 0.5  # seconds between two looks at the connections in use


class Watchdog:
    """Cuts the socket of a connection whose work outlasts ``limit`` seconds."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.cuts = 0
        """Connections cut so far (for tests and the outage's log line)."""
        self._watched: dict[int, tuple[float, Any]] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, conn: Any) -> Iterator[None]:
        """Watches ``conn`` (a psycopg connection) while the block runs."""
        token = id(conn)
        with self._lock:
            self._watched[token] = (time.monotonic() + self.limit, conn)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="plait-state-watchdog", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._watched.pop(token, None)

    def stop(self) -> None:
        """Ends the watching thread (the store closed)."""
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(_TICK):
            now = time.monotonic()
            with self._lock:  # cut under the lock: a connection handed back is not cut
                for token, (deadline, conn) in list(self._watched.items()):
                    if now >= deadline:
                        del self._watched[token]
                        self.cuts += 1
                        _shut(conn)


def _shut(conn: Any) -> None:
    """Shuts the connection's socket down both ways (its own descriptor stays open for
    psycopg to close)."""
    try:
        copy = socket.socket(fileno=os.dup(conn.pgconn.socket))
    except (OSError, ValueError, psycopg.Error):  # closed already: nothing left to cut
        return
    with copy, suppress(OSError):
        copy.shutdown(socket.SHUT_RDWR)
