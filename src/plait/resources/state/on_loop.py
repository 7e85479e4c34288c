"""Calling a state store from an event loop: inline on SQLite, on the store's threads otherwise.

A SQLite call is one local lookup or insert (tens of µs), cheaper than a
thread hop; a PostgreSQL call waits on a network, so it runs on the store's
own ``executor`` threads and the loop waits at most the store's ``timeout``.
Every user of a store on a loop (the response cache's writes, checkpoints,
paused runs, budgets) goes through `call`, so that rule has one place. The
one exception is the response cache's lookups on PostgreSQL, which every
cache miss waits for before its request goes: they are read on the loop
itself (`PostgresStore.loop_reads`, `plait.resources.state.pg_loop`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from plait.resources.state.base import StateStore

__all__ = ["call", "send"]

T = TypeVar("T")


async def call(store: StateStore, method: Callable[..., T], *args: Any, default: T) -> T:
    """Returns ``method(*args)`` of ``store``, or ``default`` when a blocking store is too
    slow (its timeout) or closed under the call. Errors the method raises (a scan's
    `StateUnavailable`) reach the caller."""
    if not store.blocking:
        return method(*args)
    future = asyncio.get_running_loop().run_in_executor(_threads(store), method, *args)
    try:
        return await asyncio.wait_for(future, _timeout(store))
    except (TimeoutError, RuntimeError):  # slow, or the store's threads closed under us
        return default


def send(store: StateStore, method: Callable[..., object], *args: Any) -> None:
    """Runs a write whose answer nobody waits for: inline on SQLite, on the store's threads
    otherwise."""
    if not store.blocking:
        method(*args)
    else:
        asyncio.get_running_loop().run_in_executor(_threads(store), method, *args)


def _threads(store: StateStore) -> Any:
    """The threads a blocking store's calls run on (None: the loop's default)."""
    return getattr(store, "executor", None)


def _timeout(store: StateStore) -> float | None:
    return getattr(store, "timeout", None)
