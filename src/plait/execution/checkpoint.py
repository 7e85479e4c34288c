"""Checkpoints: finished batch items kept, so an interrupted batch resumes.

One concept, two places: a folder (``checkpoint_dir``;
`plait.execution.checkpoint_folder`) or a state store (``state=``, when no
folder is given; `plait.execution.checkpoint_store`, so a run resumes on
another machine). Both keep the same record per finished item (its input
hash, output, the output's shape, usage) and restore it here, in one way;
the place only stores and finds the records.

A checkpoint belongs to one program and its inputs: the program's *identity*
(`program_identity`: the shape of its graph, every parameter value, every
setting that changes a request, the model behind each alias) and a hash of
every input item. A folder refuses another program or other inputs with a
`CheckpointMismatchError` naming what changed; a store keys its rows by
identity and input, so another program finds none of them.

Records are data, never code: outputs are JSON restored only as types the
program declares (`plait.execution.checkpoint_codec`), never pickle and
never a class named in a record, and a restored output must be of the type
the program declares for its output.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import PurePath
from typing import Any, Protocol

from plait import _jsontext as jsontext
from plait._jsondata import as_json_data
from plait.execution.checkpoint_codec import CheckpointError, OutputCodec
from plait.execution.checkpoint_folder import MAX_LINE, CheckpointMismatchError, FolderRecords
from plait.execution.structured import output_type_for
from plait.resources.state import StateWarning

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointRecords",
    "input_hash",
    "open_checkpoint",
    "program_identity",
]


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
    # A model file counts by its name: the folder it sits in differs between machines.
    path = PurePath(endpoint.model_path).name if endpoint.model_path else None
    return f"{endpoint.provider}:{endpoint.model or path or 'default'}"


def _json_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ------------------------------------------------------------------ checkpoint
class CheckpointRecords(Protocol):
    """Where a checkpoint's records live: a folder (`FolderRecords`) or a state store
    (`plait.execution.checkpoint_store.StoreRecords`). It stores and finds records;
    `Checkpoint` makes and restores them."""

    where: str
    """How messages name the checkpoint (``checkpoint in runs/a``)."""
    blobs: Any
    """Where media bytes among the outputs go (``put(media)``, ``get(sha256)``)."""

    async def load(self, checkpoint: Checkpoint) -> None:
        """Restores the finished items it holds into ``checkpoint`` (`Checkpoint.restore_line`)."""
        ...

    def append(self, index: int, input_hash: str, line: str) -> Awaitable[Any] | None:
        """Keeps one finished item's record; may return something the batch waits for."""
        ...

    async def aclose(self, until: float | None = None) -> None:
        """Ends writing (a store's rows on their way are written first, waiting no later
        than ``until``, a loop time: the batch's deadline)."""
        ...


class Checkpoint:
    """The checkpoint of one batch run: what finished, restored and written as records.

    Args:
        records: where the records live.
        identity: the program's identity (`program_identity`).
        inputs: the batch items (hashed, not stored).
        codec: restores outputs as the types the program declares.
        strict: whether an output that cannot be kept fails its item (a checkpoint the
            caller asked for) or is left out with one warning, its item then running again
            on resume (a checkpoint a state store keeps by itself).

    `load` raises what the records raise: `CheckpointMismatchError` (a folder of another
    program or inputs), `CheckpointError` (a record that names a type the program does
    not declares, holds an output of another type, or is nested too deeply; its place
    named).
    """

    def __init__(
        self,
        records: CheckpointRecords,
        identity: dict[str, Any],
        inputs: Sequence[Any],
        codec: OutputCodec,
        *,
        strict: bool = True,
    ) -> None:
        self.records = records
        self.identity = identity
        self.codec = codec
        self.strict = strict
        codec.blobs = records.blobs
        self.item_hashes = [input_hash(item) for item in inputs]
        self.inputs_hash = hashlib.sha256("".join(self.item_hashes).encode()).hexdigest()
        self.done: dict[int, Any] = {}
        self._warned = False

    async def load(self) -> None:
        """Restores the items finished in earlier runs (see the class docstring)."""
        await self.records.load(self)

    def restore_line(self, line: bytes | None, index: int | None = None) -> str | None:
        """Restores one record into ``done``; returns what is wrong with it, if anything.

        ``index`` is the item a store found the record for (by its input); a
        folder's record names its own. A record longer than plait writes, or
        not JSON, is what a crash or junk leaves: it is skipped and its item
        runs again. A record nested past what Python can parse or restore is
        an error, never a bare `RecursionError`.
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
            return self._restore(record, index)
        except RecursionError:
            return "its output is nested too deeply to restore"

    def _restore(self, record: Any, index: int | None) -> str | None:
        """Restores one record into ``done``; returns what is wrong with it, if anything."""
        if not isinstance(record, dict) or "output" not in record:
            return "not a checkpoint record (expected an object with 'index' and 'output')"
        if index is None:
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

    def write(
        self, index: int, output: Any, usage: dict[str, Any] | None = None
    ) -> Awaitable[Any] | None:
        """Keeps a finished item; returns something to wait for when the place is full
        (a store that does not answer).

        Raises:
            CheckpointError: a strict checkpoint cannot store the output so that a
                resumed run gets back the same thing (the message says which part, and why).
        """
        try:
            line = self._record(index, output, usage)
        except CheckpointError as exc:
            if self.strict:
                raise
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"{self.records.where}: {exc}; such items are not kept and run again on resume",
                    StateWarning,
                    stacklevel=2,
                )
            return None
        return self.records.append(index, self.item_hashes[index], line)

    def _record(self, index: int, output: Any, usage: dict[str, Any] | None) -> str:
        """Returns the record (one JSON line, no newline) of a finished item."""
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
        line = json.dumps(record, ensure_ascii=False)
        if len(line) >= MAX_LINE // 4 and (size := len(line.encode()) + 1) > MAX_LINE:
            raise CheckpointError(
                f"item {index} cannot be checkpointed: its record would be {size:,} bytes, "
                f"more than the {MAX_LINE:,} a checkpoint reads back. Return a smaller output, "
                "or run without a checkpoint"
            )
        return line

    async def aclose(self, until: float | None = None) -> None:
        """Ends writing: a folder's file is closed, a store's rows on their way written
        (waiting no later than ``until``, a loop time: the batch's deadline)."""
        await self.records.aclose(until)


async def open_checkpoint(
    module: Any,
    graph: Any,
    items: list[Any],
    executor: Any,
    directory: Any = None,
    call_args: Any = (),
) -> Checkpoint | None:
    """Opens and loads the checkpoint of a batch of ``module`` run by ``executor``.

    In ``directory`` when given; else in the state store of the executor's
    resources, if they name one (None when they do not, or when the run is in
    training mode: a store keeps checkpoints of eval-mode runs only, by itself).
    ``graph`` is the batch's graph, whose shape is part of the program's
    identity; ``call_args`` (the batch's other arguments) key a store's rows too.

    Raises:
        CheckpointError: ``directory`` with a training-mode run (its outputs carry
            tapes, which cannot be saved), or what `Checkpoint.load` raises.
    """
    state = getattr(executor.manager.config, "state", None)
    if directory is None and (state is None or executor.training):
        return None
    if executor.training:
        raise CheckpointError(
            f"checkpoint_dir={directory!s} with {type(module).__name__} in training mode: a "
            "training-mode output carries a tape that cannot be saved. Checkpoint eval-mode "
            "runs (module.eval()); the Trainer has its own checkpoint_dir for training"
        )
    identity = program_identity(module, graph.structural_hash(), executor.manager.config)
    records: CheckpointRecords
    if directory is not None:
        records = FolderRecords(directory)
    elif state is not None:
        # import time: only a run with a state store loads the store's checkpoint code
        from plait.execution.checkpoint_store import StoreRecords, run_prefix

        records = StoreRecords(state, run_prefix(identity, input_hash(call_args)))
    declared = (t for sub in module.modules() for t in sub.declared_output_types())
    codec = OutputCodec(declared, output_type=module.declared_return_type())
    checkpoint = Checkpoint(records, identity, items, codec, strict=directory is not None)
    try:
        await checkpoint.load()
    except BaseException:
        await checkpoint.aclose()
        raise
    return checkpoint
