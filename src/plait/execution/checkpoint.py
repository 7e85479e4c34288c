"""Checkpoints: finished batch items on disk, so an interrupted batch resumes.

A checkpoint directory holds two files:

* ``manifest.json`` — which program and which inputs the checkpoint belongs
  to: the program's *identity* (the shape of its graph, every parameter value,
  every setting that changes a request, the model behind each alias) and a
  hash of every input item. A rerun with another program, changed prompts or
  other inputs is refused with a `CheckpointMismatchError` naming what
  changed, never mixed in.
* ``items.jsonl`` — one JSON line per finished item (index, input hash,
  output, its shape, usage), written and flushed the moment the item
  finishes. A crash can tear at most the line being written; a line that is
  not JSON is skipped on resume and its item runs again.

The files are data, never code: outputs are JSON restored only as types the
program declares (`plait.execution.checkpoint_codec`), never pickle and never
a class named in the file. A checkpoint directory may have been prepared by
someone else, so plait opens only regular files in it and never follows a
symbolic link there (a link named ``items.jsonl`` could otherwise make it
append to any file the user can write).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from plait.execution.checkpoint_codec import CheckpointError, OutputCodec

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointMismatchError",
    "input_hash",
    "program_identity",
]

_MANIFEST = "manifest.json"
_ITEMS = "items.jsonl"
_FORMAT = 2


class CheckpointMismatchError(CheckpointError):
    """The checkpoint directory was written by another program or for other inputs."""


def input_hash(item: Any) -> str:
    """Returns the SHA-256 of an input's canonical JSON form."""
    from pydantic_core import to_jsonable_python

    data = to_jsonable_python(item, fallback=repr)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


# ------------------------------------------------------------------ identity
def program_identity(module: Any, graph_hash: str, config: Any) -> dict[str, Any]:
    """Returns what decides the requests a program sends, in parts a mismatch can name.

    Args:
        module: the program (its modules and parameters are read now).
        graph_hash: the structural hash of its graph for the batch's inputs.
        config: the `ResourceConfig` its aliases resolve in (for the models).
    """
    settings: dict[str, dict[str, str]] = {}
    aliases: set[str] = set()
    for path, sub in module.named_modules():
        described = {
            key: _digest(text)
            for key, value in vars(sub).items()
            if not key.startswith("_") and (text := _setting_text(value)) is not None
        }
        if described:
            settings[path or "(root)"] = described
        alias = getattr(sub, "alias", None)
        if isinstance(alias, str):
            aliases.add(alias)
    parameters = {name: _digest(_json_text(p.value)) for name, p in module.named_parameters()}
    return {
        "graph": graph_hash,
        "parameters": parameters,
        "settings": settings,
        "models": {alias: _model_of(config, alias) for alias in sorted(aliases)},
    }


def _setting_text(value: Any) -> str | None:
    """Returns a stable text of a module attribute that shapes requests, or None to skip it.

    Plain settings (temperature, alias, max_tokens …) count as they are; a
    response format or signature by its JSON schema and instructions; tools by
    their specs; other helper objects (an adapter) by their class. Child
    modules and parameters are covered on their own.
    """
    if isinstance(value, str | int | float | bool | type(None)):
        return repr(value)
    if getattr(value, "_is_plait_parameter", False) or hasattr(value, "named_modules"):
        return None
    if isinstance(value, type):
        return _type_text(value)
    if isinstance(value, Mapping) and all(hasattr(v, "spec") for v in value.values()):
        return repr(sorted((str(k), repr(v.spec)) for k, v in value.items()))
    if hasattr(value, "__dict__") and not isinstance(value, Mapping | Sequence):
        return f"{type(value).__module__}.{type(value).__qualname__}"
    return None


def _type_text(cls: type) -> str:
    if hasattr(cls, "signature_text") and hasattr(cls, "output_model"):  # a Signature
        schema = cls.output_model().model_json_schema()
        return f"{cls.signature_text()}|{cls.instructions}|{_json_text(schema)}"
    try:
        from plait.execution.structured import output_type_for

        return _json_text(output_type_for(cls).schema.schema)
    except TypeError:
        return f"{cls.__module__}.{cls.__qualname__}"


def _model_of(config: Any, alias: str) -> str:
    try:
        endpoint = config.resolve(alias)
    except KeyError:
        return "(unknown alias)"
    return f"{endpoint.provider}:{endpoint.model or endpoint.model_path or 'default'}"


def _json_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _changes(old: Any, new: dict[str, Any]) -> list[str]:
    """Returns one line per difference between two identities (what a mismatch names)."""
    if not isinstance(old, dict):
        return ["the manifest holds no program identity"]
    lines = []
    if old.get("graph") != new["graph"]:
        lines.append("the structure of the program (the graph its forward traces to)")
    lines += _named_changes("parameter", old.get("parameters"), new["parameters"])
    old_settings = old.get("settings") if isinstance(old.get("settings"), dict) else {}
    for path in sorted(set(old_settings) | set(new["settings"])):
        before, after = old_settings.get(path), new["settings"].get(path)
        if before != after:
            keys = sorted(
                k
                for k in {*(before or {}), *(after or {})}
                if (before or {}).get(k) != (after or {}).get(k)
            )
            lines.append(f"the settings of module {path!r}: {', '.join(keys)}")
    old_models = old.get("models") if isinstance(old.get("models"), dict) else {}
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


# ------------------------------------------------------------------ files
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


def _open_regular(path: Path, flags: int) -> int:
    """Opens ``path`` as a regular file without following a link; returns the descriptor.

    What is there is looked at first, for a clear error; ``O_NOFOLLOW`` and the
    check on the opened descriptor then make sure nothing swapped in between is
    used, and ``O_NONBLOCK`` keeps a planted FIFO from blocking the open.
    """
    with contextlib.suppress(FileNotFoundError):
        _refuse_special(path, os.lstat(path).st_mode)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _refuse_special(path, stat.S_IFLNK)
        raise CheckpointError(f"{path} cannot be opened: {exc.strerror or exc}") from None
    try:
        _refuse_special(path, os.fstat(fd).st_mode)
    except CheckpointError:
        os.close(fd)
        raise
    os.set_blocking(fd, True)
    return fd


def _refuse_special(path: Path, mode: int) -> None:
    """Raises `CheckpointError` unless ``mode`` is a regular file's."""
    if stat.S_ISLNK(mode):
        raise CheckpointError(
            f"{path} is a symbolic link; plait never follows links inside a checkpoint "
            "directory. Remove it, or use another checkpoint_dir"
        )
    if not stat.S_ISREG(mode):
        raise CheckpointError(
            f"{path} is not a regular file; remove it, or use another checkpoint_dir"
        )


def _read_text(path: Path) -> str | None:
    """Returns the text of a regular file in the checkpoint, or None when it does not exist."""
    if not os.path.lexists(path):
        return None
    fd = _open_regular(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as file:
        raw = file.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path} is not UTF-8 text ({exc}); delete it") from None


def _write_atomically(path: Path, text: str) -> None:
    """Writes ``text`` to a new temporary file beside ``path``, then renames it over ``path``.

    A stale temporary (a crash, or a planted link) is removed first: removing
    a link removes the link itself, never its target, and the new file is
    created exclusively, so nothing outside the directory is written.
    """
    temporary = path.with_suffix(".tmp")
    try:
        temporary.unlink(missing_ok=True)
    except IsADirectoryError:
        raise CheckpointError(f"{temporary} is a directory; remove it") from None
    fd = _open_regular(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(temporary, path)


# ------------------------------------------------------------------ checkpoint
class Checkpoint:
    """The checkpoint of one batch run.

    Args:
        directory: where the files live (created if needed).
        identity: the program's identity (`program_identity`).
        inputs: the batch items (hashed, not stored).
        codec: restores outputs as the types the program declares.

    Raises:
        CheckpointMismatchError: the directory belongs to another program or inputs.
        CheckpointError: the directory or a file in it cannot be used safely, or
            a line names a type the program does not declare (file and line named).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        identity: dict[str, Any],
        inputs: Sequence[Any],
        codec: OutputCodec,
    ) -> None:
        self.directory = Path(directory)
        self.identity = identity
        self.codec = codec
        self.item_hashes = [input_hash(item) for item in inputs]
        self.inputs_hash = hashlib.sha256("".join(self.item_hashes).encode()).hexdigest()
        self.done: dict[int, Any] = {}
        self._file: IO[str] | None = None
        self._open()

    def _open(self) -> None:
        _prepare_directory(self.directory)
        manifest_path = self.directory / _MANIFEST
        items_path = self.directory / _ITEMS
        manifest_text = _read_text(manifest_path)
        torn = False
        if manifest_text is not None:
            self._check_manifest(manifest_path, manifest_text)
            items_text = _read_text(items_path) or ""
            self._load_items(items_path, items_text)
            torn = bool(items_text) and not items_text.endswith("\n")
        else:
            manifest = {
                "format": _FORMAT,
                "program": self.identity,
                "inputs_hash": self.inputs_hash,
                "items": len(self.item_hashes),
            }
            _write_atomically(manifest_path, json.dumps(manifest, indent=2) + "\n")
        fd = _open_regular(items_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        if torn:
            self._file.write("\n")  # end a line torn by a crash so the next record stands alone

    def _check_manifest(self, path: Path, text: str) -> None:
        try:
            found = json.loads(text)
        except ValueError as exc:
            raise CheckpointMismatchError(
                f"checkpoint manifest {path} is unreadable: {exc}; delete the directory"
            ) from None
        if not isinstance(found, dict) or found.get("format") != _FORMAT:
            version = found.get("format") if isinstance(found, dict) else None
            raise CheckpointMismatchError(
                f"checkpoint in {self.directory} has format {version!r}, this plait writes "
                f"{_FORMAT}; use another checkpoint_dir or delete this one"
            )
        changes = _changes(found.get("program"), self.identity)
        if changes:
            listed = "\n".join(f"  - {line}" for line in changes)
            raise CheckpointMismatchError(
                f"checkpoint in {self.directory} was written by a different program; what "
                f"changed since:\n{listed}\nIts outputs would not be what this program "
                "answers: use another checkpoint_dir or delete this one"
            )
        if found.get("inputs_hash") != self.inputs_hash:
            raise CheckpointMismatchError(
                f"checkpoint in {self.directory} was written for different inputs "
                f"({found.get('items')} items then, {len(self.item_hashes)} now, or changed "
                "items); use another checkpoint_dir or delete this one"
            )

    def _load_items(self, path: Path, text: str) -> None:
        for line_number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line torn by a crash; that item simply runs again
            problem = self._restore(record)
            if problem is not None:
                raise CheckpointError(
                    f"{path}:{line_number}: {problem}. Delete that line (the item then runs "
                    "again) or the checkpoint directory"
                )

    def _restore(self, record: Any) -> str | None:
        """Restores one record into ``done``; returns what is wrong with it, if anything."""
        if not isinstance(record, dict) or "output" not in record:
            return "not a checkpoint record (expected an object with 'index' and 'output')"
        index = record.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            return f"'index' is {record.get('index')!r}, not an integer"
        if not 0 <= index < len(self.item_hashes):
            return f"'index' {index} is outside this batch of {len(self.item_hashes)} items"
        if record.get("input_hash") != self.item_hashes[index]:
            return None  # written for another input at this position: the item runs again
        try:
            self.done[index] = self.codec.decode(record["output"], record.get("shape"))
        except ValueError as exc:
            return f"the output of item {index} cannot be restored: {exc}"
        return None

    def is_done(self, index: int) -> bool:
        """Whether item ``index`` finished in an earlier run."""
        return index in self.done

    def write(self, index: int, output: Any, usage: dict[str, Any] | None = None) -> None:
        """Appends a finished item and flushes it to the operating system at once.

        Raises:
            CheckpointError: the output cannot be stored so that a resumed run
                gets back the same thing (the message says which part, and why).
        """
        if self._file is None:
            raise CheckpointError(f"the checkpoint in {self.directory} is closed")
        try:
            data, shape = self.codec.encode(output, "the output")
        except CheckpointError as exc:
            raise CheckpointError(f"item {index} cannot be checkpointed: {exc}") from None
        record: dict[str, Any] = {"index": index, "input_hash": self.item_hashes[index]}
        record["output"] = data
        if shape is not None:
            record["shape"] = shape
        if usage:
            record["usage"] = usage
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Closes the items file."""
        if self._file is not None:
            self._file.close()
            self._file = None
