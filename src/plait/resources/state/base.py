"""The contract of a state store: named tables of keys to bytes, shared by processes.

A store holds what outlives one process, one table each: the response cache
(``responses``), run checkpoints (``checkpoints``), paused runs of
``plait serve`` (``pauses``), budget ledgers (``budgets``) and search and
Trainer checkpoints (``learning``). Two implementations keep it: `plait.resources.state.sqlite` (one
file, the embedded default) and `plait.resources.state.postgres` (a server
every process and machine shares). A state URL chooses one
(`plait.resources.state.url`).

What a store promises:

- ``add`` stores a key once: concurrent writers of one key leave one row
  (the first), so a value is never half-written or overwritten; ``put``
  replaces it (a checkpoint that moves on).
- ``take`` removes a key and returns its value in one step: of several
  processes taking one key at once exactly one gets it (a paused run is
  resumed once).
- ``update`` reads a key and writes what a function makes of it in one
  transaction: processes updating one key go one at a time, each seeing the
  last one's write (a budget's books, the count of paused runs), and a write
  is made once, also when a broken connection hides whether it committed.
- ``scan`` reads the keys under a prefix in pages, in code-point order of
  their keys, so a run's rows are read back in bounded memory; ``get_many``
  reads a page of named keys in one round trip (a checkpoint's finished rows).
- A value is bytes the caller encodes (JSON, never pickle); the store reads
  no value larger than `MAX_VALUE_BYTES`, so nothing read from a database
  chooses code to run or takes unbounded memory. A larger row is measured,
  never loaded: in a table of `MISSES_OVERSIZED` (the response cache) it
  reads as absent; in any other a read of it raises `StateOversized` naming
  the row, since reading it as absent would do (and pay for) its work again.
- Tables are a fixed list (`TABLES`) and carry a schema version: a store
  written by a newer plait is refused with `StateError`, never misread.
- Failures after opening do not raise: a read misses, a write is dropped,
  and `StateWarning` (SQLite: the file is bypassed) or one log line per
  outage (PostgreSQL: it reconnects) says so. ``scan`` is the exception: it
  raises `StateUnavailable`, since a page read as empty would make a resumed
  run do its finished rows again.
- Every row carries the time it was written; ``prune`` removes the rows of a
  table written before a time (``plait state prune``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from plait.errors import ConfigError
from plait.resources.state.url import StateURL

__all__ = [
    "MAX_VALUE_BYTES",
    "MISSES_OVERSIZED",
    "SCHEMA_VERSION",
    "TABLES",
    "StateError",
    "StateOversized",
    "StateStore",
    "StateUnavailable",
    "StateWarning",
    "admit",
    "admit_rows",
    "check_table",
    "prefix_end",
]

SCHEMA_VERSION = 1
"""The layout this plait writes and reads; a store of a higher version is refused."""

TABLES = ("responses", "checkpoints", "pauses", "budgets", "learning")
"""The tables of schema version 1 (their names are code, never input). A table added
later is made on opening, so a store of an earlier plait needs no migration."""

SCAN_PAGE = 1000
"""Rows a ``scan`` returns at most, unless asked for fewer."""

MAX_VALUE_BYTES = 16 * 1024 * 1024
"""Largest value a store writes or reads (a larger stored one: `admit`)."""

MISSES_OVERSIZED = frozenset({"responses"})
"""Tables in which a row over `MAX_VALUE_BYTES` reads as absent. A cache may miss: the
call goes to the provider, as on any miss, and the answer is never wrong. In the others
(checkpoints, paused runs, budgets, learning) absent means "not done yet", "unknown" or
"nothing spent", so a row that cannot be read is refused (`StateOversized`) instead."""


class StateError(ConfigError):
    """The state store a URL names cannot be used: unreachable at start, or newer than
    this plait. The message names the store with its password masked, and what to do."""


class StateUnavailable(StateError):
    """A ``scan`` could not be answered (the store is down, closed or bypassed); unlike the
    other reads it raises, because an empty page would mean "nothing done yet"."""


class StateOversized(StateError):
    """A row over `MAX_VALUE_BYTES` was read from a table where it may not read as absent
    (see `MISSES_OVERSIZED`); the message names the store, table, key, size and cap."""

    def __init__(self, url: StateURL, table: str, key: str, size: int, cap: int) -> None:
        super().__init__(
            f"state store {url}: row {key!r} of table {table} is {size:,} bytes, over the "
            f"{cap:,} bytes plait reads, so it is refused rather than read as absent (which "
            f"would do its work again); delete that row (plait state prune --table {table} "
            "--older-than AGE removes the rows written before AGE) and run again"
        )
        self.table = table
        self.key = key
        self.size = size


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
        """Returns the value of ``key``, or None (absent, or the store failed).

        Raises:
            StateOversized: the row is over `MAX_VALUE_BYTES` (see `admit`).
        """
        ...

    def add(self, table: str, key: str, value: bytes) -> bool:
        """Stores ``value`` unless ``key`` has one; returns whether it was stored."""
        ...

    def put(self, table: str, key: str, value: bytes) -> bool:
        """Stores ``value`` under ``key``, replacing what it had; returns whether it was
        stored."""
        ...

    def take(self, table: str, key: str) -> bytes | None:
        """Removes ``key`` and returns its value, or None when it was not there (or the
        store failed); one caller of many taking one key gets it. A row over
        `MAX_VALUE_BYTES` stays: None in a table of `MISSES_OVERSIZED`, else
        `StateOversized`."""
        ...

    def update(self, table: str, key: str, change: Callable[[bytes | None], bytes | None]) -> bool:
        """Writes ``change(value)`` over ``key``'s value (None when absent) in one
        transaction that holds the key meanwhile: returning None deletes the key,
        returning the very value given (``is``) writes nothing. ``change`` runs on the
        store's thread, may run again when a connection breaks under it (a try the server
        rolled back), and so must be a pure function of its argument; its write is made
        once even when the reply to the COMMIT is lost. An error it raises rolls back and
        reaches the caller. A row over `MAX_VALUE_BYTES` is given as None in a table of
        `MISSES_OVERSIZED`, else raises `StateOversized` before ``change`` runs. Returns
        False when the store failed (nothing was written)."""
        ...

    def scan(
        self, table: str, prefix: str, *, after: str = "", limit: int = SCAN_PAGE
    ) -> list[tuple[str, bytes]]:
        """Returns up to ``limit`` ``(key, value)`` of the keys starting with ``prefix``
        and sorting after ``after``, in key order: the next page starts after the last
        key of this one. A row over `MAX_VALUE_BYTES` is left out in a table of
        `MISSES_OVERSIZED`.

        Raises:
            StateUnavailable: the store cannot answer.
            StateOversized: a row over `MAX_VALUE_BYTES` in any other table.
        """
        ...

    def get_many(self, table: str, keys: Sequence[str]) -> dict[str, bytes]:
        """Returns the values of those of ``keys`` that are stored, in one round trip (at most
        `SCAN_PAGE` keys a call). A row over `MAX_VALUE_BYTES` is left out in a table
        of `MISSES_OVERSIZED`.

        Raises:
            StateUnavailable: the store cannot answer (as ``scan``: an answer of nothing
                stored would make a resumed run do its finished rows again).
            StateOversized: a row over `MAX_VALUE_BYTES` in any other table.
        """
        ...

    def delete_prefix(self, table: str, prefix: str) -> int:
        """Removes every key starting with ``prefix``; returns how many (0 on a failure)."""
        ...

    def prune(self, table: str, before: float) -> int:
        """Removes the rows written before ``before`` (a ``time.time()``); returns how many."""
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


def prefix_end(prefix: str) -> str | None:
    """Returns the least string above every string that starts with ``prefix`` (in
    code-point order), or None when there is none (an empty prefix): the exclusive upper
    bound of a prefix's keys, so a scan uses the key's index."""
    text = prefix.rstrip(chr(0x10FFFF))
    if not text:
        return None
    following = ord(text[-1]) + 1
    if 0xD800 <= following <= 0xDFFF:  # surrogates are no characters: skip them
        following = 0xE000
    return text[:-1] + chr(following)


def admit(
    url: StateURL, table: str, key: str, value: bytes | None, size: int, cap: int
) -> bytes | None:
    """Returns a stored row's value, read together with its size by a query that returns
    the value only when ``size <= cap``: the value, or for a larger row None in a table of
    `MISSES_OVERSIZED`.

    Raises:
        StateOversized: a larger row in any other table.
    """
    if value is not None:
        return bytes(value)
    if table in MISSES_OVERSIZED:
        return None
    raise StateOversized(url, table, key, size, cap)


def admit_rows(
    url: StateURL, table: str, rows: Iterable[tuple[str, bytes | None, int]], cap: int
) -> list[tuple[str, bytes]]:
    """The ``(key, value)`` of rows read as ``(key, value within the cap, size)``, each
    through `admit` (a larger row left out, or refused)."""
    admitted = []
    for key, value, size in rows:
        kept = admit(url, table, key, value, size, cap)
        if kept is not None:
            admitted.append((key, kept))
    return admitted


def check_table(table: str) -> str:
    """Returns ``table`` when it is one of `TABLES` (table names go into SQL text)."""
    if table not in TABLES:
        raise ValueError(f"unknown state table {table!r}; known: {', '.join(TABLES)}")
    return table
