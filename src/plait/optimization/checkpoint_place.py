"""Where a search's or a Trainer's checkpoint is kept: a JSON file, or one key of a state store.

Both checkpoints are one JSON document rewritten as the work goes on. Given a
path (``checkpoint=``, ``checkpoint_dir=``), it is that file, written
atomically through `plait._files`. Given a state store (``state=``,
``--state``) and no path, it is one key of the store's table ``learning``:
put on every save, got once on resume, so a search or a training stopped on
one machine resumes on another.

The key names the work by what stays the same while it goes on, and nothing
of the machine: a search's class with its data and settings, a Trainer's
settings and data. The program is not in it (a search changes the program it
is given, and a rerun may be given the changed one): the document says which
program it was for, and its reader refuses another as it refuses another
file's, before any call.

A read goes to the store once; a store that cannot answer stops the work with
`CheckpointError` (reading "nothing saved" would redo every finished trial),
and one that cannot be reached at all with `StateError`, naming its host and
port. A value is JSON the store caps at `MAX_VALUE_BYTES` (a larger document
is refused when written, `CheckpointError`), parsed with the same bound on
nesting as a file, so nothing read chooses code to run.

Writing to a store is off the work's path, as a run checkpoint's rows are
(`plait.execution.checkpoint_store`): a save hands the document to one writer
on the store's threads and the work goes on. Only the latest document
matters (each holds all the work so far), so while the store is down or
restarting the writer keeps the latest one and tries it again every
2 s at most (`Backoff`): a database restart mid-search or mid-training
loses no trial and makes none run twice on a later resume. When the work
ends (`aclose`) it waits at most `CLOSE_WAIT` seconds for the last document;
one still unwritten then is named in a `StateWarning` (a rerun does again
what it holds), never dropped silently.
"""

from __future__ import annotations

import asyncio
import logging
import os
import warnings
from pathlib import Path
from typing import Any

from plait import _files, _jsontext
from plait.execution.checkpoint_codec import CheckpointError
from plait.resources.state import (
    MAX_VALUE_BYTES,
    StateError,
    StateStore,
    StateUnavailable,
    StateURL,
    StateWarning,
    on_loop,
    open_store,
    release_store,
)
from plait.resources.state.backoff import Backoff

__all__ = ["CLOSE_WAIT", "TABLE", "CheckpointPlace"]

logger = logging.getLogger("plait.optimization")

TABLE = "learning"
CLOSE_WAIT = 30.0
"""Seconds the end of the work waits for its last document to be written."""


class CheckpointPlace:
    """One checkpoint document: the file ``path``, or the key ``key`` of the store ``state``.

    A place in a store holds the store open from its first write to `aclose`, which the
    work calls when it ends (also when it fails), and may be written again after.
    """

    def __init__(
        self,
        path: Path | None = None,
        *,
        state: str | os.PathLike[str] | StateURL | None = None,
        key: str = "",
    ) -> None:
        self.path = path
        self.state = StateURL.parse(state) if path is None and state is not None else None
        self.key = key
        self._store: StateStore | None = None
        self._latest: bytes | None = None
        """The newest document the store has not taken yet."""
        self._writer: asyncio.Task[None] | None = None
        self._backoff = Backoff(logger, self.name)

    @property
    def kept(self) -> bool:
        """Whether a document is kept at all (neither a path nor a store: nothing is)."""
        return self.path is not None or self.state is not None

    @property
    def name(self) -> str:
        """The place in messages: the file, or the store (password masked) and the key."""
        if self.state is None:
            return str(self.path)
        return f"state store {self.state} (table {TABLE}, key {self.key})"

    def remedy(self, other: str) -> str:
        """What to do about a document not for this work; ``other`` the file case's words
        (``another checkpoint file``)."""
        if self.state is None:
            return f"delete it to start over, or use {other}"
        return (
            f"delete that key to start over (plait state prune --table {TABLE}), "
            "or use another state store"
        )

    def read(self, remedy: str) -> Any:
        """Returns the JSON document kept here, or None when there is none.

        Raises:
            CheckpointError: the file is a link, not a regular file or not JSON;
                the stored value is not JSON; the store cannot answer.
            StateError: the store cannot be reached at all (its host and port named).
        """
        if self.state is None:
            if self.path is None:
                return None
            return _files.read_json(self.path, error=CheckpointError, remedy=remedy)
        store = open_store(self.state)
        try:
            raw = store.get_many(TABLE, [self.key]).get(self.key)
        except StateUnavailable as exc:
            raise CheckpointError(
                f"{self.name} cannot be read ({exc}); rerun when the store is back"
            ) from None
        finally:
            release_store(store)
        if raw is None:
            return None
        try:
            return _jsontext.loads(raw.decode("utf-8"))
        except _jsontext.TooDeep:
            raise CheckpointError(
                f"{self.name} is nested too deeply to be plait's: {remedy}"
            ) from None
        except ValueError as exc:  # UnicodeDecodeError is one too
            raise CheckpointError(f"{self.name} is not valid JSON ({exc}): {remedy}") from None

    def write(self, text: str) -> None:
        """Keeps ``text`` (JSON) here, replacing what was kept; a no-op where nothing is.

        A store's write is started, not waited for (see the module docstring); it must be
        called on the event loop the work runs on.

        Raises:
            CheckpointError: the document is larger than a state store keeps.
        """
        if self.state is not None:
            data = text.encode("utf-8")
            if len(data) > MAX_VALUE_BYTES:
                raise CheckpointError(
                    f"{self.name}: the checkpoint is {len(data):,} bytes, more than a state "
                    f"store keeps ({MAX_VALUE_BYTES:,}); give a checkpoint file instead"
                )
            self._latest = data
            if self._writer is None:
                self._writer = asyncio.get_running_loop().create_task(self._send())
        elif self.path is not None:
            with _files.replacing(self.path, error=CheckpointError) as file:
                file.write(text)

    async def _send(self) -> None:
        """Writes the latest document until the store takes one no older than any save."""
        assert self.state is not None
        try:
            while self._latest is not None:
                data = self._latest
                if await self._put(data):
                    if self._latest is data:
                        self._latest = None
                    self._backoff.took("the checkpoint")
                    continue
                if self._store is not None and not self._store.is_usable:
                    break  # closed, or an SQLite file bypassed for good
                await self._backoff.failed(
                    "the store did not take the checkpoint; the latest one is kept and "
                    "written when it answers (the work goes on)"
                )
        finally:
            self._writer = None

    async def _put(self, data: bytes) -> bool:
        """One try of the store's ``put``, opening the store first if need be (a server
        unreachable now is tried again later, as one that broke under a write is)."""
        assert self.state is not None
        if self._store is None:
            try:
                self._store = await asyncio.to_thread(open_store, self.state)
            except StateError:
                return False
        store = self._store
        return await on_loop.call(store, store.put, TABLE, self.key, data, default=False)

    async def aclose(self) -> None:
        """Waits at most `CLOSE_WAIT` seconds for the last document, says if it was not
        written, and lets go of the store."""
        writer = self._writer
        if writer is not None:
            await asyncio.wait([writer], timeout=CLOSE_WAIT)
            if not writer.done():
                writer.cancel()
                await asyncio.gather(writer, return_exceptions=True)
        if self._latest is not None:
            self._latest = None
            warnings.warn(
                f"{self.name}: the last checkpoint could not be written (the store did not "
                f"answer for {CLOSE_WAIT:.0f} s); a rerun does again what was done since the "
                "last one it took",
                StateWarning,
                stacklevel=2,
            )
        if self._store is not None:
            store, self._store = self._store, None
            release_store(store)
