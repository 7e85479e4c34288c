"""Fixtures of the execution tests: a scripted server and a manager talking to it.

Tests change ``server.latency`` and ``server.responder`` to script what they
need; every assertion about timing is on what the server saw.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from plait import ResourceConfig, ResourceManager
from plait.testing import ScriptedServer

from .support import config_for


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as running:
        yield running


@pytest.fixture
def config(server: ScriptedServer) -> ResourceConfig:
    """Every alias goes to ``server``, no endpoint limit, no retries."""
    return config_for(server, max_retries=0)


@pytest.fixture
async def manager(config: ResourceConfig) -> AsyncIterator[ResourceManager]:
    async with ResourceManager(config) as running:
        yield running
