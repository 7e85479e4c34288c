"""The scripted server and a manager talking to it, for the tests of program modules.

Tests script the model with a responder and assert on what the server saw
(request bodies, arrival and finish times, peak concurrency), never on timings.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from plait import ResourceConfig, ResourceManager
from plait.testing import ScriptedServer
from plait.testing._replies import Responder

FAST_RETRY = {"retry_base_delay": 0.01, "retry_max_delay": 0.02}


@contextlib.asynccontextmanager
async def scripted(
    responder: Responder | None = None, latency: float = 0.0, **endpoint: Any
) -> AsyncIterator[tuple[ScriptedServer, ResourceManager]]:
    """Runs a scripted server and a manager whose ``"*"`` alias sends everything to it.

    ``endpoint`` options override the defaults (no retries, no limit), e.g.
    ``cache=str(tmp_path / "cache.sqlite")``.
    """
    async with ScriptedServer(latency=latency, responder=responder) as server:
        config = ResourceConfig(
            {"*": server.endpoint(**{"max_retries": 0, **FAST_RETRY, **endpoint})}
        )
        async with ResourceManager(config) as manager:
            yield server, manager


def bodies(server: ScriptedServer) -> list[dict[str, Any]]:
    """Returns the bodies of the chat requests the server received, in arrival order."""
    return [record.body for record in server.stats.log]


def last_user(body: dict[str, Any]) -> str:
    """Returns the text of the last user message of a request body."""
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


def all_text(body: dict[str, Any]) -> str:
    """Returns every message's content of a request body, joined (for `in` checks)."""
    return "\n".join(str(m.get("content") or "") for m in body["messages"])
