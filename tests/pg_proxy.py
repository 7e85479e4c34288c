"""A loopback TCP proxy in front of the test PostgreSQL server that can lose a COMMIT's reply.

`LosingProxy` forwards every connection's bytes both ways. Armed (`lose_next_commit`),
it lets the next ``COMMIT`` a client sends reach the server, waits for the server's
answer, and instead of passing it on closes both sides of that connection: the server
has committed, and the client sees its connection break with no reply, which is a lost
acknowledgement. The client cannot tell it from a COMMIT lost on its way
(``reach=False``: the connection breaks before the server reads it, so the server
rolls the transaction back), which the proxy makes too.

It reads the frontend protocol's simple query message (``Q``, its length, ``COMMIT``
and a NUL), which is how psycopg ends a transaction block; the test server speaks
plaintext on loopback (it has no SSL, so the client's SSL request is refused).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

__all__ = ["LosingProxy"]

_COMMIT = b"Q" + struct.pack("!i", 4 + len(b"COMMIT\0")) + b"COMMIT\0"


class LosingProxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:upstream``; `lost` counts replies lost."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.lost = 0
        self._armed = threading.Event()
        self._reach = True
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def url(self, schema: str) -> str:
        """A state URL through the proxy."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?schema={schema}"

    def lose_next_commit(self, *, reach: bool = True) -> None:
        """Breaks the connection of the next COMMIT after the server answers it (or, with
        ``reach=False``, before the server reads it)."""
        self._reach = reach
        self._armed.set()

    def close(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            committing = threading.Event()
            threading.Thread(
                target=self._to_server, args=(client, server, committing), daemon=True
            ).start()
            threading.Thread(
                target=self._to_client, args=(server, client, committing), daemon=True
            ).start()

    def _to_server(
        self, client: socket.socket, server: socket.socket, committing: threading.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if _COMMIT in data and self._armed.is_set():
                    self._armed.clear()
                    if not self._reach:
                        self.lost += 1
                        _shut(client)
                        break
                    committing.set()  # the answer to this COMMIT is lost
                server.sendall(data)
        _shut(server)

    def _to_client(
        self, server: socket.socket, client: socket.socket, committing: threading.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if committing.is_set():
                    self.lost += 1  # the server answered the COMMIT: it committed
                    break
                client.sendall(data)
        _shut(client)
        _shut(server)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


@contextlib.contextmanager
def losing_proxy(upstream: int) -> Iterator[LosingProxy]:
    """A `LosingProxy` to ``upstream``, closed after."""
    proxy = LosingProxy(upstream)
    try:
        yield proxy
    finally:
        proxy.close()
