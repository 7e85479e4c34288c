"""Checkpoints: finished batch items on disk, so an interrupted batch resumes.

A checkpoint directory holds two files:

* ``manifest.json`` — which program (graph hash) and which inputs (hash of
  every item) the checkpoint belongs to. A rerun with another program or
  other inputs is refused, never mixed in.
* ``items.jsonl`` — one JSON line per finished item (index, input hash,
  output, usage), written and flushed the moment the item finishes. A crash
  can tear at most the last line, which is ignored on resume.

Outputs are stored as JSON, never pickle. Pydantic models and dataclasses
are stored with their import path and rebuilt on resume when importable.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from plait.errors import PlaitError

__all__ = ["Checkpoint", "CheckpointMismatchError", "input_hash"]

_MANIFEST = "manifest.json"
_ITEMS = "items.jsonl"
_FORMAT = 1


class CheckpointMismatchError(PlaitError):
    """The checkpoint directory was written by another program or for other inputs."""


def _jsonable(obj: Any) -> Any:
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(obj, fallback=_fallback)


def _fallback(obj: Any) -> Any:
    # A Mapping that is not a dict (a program's Prediction) is data, not its repr.
    return dict(obj) if isinstance(obj, Mapping) else repr(obj)


def input_hash(item: Any) -> str:
    """Returns the SHA-256 of an input's canonical JSON form."""
    text = json.dumps(_jsonable(item), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _encode_output(output: Any) -> dict[str, Any]:
    cls = type(output)
    is_model = (
        hasattr(cls, "model_validate")
        or (dataclasses.is_dataclass(output) and not isinstance(output, type))
        or (isinstance(output, Mapping) and not isinstance(output, dict))
    )
    record: dict[str, Any] = {"output": _jsonable(output)}
    if is_model:
        record["type"] = f"{cls.__module__}:{cls.__qualname__}"
    return record


def _decode_output(record: dict[str, Any]) -> Any:
    data = record["output"]
    type_path = record.get("type")
    if not type_path:
        return data
    module_name, _, qualname = type_path.partition(":")
    try:
        cls: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError):
        return data  # the class is gone (e.g. defined in a closure): keep plain JSON
    if hasattr(cls, "model_validate"):
        return cls.model_validate(data)
    if isinstance(cls, type) and issubclass(cls, Mapping):
        return cls(data)
    return cls(**data)


class Checkpoint:
    """The checkpoint of one batch run.

    Args:
        directory: where the files live (created if needed).
        graph_hash: structural hash of the program being run.
        inputs: the batch items (hashed, not stored).

    Raises:
        CheckpointMismatchError: the directory belongs to another program or inputs.
    """

    def __init__(self, directory: str | Path, graph_hash: str, inputs: Sequence[Any]) -> None:
        self.directory = Path(directory)
        self.graph_hash = graph_hash
        self.item_hashes = [input_hash(item) for item in inputs]
        self.inputs_hash = hashlib.sha256("".join(self.item_hashes).encode()).hexdigest()
        self.done: dict[int, Any] = {}
        self._file: IO[str] | None = None
        self._open()

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        manifest_path = self.directory / _MANIFEST
        manifest = {
            "format": _FORMAT,
            "graph_hash": self.graph_hash,
            "inputs_hash": self.inputs_hash,
            "items": len(self.item_hashes),
        }
        if manifest_path.exists():
            self._check_manifest(manifest_path, manifest)
            self._load_items()
        else:
            tmp = manifest_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(manifest, indent=2))
            os.replace(tmp, manifest_path)
        items_path = self.directory / _ITEMS
        torn = items_path.exists() and not items_path.read_bytes().endswith(b"\n")
        self._file = open(items_path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run
        if torn and items_path.stat().st_size:
            self._file.write("\n")  # end a line torn by a crash so the next record stands alone

    def _check_manifest(self, path: Path, expected: dict[str, Any]) -> None:
        try:
            found = json.loads(path.read_text())
        except ValueError as exc:
            raise CheckpointMismatchError(
                f"checkpoint manifest {path} is unreadable: {exc}"
            ) from None
        if found.get("graph_hash") != expected["graph_hash"]:
            raise CheckpointMismatchError(
                f"checkpoint in {self.directory} was written by a different program (graph hash "
                f"{str(found.get('graph_hash'))[:12]}…, this program {self.graph_hash[:12]}…); "
                "use another checkpoint_dir or delete this one"
            )
        if found.get("inputs_hash") != expected["inputs_hash"]:
            raise CheckpointMismatchError(
                f"checkpoint in {self.directory} was written for different inputs "
                f"({found.get('items')} items then, {expected['items']} now, or changed items); "
                "use another checkpoint_dir or delete this one"
            )

    def _load_items(self) -> None:
        path = self.directory / _ITEMS
        if not path.exists():
            return
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line torn by a crash; that item simply runs again
                index = record.get("index")
                if (
                    isinstance(index, int)
                    and 0 <= index < len(self.item_hashes)
                    and record.get("input_hash") == self.item_hashes[index]
                ):
                    self.done[index] = _decode_output(record)

    def is_done(self, index: int) -> bool:
        """Whether item ``index`` finished in an earlier run."""
        return index in self.done

    def write(self, index: int, output: Any, usage: dict[str, Any] | None = None) -> None:
        """Appends a finished item and flushes it to the operating system at once."""
        assert self._file is not None
        record = {"index": index, "input_hash": self.item_hashes[index], **_encode_output(output)}
        if usage:
            record["usage"] = usage
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Closes the items file."""
        if self._file is not None:
            self._file.close()
            self._file = None
