"""The state store: what outlives a process, in an SQLite file or a PostgreSQL server.

One URL chooses it (`StateURL`): ``state="postgresql://…"`` (the extra
``plait[postgres]``) or an SQLite path. `open_store` returns the process's
one store of a URL, shared by everything in the process that names it, and
`release_store` closes it when the last user lets go. The contract is
`StateStore` (`base`); callers on an event loop go through `on_loop`.

Only this package's light modules load with it: the SQLite and PostgreSQL
implementations are imported when a URL of theirs is opened.
"""

from __future__ import annotations

import os
import threading

from plait.resources.state.base import (
    MAX_VALUE_BYTES,
    SCHEMA_VERSION,
    TABLES,
    StateError,
    StateOversized,
    StateStore,
    StateUnavailable,
    StateWarning,
)
from plait.resources.state.url import StateURL

__all__ = [
    "MAX_VALUE_BYTES",
    "SCHEMA_VERSION",
    "TABLES",
    "StateError",
    "StateOversized",
    "StateStore",
    "StateURL",
    "StateUnavailable",
    "StateWarning",
    "open_store",
    "release_store",
]

# One store per URL per process, counted by its users.
_stores: dict[StateURL, tuple[StateStore, int]] = {}
_stores_lock = threading.Lock()


def open_store(url: str | os.PathLike[str] | StateURL) -> StateStore:
    """Returns the process's store of ``url``, opening it (and making its tables) if needed.

    Every call must be matched by one `release_store`.

    Raises:
        StateError: a PostgreSQL server cannot be reached or holds a newer
            schema, or ``plait[postgres]`` is not installed. (An unusable
            SQLite file warns and is bypassed instead, as the cache always did.)
        ConfigError: ``url`` is not a state URL.
    """
    url = StateURL.parse(url)
    with _stores_lock:
        store, users = _stores.get(url, (None, 0))
        if store is None:
            store = _open(url)
        _stores[url] = (store, users + 1)
        return store


def release_store(store: StateStore) -> None:
    """Lets go of a store from `open_store`; the last user closes it."""
    with _stores_lock:
        current, users = _stores.get(store.url, (None, 0))
        if current is not store:
            return
        if users > 1:
            _stores[store.url] = (store, users - 1)
            return
        del _stores[store.url]
    store.close()


def _open(url: StateURL) -> StateStore:
    if url.kind == "sqlite":
        # import time: sqlite3 only for an SQLite store
        from plait.resources.state.sqlite import SQLiteStore

        return SQLiteStore(url)
    try:
        from plait.resources.state.postgres import PostgresStore  # optional extra (plait[postgres])
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("psycopg"):
            raise
        raise StateError(
            f"state store {url} needs psycopg 3 with its pool, which is not installed: "
            "pip install 'plait[postgres]'"
        ) from None
    return PostgresStore(url)
