"""Response cache: a memory LRU in front of a state store (an SQLite file, or PostgreSQL).

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
pickle, so a stored reply cannot run code when read. The replies live in
the table ``responses`` of a state store (`plait.resources.state`), shared
by every cache object of the process that names the same store: an SQLite
file in WAL mode (a file SQLite cannot read is reported once with a
`CacheWarning` naming it and then bypassed: calls go to the provider and
nothing is written to it), or a PostgreSQL schema that every process and
machine shares (the first reply stored under a key stays).

Configuration (``cache`` in an endpoint)::

    "cache": True                                   # ~/.cache/plait/responses.sqlite
    "cache": "runs/responses.sqlite"                # that file
    "cache": {"path": "runs/r.sqlite", "memory_entries": 1000}

With a state URL (``ResourceConfig(..., state=...)``, ``plait.run(...,
state=...)``, a ``[state]`` table with ``url`` in a resources file,
``--state``), ``True`` and a mapping without ``path`` keep the cache in that
store instead; a ``path`` the endpoint names itself still wins.

The default directory is ``$PLAIT_CACHE_DIR`` when set, else
``$XDG_CACHE_HOME/plait``, else ``~/.cache/plait``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from plait.backends import providers
from plait.backends.types import Message, Request, Response, ToolCall, Usage
from plait.resources.config import EndpointConfig
from plait.resources.state import (
    StateStore,
    StateURL,
    StateWarning,
    on_loop,
    open_store,
    release_store,
)

__all__ = [
    "DEFAULT_MEMORY_ENTRIES",
    "MAX_PENDING_WRITES",
    "CacheWarning",
    "MemoryLRU",
    "ResponseCacheStore",
    "cache_key",
    "create_cache",
    "default_cache_path",
]

logger = logging.getLogger("plait.resources")

DEFAULT_MEMORY_ENTRIES = 10_000
"""Replies kept in memory per cache object unless ``memory_entries`` says otherwise."""

_KEY_FORMAT = 1  # part of every key: bump it when what goes into a key changes
_TABLE = "responses"

MAX_PENDING_WRITES = 10_000
"""Writes to a PostgreSQL store waiting for the batch in flight, per cache; more are dropped."""

Entry = tuple[str, tuple[ToolCall, ...], int, int, str | None, str | None]
"""A cached reply: text, tool calls, input tokens, output tokens, finish reason, model."""


CacheWarning = StateWarning
"""A response cache file could not be used; calls bypass it (the state store's warning)."""


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


# -- the cache --------------------------------------------------------------------------


class ResponseCacheStore:
    """A response cache: `MemoryLRU` in front of the table ``responses`` of a state store.

    Implements the manager's ``ResponseCache`` protocol (``key``, ``get``,
    ``put``, ``aclose``). Built by `create_cache` from an endpoint's config;
    build one yourself only to inspect or prefill a cache.

    The store is an SQLite file (worked inline: about 15 µs a read) or a
    PostgreSQL server (`plait.resources.state`): a lookup there is read on
    the event loop itself, with the other lookups of the loop's turn
    (`plait.resources.state.pg_loop`), and waits at most the store's timeout
    (and never past the call's deadline, which cancels it); a write is not waited for: writes go
    in batches, one batch in flight at a time (at most `MAX_PENDING_WRITES`
    waiting, the rest dropped), and `aclose` waits for those on their way. A
    failed lookup misses and a failed write is dropped: the cache never fails
    a call.

    Args:
        location: the SQLite file (created, with its directory, if missing)
            or a state URL (`plait.resources.state.StateURL`).
        memory_entries: replies kept in memory (0: none).

    Raises:
        StateError: a PostgreSQL store cannot be reached or is newer than this plait.

    Example::

        cache = ResponseCacheStore("/tmp/replies.sqlite", memory_entries=100)
        key = cache.key(endpoint_config, request)
        await cache.put(key, response)
        (await cache.get(key)).text == response.text     # True
        await cache.aclose()
    """

    def __init__(
        self,
        location: str | os.PathLike[str] | StateURL,
        memory_entries: int = DEFAULT_MEMORY_ENTRIES,
    ) -> None:
        if isinstance(location, StateURL) or (isinstance(location, str) and "://" in location):
            self.url = StateURL.parse(location)
        else:
            self.url = StateURL.parse(Path(location).expanduser().absolute())
        self.path = Path(self.url.target) if self.url.kind == "sqlite" else None
        """The SQLite file, or None for a PostgreSQL store."""
        self.memory = MemoryLRU(memory_entries)
        self.store: StateStore | None = open_store(self.url)
        self._pending: list[tuple[str, bytes]] = []  # writes not yet sent (PostgreSQL)
        self._flushing: asyncio.Future[int] | None = None
        self._reads: Any = None  # PostgreSQL: lookups read on the loop (`LoopReads`)

    def key(self, endpoint: EndpointConfig, request: Request) -> str:
        """Returns the cache key of ``request`` on ``endpoint`` (see `cache_key`)."""
        return cache_key(endpoint, request)

    async def get(self, key: str) -> Response | None:
        """Returns a new `Response` for ``key``, or None on a miss."""
        entry = self.memory.get(key)
        if entry is None:
            store = self.store
            if store is None:
                return None
            raw = await self._lookup(store, key) if store.blocking else store.get(_TABLE, key)
            if raw is None:
                return None
            entry = _decode(raw)
            if entry is None:  # a value this plait cannot read: a miss, replaced on put
                on_loop.send(store, store.delete, _TABLE, key)
                return None
            self.memory.put(key, entry)
        return _response_of(entry)

    async def put(self, key: str, response: Response) -> None:
        """Stores the reply of a successful call (what it says, never its meta or cost).

        The first reply stored under a key stays: another process writing the
        same key at once leaves one row.
        """
        entry = _entry_of(response)
        self.memory.put(key, entry)
        store = self.store
        if store is None:
            return
        if not store.blocking:
            store.add(_TABLE, key, _encode(entry))
        elif len(self._pending) < MAX_PENDING_WRITES:
            self._pending.append((key, _encode(entry)))
            if self._flushing is None:
                self._flush(store)
        else:
            logger.debug("response cache %s: too many writes pending; one dropped", self.url)

    async def _lookup(self, store: StateStore, key: str) -> bytes | None:
        """Reads ``key`` from a store on a network: on the running loop itself with the
        other lookups of the loop's turn when the store offers it (PostgreSQL's
        `LoopReads`: one round trip for them all, no thread in between), else on the
        store's threads (`on_loop`)."""
        reads = self._reads
        if reads is None or reads.loop is not asyncio.get_running_loop():
            make = getattr(store, "loop_reads", None)
            if make is None:
                return await on_loop.call(store, _read_one, store, key, default=None)
            self._reads = reads = make(_TABLE)
        found: bytes | None = await reads.get(key)
        return found

    def _flush(self, store: StateStore) -> None:
        """Sends the pending writes as one batch on the store's threads; the next batch
        goes when it is done (one batch in flight per cache)."""
        batch, self._pending = self._pending, []
        loop = asyncio.get_running_loop()
        flushing = loop.run_in_executor(_executor(store), store.add_many, _TABLE, batch)
        self._flushing = flushing

        def done(future: asyncio.Future[int]) -> None:
            self._flushing = None
            if not future.cancelled() and future.exception() is not None:
                logger.debug("response cache %s: a write failed: %s", self.url, future.exception())
            if self._pending and self.store is store:
                self._flush(store)

        flushing.add_done_callback(done)

    async def aclose(self) -> None:
        """Waits (at most twice the store's timeout) for writes on their way, then lets go
        of the store; it closes when the last cache of the process lets go."""
        store = self.store
        if store is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * getattr(store, "timeout", 0.0)
        while self._flushing is not None and deadline > loop.time():
            await asyncio.wait([self._flushing], timeout=deadline - loop.time())
        if self._reads is not None:
            self._reads.close()
            self._reads = None
        self.store = None
        release_store(store)

    def __repr__(self) -> str:
        state = "bypassed" if self.store is None or not self.store.is_usable else "open"
        where = str(self.path) if self.path is not None else str(self.url)
        return (
            f"ResponseCacheStore({where!r}, memory {len(self.memory)}/"
            f"{self.memory.max_entries}, {state})"
        )


def _read_one(store: StateStore, key: str) -> bytes | None:
    """``store.get`` of the cache's table (a store that cannot answer: None, a miss)."""
    return store.get(_TABLE, key)


def _executor(store: StateStore) -> Any:
    """Returns the threads a blocking store's calls run on."""
    return getattr(store, "executor", None)


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


def create_cache(
    endpoint: EndpointConfig, state: str | StateURL | None = None
) -> ResponseCacheStore:
    """Builds the response cache an endpoint's ``cache`` setting asks for.

    ``True`` uses ``state`` when given, else `default_cache_path`; a string
    or path names the file (or a state URL); a mapping may give ``path``
    (default: as for True) and ``memory_entries``. The manager calls this
    when it first routes a call to the endpoint, with its configuration's
    ``state``.

    Raises:
        StateError: the state store is PostgreSQL and cannot be reached.
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
    return ResponseCacheStore(path or state or default_cache_path(), memory_entries)
