"""The contract of a state store: named tables of keys to bytes, shared by processes.

A store holds what outlives one process: for now the response cache (table
``responses``); checkpoints, paused runs and the budget ledger are the next
tables. Two implementations keep it: `plait.resources.state.sqlite` (one
file, the embedded default) and `plait.resources.state.postgres` (a server
every process and machine shares). A state URL chooses one
(`plait.resources.state.url`).

What a store promises:

- ``add`` stores a key once: concurrent writers of one key leave one row
  (the first), so a value is never half-written or overwritten.
- A value is bytes the caller encodes (JSON, never pickle); the store reads
  no value larger than `MAX_VALUE_BYTES` (it is absent), so nothing read
  from a database chooses code to run or takes unbounded memory.
- Tables are a fixed list (`TABLES`) and carry a schema version: a store
  written by a newer plait is refused with `StateError`, never misread.
- Failures after opening do not raise: a read misses, a write is dropped,
  and `StateWarning` (SQLite: the file is bypassed) or one log line per
  outage (PostgreSQL: it reconnects) says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from plait.errors import ConfigError
from plait.resources.state.url import StateURL

__all__ = [
    "MAX_VALUE_BYTES",
    "SCHEMA_VERSION",
    "TABLES",
    "StateError",
    "StateStore",
    "StateWarning",
]

SCHEMA_VERSION = 1
"""The layout this plait writes and reads; a store of a higher version is refused."""

TABLES = ("responses",)
"""The tables of schema version 1 (their names are code, never input)."""

MAX_VALUE_BYTES = 16 * 1024 * 1024
"""Largest value a store writes or reads; a larger stored one reads as absent."""


class StateError(ConfigError):
    """The state store a URL names cannot be used: unreachable at start, or newer than
    this plait. The message names the store with its password masked, and what to do."""


class StateWarning(UserWarning):
    """A state store failed after it was opened; the work goes on without it."""


class StateStore(Protocol):
    """What every state store offers; methods are thread-safe and never raise on a failure
    of the store (see the module docstring)."""

    url: StateURL
    """Which store this is (shown with its password masked)."""

    blocking: bool
    """Whether a call may wait on a network: callers on an event loop then run it on the
    store's ``executor`` threads under its ``timeout``, not inline."""

    @property
    def is_usable(self) -> bool:
        """Whether the store is open (a PostgreSQL store stays usable through an outage)."""
        ...

    def get(self, table: str, key: str) -> bytes | None:
        """Returns the value of ``key``, or None (absent, too large, or the store failed)."""
        ...

    def add(self, table: str, key: str, value: bytes) -> bool:
        """Stores ``value`` unless ``key`` has one; returns whether it was stored."""
        ...

    def add_many(self, table: str, items: Sequence[tuple[str, bytes]]) -> int:
        """`add` for each ``(key, value)``, in one round trip where the store can; returns
        how many were stored (0 when the store failed)."""
        ...

    def delete(self, table: str, key: str) -> bool:
        """Removes ``key``; returns whether it was there."""
        ...

    def count(self, table: str) -> int:
        """Returns how many keys ``table`` holds (0 when the store failed)."""
        ...

    def close(self) -> None:
        """Closes the store; later calls miss and drop."""
        ...


def check_table(table: str) -> str:
    """Returns ``table`` when it is one of `TABLES` (table names go into SQL text)."""
    if table not in TABLES:
        raise ValueError(f"unknown state table {table!r}; known: {', '.join(TABLES)}")
    return table
