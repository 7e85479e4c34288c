"""The scripted server most budget and resume tests of learning run on: test_budget.py's
parity model (`respond`), 16 calls in flight. A module that needs another model makes its
own `server` and `config`, which take the place of these."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from plait import ResourceConfig
from plait.testing import ScriptedServer

from .test_budget import respond


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(responder=respond, latency=0.01) as running:
        yield running


@pytest.fixture
def config(server: ScriptedServer) -> ResourceConfig:
    return ResourceConfig({"*": server.endpoint(max_retries=0, max_concurrent=16)})
