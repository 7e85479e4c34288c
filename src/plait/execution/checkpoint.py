"""Checkpoints: finished batch items on disk, so an interrupted batch resumes.

A checkpoint directory holds two files (and ``blobs/``, the bytes of any
image, audio or document among the outputs, each stored once under its
SHA-256; see `plait.execution.checkpoint_codec`):

* ``manifest.json`` — which program and which inputs the checkpoint belongs
  to: the program's *identity* (the shape of its graph, every parameter value,
  every setting that changes a request, the model behind each alias) and a
  hash of every input item. A rerun with another program, changed prompts or
  other inputs is refused with a `CheckpointMismatchError` naming what
  changed, never mixed in.
* ``items.jsonl`` — one JSON line per finished item (index, input hash,
  output, its shape, usage), written and flushed the moment the item
  finishes. A crash can tear at most the line being written; a line that is
  not JSON, or longer than any line plait writes (8 MiB), is skipped on
  resume and its item runs again. The file is read a line at a time, so junk
  appended to it costs no more memory than one line.

The files are data, never code: outputs are JSON restored only as types the
program declares (`plait.execution.checkpoint_codec`), never pickle and never
a class named in the file, and a restored output must be of the type the
program declares for its output. A checkpoint directory may have been
prepared by someone else, so plait opens only regular files in it, never
through a symbolic link (a link named ``items.jsonl`` could otherwise make it
append to any file the user can write), and writes the manifest through
`plait._files` like every file it writes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from plait import _files
from plait import _jsontext as jsontext
from plait._jsondata import as_json_data
from plait.execution.checkpoint_codec import CheckpointError, MediaBlobs, OutputCodec
from plait.execution.structured import output_type_for

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointMismatchError",
    "input_hash",
    "open_checkpoint",
    "program_identity",
]

_MANIFEST = "manifest.json"
_ITEMS = "items.jsonl"
_BLOBS = "blobs"
_FORMAT = 2
_MAX_LINE = 8 * 1024 * 1024
"""The longest line a checkpoint writes or reads back (bytes, newline included)."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint directory was written by another program or for other inputs."""


def input_hash(item: Any) -> str:
    """Returns the SHA-256 of an input's canonical JSON form."""
    data = as_json_data(item, fallback=repr)
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
        return f"{cls.signature_text()}|{getattr(cls, 'instructions', '')}|{_json_text(schema)}"
    try:
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


def _ends_torn(file: Any) -> bool:
    """Whether a non-empty file's last byte is not a newline (a crash tore its last line)."""
    size = file.seek(0, os.SEEK_END)
    if size == 0:
        return False
    file.seek(size - 1)
    return file.read(1) != b"\n"


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
            a line names a type the program does not declare, holds an output of
            another type than the program declares, or is nested too deeply
            (file and line named).
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
        codec.blobs = MediaBlobs(self.directory / _BLOBS)
        self.item_hashes = [input_hash(item) for item in inputs]
        self.inputs_hash = hashlib.sha256("".join(self.item_hashes).encode()).hexdigest()
        self.done: dict[int, Any] = {}
        self._file: IO[str] | None = None
        self._open()

    def _open(self) -> None:
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
            self._check_manifest(manifest)
            torn = self._load_items(items_path)
        else:
            manifest = {
                "format": _FORMAT,
                "program": self.identity,
                "inputs_hash": self.inputs_hash,
                "items": len(self.item_hashes),
            }
            text = json.dumps(manifest, indent=2) + "\n"
            _files.write_atomically(manifest_path, text, error=CheckpointError)
        self._file = _files.open_for_writing(items_path, append=True, error=CheckpointError)
        if torn:
            self._file.write("\n")  # end a line torn by a crash so the next record stands alone

    def _check_manifest(self, found: Any) -> None:
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

    def _load_items(self, path: Path) -> bool:
        """Restores the finished items in ``path``; returns whether its last line is torn."""
        file = _files.open_for_reading(path, error=CheckpointError)
        if file is None:
            return False
        with file:
            for line_number, line in enumerate(_files.read_lines(file, _MAX_LINE), 1):
                problem = self._restore_line(line)
                if problem is not None:
                    raise CheckpointError(
                        f"{path}:{line_number}: {problem}. Delete that line (the item then "
                        "runs again) or the checkpoint directory"
                    )
            return _ends_torn(file)

    def _restore_line(self, line: bytes | None) -> str | None:
        """Restores one line into ``done``; returns what is wrong with it, if anything.

        A line longer than plait writes, or not JSON, is what a crash or junk
        leaves: it is skipped and its item runs again. A line nested past what
        Python can parse or restore is an error, never a bare `RecursionError`.
        """
        if line is None or not line.strip():
            return None
        try:
            record = jsontext.loads(line.decode("utf-8"))
        except jsontext.TooDeep:
            return "it is nested too deeply to be a checkpoint record"
        except ValueError:
            return None  # a line torn by a crash; that item simply runs again
        try:
            return self._restore(record)
        except RecursionError:
            return "its output is nested too deeply to restore"

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
            self.done[index] = self.codec.decode_output(record["output"], record.get("shape"))
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
            data, shape = self.codec.encode_output(output)
        except CheckpointError as exc:
            raise CheckpointError(f"item {index} cannot be checkpointed: {exc}") from None
        record: dict[str, Any] = {"index": index, "input_hash": self.item_hashes[index]}
        record["output"] = data
        if shape is not None:
            record["shape"] = shape
        if usage:
            record["usage"] = usage
        line = json.dumps(record, ensure_ascii=False) + "\n"
        if len(line) > _MAX_LINE // 4 and (size := len(line.encode())) > _MAX_LINE:
            raise CheckpointError(
                f"item {index} cannot be checkpointed: its line would be {size:,} bytes, more "
                f"than the {_MAX_LINE:,} a checkpoint reads back. Return a smaller output, or "
                "run without checkpoint_dir"
            )
        self._file.write(line)
        self._file.flush()

    def close(self) -> None:
        """Closes the items file."""
        if self._file is not None:
            self._file.close()
            self._file = None


def open_checkpoint(
    module: Any, graph: Any, items: list[Any], directory: Any, executor: Any
) -> Checkpoint:
    """Opens the checkpoint in ``directory`` of a batch of ``module`` run by ``executor``.

    ``graph`` is the batch's graph, whose shape is part of the program's
    identity. A training-mode run is refused: its outputs carry tapes, which
    cannot be saved.
    """
    if executor.training:
        raise CheckpointError(
            f"checkpoint_dir={directory!s} with {type(module).__name__} in training mode: a "
            "training-mode output carries a tape that cannot be saved. Checkpoint eval-mode "
            "runs (module.eval()); the Trainer has its own checkpoint_dir for training"
        )
    identity = program_identity(module, graph.structural_hash(), executor.manager.config)
    declared = (t for sub in module.modules() for t in sub.declared_output_types())
    codec = OutputCodec(declared, output_type=module.declared_return_type())
    return Checkpoint(directory, identity, items, codec)
