"""Response cache: a memory LRU in front of an on-disk SQLite store.

An endpoint whose configuration sets ``cache`` answers a repeated request
from here instead of the provider: the second run of a batch sends nothing
and costs nothing. The manager marks such replies ``meta["cached"] = True``;
``complete(..., cache=False)`` (or the execution option ``cache=False``)
skips the cache for a call.

What a reply depends on is the key: the SHA-256 of the canonical JSON of the
provider request (provider, model, messages, every sampling option, tools,
tool choice, response schema, and ``rollout_id`` when set). Credentials,
headers and base URLs are never part of it, so two endpoints that differ
only in key or URL share entries; ``rollout_id`` is how a caller asks for a
deliberately fresh sample of an otherwise identical request.

Values are JSON (text, tool calls, usage, finish reason, model), never
pickle, so a cache file cannot run code when read. The store is one SQLite
file in WAL mode, shared by every cache object of the process that names
the same file. A file that SQLite cannot read (overwritten, truncated, from
another program or format) is reported once with a `CacheWarning` naming it
and then bypassed: calls go to the provider and nothing is written to it.

Configuration (``cache`` in an endpoint)::

    "cache": True                                   # ~/.cache/plait/responses.sqlite
    "cache": "runs/responses.sqlite"                # that file
    "cache": {"path": "runs/r.sqlite", "memory_entries": 1000}

The default directory is ``$PLAIT_CACHE_DIR`` when set, else
``$XDG_CACHE_HOME/plait``, else ``~/.cache/plait``.

SQLite work runs inline on the event loop: a hit from disk is one indexed
read (about 15 µs) and a write one autocommitted insert (about 70 µs, no
fsync: WAL with ``synchronous=NORMAL``), measured against a call's ~0.5 ms
of client CPU; threads would cost more than they save.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import sqlite3
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from plait import _files
from plait.backends import providers
from plait.backends.types import Message, Request, Response, ToolCall, Usage
from plait.resources.config import EndpointConfig

__all__ = [
    "DEFAULT_MEMORY_ENTRIES",
    "CacheWarning",
    "MemoryLRU",
    "ResponseCacheStore",
    "SQLiteStore",
    "cache_key",
    "create_cache",
    "default_cache_path",
]

logger = logging.getLogger("plait.resources")

DEFAULT_MEMORY_ENTRIES = 10_000
"""Replies kept in memory per cache object unless ``memory_entries`` says otherwise."""

_KEY_FORMAT = 1  # part of every key: bump it when what goes into a key changes
_STORE_FORMAT = 1  # PRAGMA user_version of a plait cache file
_TABLE = "responses"

Entry = tuple[str, tuple[ToolCall, ...], int, int, str | None, str | None]
"""A cached reply: text, tool calls, input tokens, output tokens, finish reason, model."""


class CacheWarning(UserWarning):
    """A response cache file could not be used; calls bypass it."""


# -- keys -------------------------------------------------------------------------------


# Request fields the key spells out (or, for ``timeout``, leaves out: how long a
# caller waits changes nothing about the reply). Any field added to `Request`
# later goes into the key whenever it is set, so a new kind of input can never
# be answered with a reply cached without it.
_SPELLED_OUT = frozenset(
    {"messages", "model", "options", "tools", "tool_choice", "response_schema", "rollout_id"}
)
_EXTRA_FIELDS = tuple(
    f.name for f in dataclasses.fields(Request) if f.name not in _SPELLED_OUT | {"timeout"}
)


def cache_key(endpoint: EndpointConfig, request: Request) -> str:
    """Returns the SHA-256 (hex) of the canonical JSON of what decides the reply.

    Provider, model (the request's, else the endpoint's; the ``local``
    provider's ``model_path`` too), every field of every message, the
    sampling options that are set, tools, tool choice, response schema and,
    when set, ``rollout_id``. Never credentials, headers, base URLs or
    timeouts. Messages, tools and the schema are serialised field by field
    (orjson encodes the dataclasses whole), so a field added to them later
    changes the key instead of being ignored. An image, audio clip or document
    in a message counts by its `Media.key` (kind and SHA-256, computed once
    when it was built), never by its bytes.
    """
    payload: dict[str, Any] = {
        "format": _KEY_FORMAT,
        "provider": endpoint.provider,
        "model": request.model or endpoint.model,
        "messages": _keyed_messages(request.messages),
        "options": request.options.as_dict(),
        "tools": request.tools,
        "tool_choice": request.tool_choice,
        "response_schema": request.response_schema,
    }
    spec = providers.get(endpoint.provider)
    for name in () if spec is None else spec.cache_keys:  # local: the GGUF file answers
        payload[name] = getattr(endpoint, name)
    if request.rollout_id is not None:
        payload["rollout_id"] = request.rollout_id
    for name in _EXTRA_FIELDS:
        value = getattr(request, name)
        if value is not None and value != () and value != {}:
            payload[name] = value
    canonical = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def _keyed_messages(messages: tuple[Message, ...]) -> Any:
    """Returns the messages as the key sees them: media by their hash, not their bytes."""
    if not any(message.parts for message in messages):
        return messages  # text only: orjson encodes the dataclasses directly
    return [
        {name: getattr(message, name) for name in _MESSAGE_FIELDS if name != "parts"}
        | {"parts": [part if isinstance(part, str) else part.key for part in message.parts]}
        for message in messages
    ]


_MESSAGE_FIELDS = tuple(f.name for f in dataclasses.fields(Message))


# -- values -----------------------------------------------------------------------------


def _entry_of(response: Response) -> Entry:
    usage = response.usage
    return (
        response.text,
        tuple(response.tool_calls),
        usage.input_tokens,
        usage.output_tokens,
        response.finish_reason,
        response.model,
    )


def _response_of(entry: Entry) -> Response:
    """Returns a new `Response` (new usage and meta) the caller may change freely."""
    text, tool_calls, input_tokens, output_tokens, finish_reason, model = entry
    return Response(
        text,
        tool_calls=tool_calls,
        usage=Usage(input_tokens, output_tokens),
        finish_reason=finish_reason,
        model=model,
    )


def _encode(entry: Entry) -> bytes:
    text, tool_calls, input_tokens, output_tokens, finish_reason, model = entry
    return orjson.dumps(
        {
            "text": text,
            "tool_calls": [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in tool_calls
            ],
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
            "finish_reason": finish_reason,
            "model": model,
        }
    )


def _decode(raw: bytes | str) -> Entry | None:
    """Returns the entry stored as ``raw``, or None when it is not one (a miss)."""
    try:
        data = orjson.loads(raw)
        usage = data["usage"]
        return (
            str(data["text"]),
            tuple(
                ToolCall(str(c["id"]), str(c["name"]), str(c["arguments"]))
                for c in data["tool_calls"]
            ),
            int(usage["input_tokens"]),
            int(usage["output_tokens"]),
            data.get("finish_reason"),
            data.get("model"),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


# -- memory -----------------------------------------------------------------------------


class MemoryLRU:
    """At most ``max_entries`` replies in memory; the least recently used goes first.

    Args:
        max_entries: the bound; 0 keeps nothing (every lookup goes to disk).
    """

    __slots__ = ("_entries", "max_entries")

    def __init__(self, max_entries: int = DEFAULT_MEMORY_ENTRIES) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[str, Entry] = OrderedDict()

    def get(self, key: str) -> Entry | None:
        """Returns the entry and marks it recently used, or None."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: Entry) -> None:
        """Stores ``entry``, evicting the least recently used beyond the bound."""
        if not self.max_entries:
            return
        entries = self._entries
        entries[key] = entry
        entries.move_to_end(key)
        while len(entries) > self.max_entries:
            entries.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)


# -- disk -------------------------------------------------------------------------------

# SQLite answers BUSY/LOCKED while another process writes; that passes, so the
# lookup is a miss (or the write is skipped) and the file stays in use.
_TRANSIENT = frozenset({"SQLITE_BUSY", "SQLITE_LOCKED"})


class SQLiteStore:
    """The on-disk half of the cache: one SQLite file, keys to JSON values.

    Opened on construction. Any SQLite error other than a passing lock makes
    the store unusable: it warns once (`CacheWarning`, naming the file and
    the reason), closes the file and from then on every `get` misses and
    every `put` is dropped. `error` then says why.

    Thread-safe (one lock per store): `create_cache` shares one store
    between every cache of the process that names the same file, whatever
    thread or event loop they run on.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 2.0) -> None:
        self.path = Path(path)
        self.error: str | None = None
        """Why the store is bypassed, or None while it works."""
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            companions = (self.path.with_name(self.path.name + end) for end in ("-wal", "-shm"))
            _files.check_no_links(self.path, *companions)
            db = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            self._fail(exc)
            return
        self._db = db
        try:
            self._prepare(db)
        except sqlite3.Error as exc:
            self._fail(exc)

    def _prepare(self, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA journal_mode=WAL")  # reads the header: garbage fails here
        db.execute("PRAGMA synchronous=NORMAL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master")]
            if tables and _TABLE not in tables:
                raise sqlite3.DatabaseError(
                    f"it is an SQLite database of another program (tables {', '.join(tables)})"
                )
            db.execute(
                f"CREATE TABLE IF NOT EXISTS {_TABLE} "
                "(key TEXT PRIMARY KEY, value BLOB NOT NULL, created REAL NOT NULL) WITHOUT ROWID"
            )
            db.execute(f"PRAGMA user_version={_STORE_FORMAT}")
        elif version != _STORE_FORMAT:
            raise sqlite3.DatabaseError(
                f"it is in cache format {version}; this plait reads format {_STORE_FORMAT}"
            )

    @property
    def is_usable(self) -> bool:
        """Whether the file is open and working."""
        return self._db is not None

    def get(self, key: str) -> bytes | None:
        """Returns the stored value of ``key``, or None (also when the store is bypassed)."""
        if self._db is None:
            return None
        try:
            with self._lock:
                row = self._db.execute(
                    f"SELECT value FROM {_TABLE} WHERE key = ?", (key,)
                ).fetchone()
        except sqlite3.Error as exc:
            self._on_error(exc, "read")
            return None
        return None if row is None else row[0]

    def put(self, key: str, value: bytes) -> None:
        """Stores ``value`` under ``key`` (replacing it); dropped when the store is bypassed."""
        if self._db is None:
            return
        try:
            with self._lock:
                self._db.execute(
                    f"INSERT OR REPLACE INTO {_TABLE} (key, value, created) VALUES (?, ?, ?)",
                    (key, value, time.time()),
                )
        except sqlite3.Error as exc:
            self._on_error(exc, "write")

    def __len__(self) -> int:
        """Returns how many replies the file holds (0 when bypassed)."""
        if self._db is None:
            return 0
        try:
            with self._lock:
                return int(self._db.execute(f"SELECT count(*) FROM {_TABLE}").fetchone()[0])
        except sqlite3.Error as exc:
            self._on_error(exc, "count")
            return 0

    def close(self) -> None:
        """Closes the file (a WAL checkpoint folds pending writes into it)."""
        with self._lock:
            db, self._db = self._db, None
        if db is not None:
            try:
                db.close()
            except sqlite3.Error as exc:  # closing a broken file: nothing left to save
                logger.debug("closing response cache %s failed: %s", self.path, exc)

    def _on_error(self, exc: sqlite3.Error, action: str) -> None:
        name = getattr(exc, "sqlite_errorname", "")
        if name in _TRANSIENT or "locked" in str(exc):
            logger.debug("response cache %s busy on %s; skipped: %s", self.path, action, exc)
            return
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """Bypasses the store from now on and says so, once."""
        if self.error is not None:
            return
        self.error = str(exc) or type(exc).__name__
        self.close()
        # The state is final before the warning: under ``-W error`` it raises.
        warnings.warn(
            f"response cache {self.path} is unusable ({self.error}); it is bypassed and "
            "calls go to the provider. Delete or move the file to start a new cache.",
            CacheWarning,
            stacklevel=2,
        )


# One store per file per process, counted by the caches using it.
_stores: dict[Path, tuple[SQLiteStore, int]] = {}
_stores_lock = threading.Lock()


def _acquire_store(path: Path) -> SQLiteStore:
    with _stores_lock:
        store, users = _stores.get(path, (None, 0))
        if store is None:
            store = SQLiteStore(path)
        _stores[path] = (store, users + 1)
        return store


def _release_store(store: SQLiteStore) -> None:
    with _stores_lock:
        current, users = _stores.get(store.path, (None, 0))
        if current is not store:
            return
        if users > 1:
            _stores[store.path] = (store, users - 1)
            return
        del _stores[store.path]
    store.close()


# -- the cache --------------------------------------------------------------------------


class ResponseCacheStore:
    """A response cache: `MemoryLRU` in front of a shared `SQLiteStore`.

    Implements the manager's ``ResponseCache`` protocol (``key``, ``get``,
    ``put``, ``aclose``). Built by `create_cache` from an endpoint's config;
    build one yourself only to inspect or prefill a cache file.

    Args:
        path: the SQLite file (created, with its directory, if missing).
        memory_entries: replies kept in memory (0: none).

    Example::

        cache = ResponseCacheStore("/tmp/replies.sqlite", memory_entries=100)
        key = cache.key(endpoint_config, request)
        await cache.put(key, response)
        (await cache.get(key)).text == response.text     # True
        await cache.aclose()
    """

    def __init__(
        self, path: str | os.PathLike[str], memory_entries: int = DEFAULT_MEMORY_ENTRIES
    ) -> None:
        self.path = Path(path).expanduser().absolute()
        self.memory = MemoryLRU(memory_entries)
        self.store: SQLiteStore | None = _acquire_store(self.path)

    def key(self, endpoint: EndpointConfig, request: Request) -> str:
        """Returns the cache key of ``request`` on ``endpoint`` (see `cache_key`)."""
        return cache_key(endpoint, request)

    async def get(self, key: str) -> Response | None:
        """Returns a new `Response` for ``key``, or None on a miss."""
        entry = self.memory.get(key)
        if entry is None:
            store = self.store
            raw = store.get(key) if store is not None else None
            if raw is None:
                return None
            entry = _decode(raw)
            if entry is None:  # a value this plait cannot read: a miss, replaced on put
                return None
            self.memory.put(key, entry)
        return _response_of(entry)

    async def put(self, key: str, response: Response) -> None:
        """Stores the reply of a successful call (what it says, never its meta or cost)."""
        entry = _entry_of(response)
        self.memory.put(key, entry)
        if self.store is not None:
            self.store.put(key, _encode(entry))

    async def aclose(self) -> None:
        """Stops using the file; it closes when the last cache of the process lets go."""
        store, self.store = self.store, None
        if store is not None:
            _release_store(store)

    def __repr__(self) -> str:
        state = "bypassed" if self.store is None or not self.store.is_usable else "open"
        return (
            f"ResponseCacheStore({str(self.path)!r}, memory {len(self.memory)}/"
            f"{self.memory.max_entries}, {state})"
        )


def default_cache_path() -> Path:
    """Returns the file ``cache=True`` uses: ``responses.sqlite`` in the cache directory.

    The directory is ``$PLAIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/plait``,
    else ``~/.cache/plait``; read at each call, so a changed environment counts.
    """
    directory = os.environ.get("PLAIT_CACHE_DIR")
    if not directory:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg) if xdg else Path.home() / ".cache"
        directory = str(base / "plait")
    return Path(directory).expanduser() / "responses.sqlite"


def create_cache(endpoint: EndpointConfig) -> ResponseCacheStore:
    """Builds the response cache an endpoint's ``cache`` setting asks for.

    ``True`` uses `default_cache_path`; a string or path names the file; a
    mapping may give ``path`` (default: as for True) and ``memory_entries``.
    The manager calls this when it first routes a call to the endpoint.
    """
    setting = endpoint.cache
    path: Any = None
    memory_entries = DEFAULT_MEMORY_ENTRIES
    if isinstance(setting, Mapping):
        path = setting.get("path")
        if setting.get("memory_entries") is not None:
            memory_entries = setting["memory_entries"]
    elif isinstance(setting, str | os.PathLike):
        path = setting
    return ResponseCacheStore(path or default_cache_path(), memory_entries)
