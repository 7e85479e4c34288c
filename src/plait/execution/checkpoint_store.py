"""Where a checkpoint lives when a state store is given: rows of the table ``checkpoints``.

A run with a state store (``state=``, ``--state``, a ``[state]`` table) and
no ``checkpoint_dir`` keeps its finished items in the store, so a run killed
on one machine resumes on another. A row's key is ``run/<program>/<input>``:
``<program>`` a digest of the program's identity
(`plait.execution.checkpoint.program_identity`: graph, parameters, settings,
models) and of the batch's other arguments, ``<input>`` the item's input
hash. Nothing of the machine goes into it (no folder, no home directory, no
host), so the same program over the same rows finds its rows wherever it
runs; a changed program or item has other keys and simply runs. An item is
found by its input, not its position, so a rerun with other chunking, or a
Ray Data job whose blocks fall otherwise, finds what is done. Media bytes go
into rows ``blob/<sha256>``, stored once.

Reading happens once, when the batch opens, in pages of named keys
(`StateStore.get_many`), on the store's threads for PostgreSQL. A store that
cannot answer is asked again for `READ_WAIT` seconds (a restart), then the
batch stops with `CheckpointError`: reading "nothing done" would do the
finished rows again.

Writing is off the call's path: a finished item's row waits in memory and
goes with the others waiting in one statement (`StateStore.add_many`), one
batch in flight. A batch the store did not take (down, restarting, too slow)
is kept and sent again, every 2 s at most (`Backoff`), until the store
answers: a database restart loses no row and makes no row run twice. Memory
is bounded: past `MAX_WAITING_ROWS` rows or `MAX_WAITING_BYTES` waiting, the
batch waits for the store before more items finish. When the batch ends it
waits for its rows at most `CLOSE_WAIT` seconds; rows still unwritten then
are named in a `StateWarning` (a rerun does them again), never dropped
silently; a batch run with ``deadline=`` waits no longer than its deadline
leaves. A run killed with SIGKILL loses the rows of the write in flight
(milliseconds of work), which a rerun does again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import warnings
from collections.abc import Awaitable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from plait.execution.checkpoint_codec import CheckpointError
from plait.media import Media
from plait.resources.state import (
    MAX_VALUE_BYTES,
    StateOversized,
    StateUnavailable,
    StateURL,
    StateWarning,
    on_loop,
    open_store,
    release_store,
)
from plait.resources.state.backoff import Backoff
from plait.resources.state.base import SCAN_PAGE

if TYPE_CHECKING:
    from plait.execution.checkpoint import Checkpoint

__all__ = [
    "CLOSE_WAIT",
    "MAX_WAITING_BYTES",
    "MAX_WAITING_ROWS",
    "READ_WAIT",
    "StoreRecords",
    "run_prefix",
]

logger = logging.getLogger("plait.execution")

TABLE = "checkpoints"
MAX_WAITING_ROWS = 10_000
"""Rows waiting for the store past which a batch waits before more items finish."""
MAX_WAITING_BYTES = 64 * 1024 * 1024
"""Bytes waiting for the store past which a batch waits before more items finish."""
WRITE_BATCH = 500
"""Rows sent in one statement at most."""
READ_WAIT = 30.0
"""Seconds a batch asks a store that cannot answer for its finished rows before it stops."""
CLOSE_WAIT = 30.0
"""Seconds a finished batch waits for its rows to be written."""


def run_prefix(identity: dict[str, Any], call_args: str) -> str:
    """Returns the key prefix of a program's rows: ``run/<digest>/``, the digest of its
    identity and of ``call_args`` (the hash of the batch's other arguments)."""
    text = json.dumps([identity, call_args], sort_keys=True, ensure_ascii=False)
    return f"run/{hashlib.sha256(text.encode()).hexdigest()[:32]}/"


class StoreRecords:
    """The finished items of a checkpoint in a state store (see the module docstring).

    Args:
        url: the state store; opened here, let go of by `aclose`.
        prefix: the program's key prefix (`run_prefix`).
    """

    def __init__(self, url: StateURL, prefix: str) -> None:
        self.store = open_store(url)
        self.prefix = prefix
        self.where = f"checkpoint {prefix.rstrip('/')} in state store {url}"
        """How messages name this checkpoint."""
        self.blobs = StoreBlobs(self)
        self._waiting: list[tuple[str, bytes]] = []
        self._waiting_bytes = 0
        self._flushing: asyncio.Task[None] | None = None
        self._room = asyncio.Event()
        self._room.set()
        self._backoff = Backoff(logger, self.where)

    # -- reading ------------------------------------------------------------------------
    async def load(self, checkpoint: Checkpoint) -> None:
        """Restores into ``checkpoint`` every item whose row the store holds.

        Raises:
            CheckpointError: the store did not answer for `READ_WAIT` seconds, or a
                row cannot be restored (its key named).
        """
        indices: dict[str, list[int]] = {}
        for index, digest in enumerate(checkpoint.item_hashes):
            indices.setdefault(digest, []).append(index)
        for page in _pages(list(indices), SCAN_PAGE):
            found = await self._read([self.prefix + digest for digest in page])
            for key, value in found.items():
                for index in indices.get(key[len(self.prefix) :], ()):
                    problem = checkpoint.restore_line(value, index)
                    if problem is not None:
                        raise CheckpointError(
                            f"{self.where}: row {key!r}: {problem}. Delete that row (its item "
                            "then runs again)"
                        )

    async def _read(self, keys: list[str]) -> dict[str, bytes]:
        """One page of rows, asked again while the store cannot answer (at most `READ_WAIT`)."""
        store = self.store
        loop = asyncio.get_running_loop()
        give_up = loop.time() + READ_WAIT
        while True:
            try:
                found = await on_loop.call(store, store.get_many, TABLE, keys, default=None)
                reason = "it did not answer in time"
            except StateUnavailable as exc:
                found, reason = None, str(exc)
            if found is not None:
                return found
            if loop.time() > give_up or not store.is_usable:
                raise CheckpointError(
                    f"{self.where} cannot be read ({reason}); the run stops rather than do "
                    "its finished rows again. Run it again when the store answers"
                )
            await asyncio.sleep(0.5)

    # -- writing ------------------------------------------------------------------------
    def append(self, index: int, input_hash: str, line: str) -> Awaitable[Any] | None:
        """Queues a finished item's row; returns something to wait for when too many rows
        wait for the store already (the batch then waits before more items finish)."""
        self.add_row(self.prefix + input_hash, line.encode())
        return None if self._room.is_set() else self._room.wait()

    def add_row(self, key: str, value: bytes) -> None:
        """Queues one row for the store and starts a write unless one is on its way."""
        self._waiting.append((key, value))
        self._waiting_bytes += len(value)
        self._update_room()
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    def _update_room(self) -> None:
        full = len(self._waiting) >= MAX_WAITING_ROWS or self._waiting_bytes >= MAX_WAITING_BYTES
        if full and self.store.is_usable:
            self._room.clear()
        else:
            self._room.set()

    async def _flush(self) -> None:
        """Sends the waiting rows, a batch at a time, until none waits; a batch the store
        did not take goes back to the front and is sent again after a pause."""
        store = self.store
        try:
            while self._waiting:
                batch = self._waiting[:WRITE_BATCH]
                missing = await on_loop.call(store, self._write, batch, default=batch)
                del self._waiting[: len(batch)]
                self._waiting_bytes -= sum(len(value) for _, value in batch)
                if not missing:
                    self._backoff.took("rows")
                    self._update_room()
                    continue
                self._waiting[:0] = missing
                self._waiting_bytes += sum(len(value) for _, value in missing)
                if not store.is_usable:  # closed, or an SQLite file bypassed for good
                    break
                self._update_room()
                await self._backoff.failed(
                    "the store did not take %d rows; they are kept and sent again until it "
                    "answers (the run waits past %d rows)",
                    len(missing),
                    MAX_WAITING_ROWS,
                )
        finally:
            self._flushing = None
            self._update_room()

    def _write(self, batch: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """Writes ``batch`` (on the store's threads for PostgreSQL); returns the rows the
        store does not hold after it. ``add_many`` counts only new rows, so when it counts
        fewer the rows are looked up: another writer of the same row is no failure. A row
        over the cap under one of the keys was not written by plait; the batch counts as
        held, and the next run's `load` refuses that row by name."""
        if self.store.add_many(TABLE, batch) == len(batch):
            return []
        try:
            present: dict[str, bytes] = {}
            for page in _pages([key for key, _ in batch], SCAN_PAGE):
                present.update(self.store.get_many(TABLE, page))
        except StateUnavailable:
            return list(batch)
        except StateOversized as exc:
            logger.warning("%s: %s", self.where, exc)
            return []
        return [(key, value) for key, value in batch if key not in present]

    async def aclose(self, until: float | None = None) -> None:
        """Waits at most `CLOSE_WAIT` seconds for the rows on their way, and no later than
        ``until`` (a loop time: the batch's deadline), says which were not written, and
        lets go of the store."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + CLOSE_WAIT
        if until is not None:
            give_up = min(give_up, until)
        while self._flushing is not None and loop.time() < give_up:
            await asyncio.wait([self._flushing], timeout=give_up - loop.time())
        if self._flushing is not None:
            self._flushing.cancel()
            await asyncio.gather(self._flushing, return_exceptions=True)
        if self._waiting:
            warnings.warn(
                f"{self.where}: {len(self._waiting)} finished rows could not be written (the "
                "store did not answer); a rerun does them again",
                StateWarning,
                stacklevel=2,
            )
            self._waiting = []
        release_store(self.store)


class StoreBlobs:
    """Media bytes of a store checkpoint: rows ``blob/<sha256>``, written with the rows."""

    def __init__(self, records: StoreRecords) -> None:
        self._records = records

    def put(self, item: Media) -> None:
        """Queues the bytes of ``item`` ahead of the row that names them.

        Raises:
            CheckpointError: the bytes are larger than a state store keeps.
        """
        data = item.data or b""
        if len(data) > MAX_VALUE_BYTES:
            raise CheckpointError(
                f"its {len(data):,}-byte {item.kind} is larger than a state store keeps "
                f"({MAX_VALUE_BYTES:,} bytes)"
            )
        self._records.add_row(f"blob/{item.sha256}", data)

    def get(self, digest: str) -> bytes:
        """Returns the bytes stored under ``digest``, checked against it. It reads on the
        caller's thread: media among restored outputs are rare, and this runs once, when
        a batch opens.

        Raises:
            ValueError: the blob is missing or changed since it was written.
        """
        data = self._records.store.get(TABLE, f"blob/{digest}")
        if data is None:
            raise ValueError(f"its media row blob/{digest} is missing")
        if hashlib.sha256(data).hexdigest() != digest:
            raise ValueError(f"its media row blob/{digest} was changed since it was written")
        return data


def _pages(keys: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(keys), size):
        yield keys[start : start + size]
