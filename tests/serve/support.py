"""A real uvicorn server on loopback for the serve tests, and small readers of its answers.

The app runs in `uvicorn.Server` on its own thread and event loop (port 0: a free one);
the test's loop holds the scripted upstream and the clients, as a deployment would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import uvicorn

from plait.testing import ScriptedServer


@contextlib.asynccontextmanager
async def serving(app: Any, **config: Any) -> AsyncIterator[str]:
    """Serves ``app`` with uvicorn on 127.0.0.1 (``config``: more `uvicorn.Config` options);
    yields its base URL; stops it afterwards."""
    server, thread = _start(app, **config)
    await until(lambda: server.started or not thread.is_alive(), "uvicorn to start")
    try:
        yield _url(server)
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 60)


@contextlib.contextmanager
def serving_in_thread(app: Any) -> Iterator[str]:
    """`serving` for a test without an event loop (one driving a browser, say)."""
    server, thread = _start(app)
    for _ in range(3000):
        if server.started or not thread.is_alive():
            break
        time.sleep(0.01)
    try:
        yield _url(server)
    finally:
        server.should_exit = True
        thread.join(60)


def _start(app: Any, **options: Any) -> tuple[uvicorn.Server, threading.Thread]:
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", **options
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    return server, thread


def _url(server: uvicorn.Server) -> str:
    assert server.started, "uvicorn did not start"
    return f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


async def until(condition: Callable[[], bool], what: str, limit: float = 30.0) -> None:
    """Waits for ``condition`` (checked every few ms), failing after ``limit`` seconds."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + limit
    while not condition():
        if loop.time() > give_up:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.01)


def sse_events(text: str) -> list[tuple[str, Any]]:
    """Returns the ``(event, data)`` pairs of a Server-Sent Events body."""
    events = []
    for block in text.strip().split("\n\n"):
        name, data = "message", ""
        for line in block.splitlines():
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "data":
                data = value
        events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events


RAY_ON_A_BUSY_MACHINE = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60"}
"""Environment for a local Ray that starts Serve's proxy on a loaded machine.

Serve's controller kills a proxy actor whose process has not answered its ready
check within 5 s, and `serve.start` then fails with ActorDiedError: on two cores
beside other busy processes, starting that process takes longer than 5 s.
"""


def start_ray(env_vars: dict[str, str]) -> None:
    """Starts a local Ray of two CPUs for Ray Serve, its processes given ``env_vars`` and
    `RAY_ON_A_BUSY_MACHINE` (read by them as they start); the test shuts it down."""
    import ray  # optional dependency (plait[serve-ray]): only the Ray Serve tests call this

    with pytest.MonkeyPatch.context() as environment:
        for name, value in RAY_ON_A_BUSY_MACHINE.items():
            environment.setenv(name, value)
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": env_vars},
        )


def free_port() -> int:
    """Returns a loopback TCP port that no one listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def upstream(server: ScriptedServer, **options: Any) -> dict[str, Any]:
    """Returns resources whose every alias is the scripted ``server``."""
    return {"*": server.endpoint(max_retries=0, **options)}


class Gate:
    """A responder that holds every upstream answer until the test opens the gate."""

    def __init__(self, reply: str = "released") -> None:
        self.opened = asyncio.Event()
        self.reply = reply

    async def __call__(self, body: dict[str, Any]) -> str:
        await self.opened.wait()
        return self.reply
