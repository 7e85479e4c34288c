"""A `ScriptedServer` on its own event loop in a background thread.

A caller that blocks its thread (``run_sync``, a CLI run in a child process,
a Ray worker) cannot be served by a server on that thread's loop: the server
would never get to answer. This one answers from a loop of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from plait.testing.scripted_server import ScriptedServer

_START_STOP_SECONDS = 10


@contextlib.contextmanager
def server_in_thread(**options: Any) -> Iterator[ScriptedServer]:
    """Runs ``ScriptedServer(**options)`` on a loop in a daemon thread while the block runs.

    The server is started before the block and stopped, its loop closed, after.
    """
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="scripted-server", daemon=True)
    thread.start()
    server = ScriptedServer(**options)
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(_START_STOP_SECONDS)
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(_START_STOP_SECONDS)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_START_STOP_SECONDS)
        loop.close()
