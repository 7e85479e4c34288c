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
`CheckpointError` (reading "nothing saved" would redo every finished trial).
A value is JSON the store caps at `MAX_VALUE_BYTES`, parsed with the same
bound on nesting as a file, so nothing read chooses code to run. A write the
store does not take warns (`StateWarning`) and the work goes on; a rerun then
redoes what that save would have kept.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from plait import _files, _jsontext
from plait.execution.checkpoint_codec import CheckpointError
from plait.resources.state import (
    StateUnavailable,
    StateURL,
    StateWarning,
    open_store,
    release_store,
)

__all__ = ["TABLE", "CheckpointPlace"]

TABLE = "learning"


class CheckpointPlace:
    """One checkpoint document: the file ``path``, or the key ``key`` of the store ``state``."""

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
        """Keeps ``text`` (JSON) here, replacing what was kept; a no-op where nothing is."""
        if self.state is not None:
            store = open_store(self.state)
            try:
                stored = store.put(TABLE, self.key, text.encode("utf-8"))
            finally:
                release_store(store)
            if not stored:
                warnings.warn(
                    f"{self.name}: the checkpoint was not saved; the work goes on, and a rerun "
                    "does again what this save would have kept",
                    StateWarning,
                    stacklevel=2,
                )
        elif self.path is not None:
            with _files.replacing(self.path, error=CheckpointError) as file:
                file.write(text)
