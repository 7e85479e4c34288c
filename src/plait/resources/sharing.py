"""One manager per configuration and event loop, closed when its loop shuts down.

`ResourceManager.shared` returns the same manager for equal configurations
(`ResourceConfig.identity`) on the same event loop, so every call and every
batch item that uses a configuration shares its backends and limits. A shared
manager is created implicitly, so nobody closes it: it closes itself when its
loop shuts down (the end of ``asyncio.run``, or the process for ``run_sync``).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plait.resources.config import ResourceConfig
    from plait.resources.manager import ResourceManager

_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Any, ResourceManager]] = (
    weakref.WeakKeyDictionary()
)
"""Per event loop, the shared manager of each configuration identity."""


def shared_manager(
    cls: type[ResourceManager], resources: ResourceConfig, loop: asyncio.AbstractEventLoop
) -> ResourceManager:
    """Returns the manager of a configuration equal to ``resources`` on ``loop``, or a new one.

    `ResourceManager.shared` asks this only when ``resources`` itself has no open
    manager on ``loop`` yet; the answer is remembered on ``resources`` for next time.
    """
    registry = resources._shared
    for old_loop in [old for old in registry if old.is_closed()]:
        del registry[old_loop]
    equal = _SHARED.setdefault(loop, {})
    manager = equal.get(resources.identity)
    if manager is None or manager._closed:
        manager = equal[resources.identity] = cls(resources)
        _close_when_loop_shuts_down(manager, loop)
    registry[loop] = manager
    return manager


async def _closer(manager: ResourceManager) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await manager.aclose()


def _close_when_loop_shuts_down(manager: ResourceManager, loop: asyncio.AbstractEventLoop) -> None:
    """Closes a shared manager when its loop shuts down (the end of ``asyncio.run``).

    A shared manager is created implicitly, so nobody closes it; left open, its
    connection pools are reported as unclosed when the loop ends. A started
    async generator is what ``loop.shutdown_asyncgens()`` closes before the loop
    stops, so its ``finally`` runs on that loop at the right time.
    """
    closer = _closer(manager)
    manager._closer = closer  # keeps it alive until the loop closes it

    async def start() -> None:
        await closer.__anext__()  # first step: the loop now tracks the generator

    loop.create_task(start())
