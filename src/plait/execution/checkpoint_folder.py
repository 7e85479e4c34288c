"""Where a checkpoint lives when it is a folder (``checkpoint_dir``): its files.

The folder holds two files (and ``blobs/``, the bytes of any image, audio or
document among the outputs, each stored once under its SHA-256; see
`plait.execution.checkpoint_codec`):

* ``manifest.json`` — which program and which inputs the checkpoint belongs
  to (`plait.execution.checkpoint.program_identity` and a hash of every input
  item). A rerun with another program, changed prompts or other inputs is
  refused with a `CheckpointMismatchError` naming what changed, never mixed in.
* ``items.jsonl`` — one JSON line per finished item, written and flushed the
  moment the item finishes. A crash can tear at most the line being written;
  a line that is not JSON, or longer than any line plait writes, is skipped
  on resume and its item runs again. The file is read a line at a time, so
  junk appended to it costs no more memory than one line.

A checkpoint folder may have been prepared by someone else, so plait opens
only regular files in it, never through a symbolic link (a link named
``items.jsonl`` could otherwise make it append to any file the user can
write), and writes the manifest through `plait._files` like every file it writes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from plait import _files
from plait.execution.checkpoint_codec import CheckpointError, MediaBlobs

if TYPE_CHECKING:
    from plait.execution.checkpoint import Checkpoint

__all__ = ["MAX_LINE", "CheckpointMismatchError", "FolderRecords"]

_MANIFEST = "manifest.json"
_ITEMS = "items.jsonl"
_BLOBS = "blobs"
_FORMAT = 2
MAX_LINE = 8 * 1024 * 1024
"""The longest record a checkpoint writes or reads back (bytes, newline included)."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint directory was written by another program or for other inputs."""


class FolderRecords:
    """The finished items of a checkpoint in a folder (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.where = f"checkpoint in {self.directory}"
        """How messages name this checkpoint."""
        self.blobs = MediaBlobs(self.directory / _BLOBS)
        self._file: IO[str] | None = None

    async def load(self, checkpoint: Checkpoint) -> None:
        """Checks the manifest (or writes it), restores the finished items into
        ``checkpoint`` and opens the items file for appending.

        Raises:
            CheckpointMismatchError: the folder belongs to another program or inputs.
            CheckpointError: the folder or a file in it cannot be used safely, or a
                line cannot be restored (file and line named).
        """
        _prepare_directory(self.directory)
        manifest_path = self.directory / _MANIFEST
        items_path = self.directory / _ITEMS
        manifest = _files.read_json(
            manifest_path,
            error=CheckpointError,
            remedy="use another checkpoint_dir, or delete this one (its lines belong to it)",
        )
        torn = False
        if manifest is not None:
            self._check_manifest(manifest, checkpoint)
            torn = self._load_items(items_path, checkpoint)
        else:
            manifest = {
                "format": _FORMAT,
                "program": checkpoint.identity,
                "inputs_hash": checkpoint.inputs_hash,
                "items": len(checkpoint.item_hashes),
            }
            text = json.dumps(manifest, indent=2) + "\n"
            _files.write_atomically(manifest_path, text, error=CheckpointError)
        self._file = _files.open_for_writing(items_path, append=True, error=CheckpointError)
        if torn:
            self._file.write("\n")  # end a line torn by a crash so the next record stands alone

    def _check_manifest(self, found: Any, checkpoint: Checkpoint) -> None:
        if not isinstance(found, dict) or found.get("format") != _FORMAT:
            version = found.get("format") if isinstance(found, dict) else None
            raise CheckpointMismatchError(
                f"checkpoint in {self.directory} has format {version!r}, this plait writes "
                f"{_FORMAT}; use another checkpoint_dir or delete this one"
            )
        changes = _identity_changes(found.get("program"), checkpoint.identity)
        if changes:
            listed = "\n".join(f"  - {line}" for line in changes)
            raise CheckpointMismatchError(
                f"checkpoint in {self.directory} was written by a different program; what "
                f"changed since:\n{listed}\nIts outputs would not be what this program "
                "answers: use another checkpoint_dir or delete this one"
            )
        if found.get("inputs_hash") != checkpoint.inputs_hash:
            raise CheckpointMismatchError(
                f"checkpoint in {self.directory} was written for different inputs "
                f"({found.get('items')} items then, {len(checkpoint.item_hashes)} now, or "
                "changed items); use another checkpoint_dir or delete this one"
            )

    def _load_items(self, path: Path, checkpoint: Checkpoint) -> bool:
        """Restores the finished items in ``path``; returns whether its last line is torn."""
        file = _files.open_for_reading(path, error=CheckpointError)
        if file is None:
            return False
        with file:
            for line_number, line in enumerate(_files.read_lines(file, MAX_LINE), 1):
                problem = checkpoint.restore_line(line)
                if problem is not None:
                    raise CheckpointError(
                        f"{path}:{line_number}: {problem}. Delete that line (the item then "
                        "runs again) or the checkpoint directory"
                    )
            return _ends_torn(file)

    def append(self, index: int, input_hash: str, line: str) -> None:
        """Appends a finished item's line and flushes it to the operating system at once."""
        if self._file is None:
            raise CheckpointError(f"the checkpoint in {self.directory} is closed")
        self._file.write(line + "\n")
        self._file.flush()

    async def aclose(self, until: float | None = None) -> None:
        """Closes the items file (at once: ``until`` is for a store's writes)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _identity_changes(old: Any, new: dict[str, Any]) -> list[str]:
    """Returns one line per difference between two identities (what a mismatch names)."""
    if not isinstance(old, dict):
        return ["the manifest holds no program identity"]
    lines = []
    if old.get("graph") != new["graph"]:
        lines.append("the structure of the program (the graph its forward traces to)")
    lines += _named_changes("parameter", old.get("parameters"), new["parameters"])
    given = old.get("settings")
    old_settings: dict[str, Any] = given if isinstance(given, dict) else {}
    for path in sorted(set(old_settings) | set(new["settings"])):
        before, after = old_settings.get(path), new["settings"].get(path)
        if before != after:
            keys = sorted(
                k
                for k in {*(before or {}), *(after or {})}
                if (before or {}).get(k) != (after or {}).get(k)
            )
            lines.append(f"the settings of module {path!r}: {', '.join(keys)}")
    given = old.get("models")
    old_models: dict[str, Any] = given if isinstance(given, dict) else {}
    for alias, model in new["models"].items():
        if old_models.get(alias) not in (None, model):
            lines.append(f"the model of alias {alias!r}: {old_models[alias]} then, {model} now")
    return lines


def _named_changes(what: str, old: Any, new: dict[str, str]) -> list[str]:
    old = old if isinstance(old, dict) else {}
    lines = [
        f"the value of {what} {name!r}" for name in new if name in old and old[name] != new[name]
    ]
    lines += [f"{what} {name!r} is new" for name in new if name not in old]
    lines += [f"{what} {name!r} is gone" for name in old if name not in new]
    return lines


def _prepare_directory(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CheckpointError(
            f"checkpoint_dir {directory} exists but is not a directory; "
            "give the path of a directory (it is created if missing)"
        ) from None
    except OSError as exc:
        raise CheckpointError(f"checkpoint_dir {directory} cannot be created: {exc}") from None


def _ends_torn(file: Any) -> bool:
    """Whether a non-empty file's last byte is not a newline (a crash tore its last line)."""
    size = file.seek(0, os.SEEK_END)
    if size == 0:
        return False
    file.seek(size - 1)
    return file.read(1) != b"\n"
