"""Checkpoint outputs as JSON, restored only as types the program itself declares.

A checkpoint line holds an item's output as plain JSON plus a *shape* that
says where that JSON stood for something JSON cannot spell: a tuple, a
pydantic model, a dataclass, an enum member, a `Mapping` such as a
`Prediction`. The shape names a class, but the name is only looked up among
the types the running program declares (`Module.declared_output_types`: a
response format, a signature's output fields, a ``forward`` return
annotation), so a line edited to name ``subprocess:run`` is refused instead
of called. An output that cannot come back as what it was is refused when it
is written, never silently stored as its ``repr``.

A whole output is also checked against the type the program declares for it
(`Module.declared_return_type`: a response format, or ``forward``'s return
annotation), when written and when restored: a line edited to hold a plain
string where the program declares a ``Verdict`` is refused, not handed to
code that trusts the declaration.

Shapes (JSON)::

    null                               plain JSON: str, int, float, bool, None, lists, dicts
    {"list": [shape, ...]}             a list with non-plain items
    {"tuple": [shape, ...]}            a tuple (stored as a JSON array)
    {"dict": {key: shape}}             a dict with non-plain values (only those keys)
    {"type": "module:Qualname"}        a declared model, dataclass or enum, validated back
    {"mapping": "module:Qualname", "items": {key: shape}}   a declared Mapping class
    {"media": "image" | "audio" | "file"}                   a plait.Image, Audio or File

An image, audio clip or document is plait's own value, so it needs no
declaration: its line holds the media type, name and SHA-256, and the bytes
go once into ``blobs/<sha256>`` beside the lines (`MediaBlobs`), never into
every line as base64. The blob's name is only ever a validated hex digest, so
a line cannot make plait read a path outside the folder, and the bytes read
back must hash to that digest.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from plait import _files
from plait.errors import MediaError, PlaitError
from plait.media import Audio, File, Image, Media, is_media_key

__all__ = ["CheckpointError", "MediaBlobs", "OutputCodec"]

_MEDIA_KINDS: dict[str, type[Media]] = {"image": Image, "audio": Audio, "file": File}
_MAX_BLOB = 1024 * 1024 * 1024
"""The largest blob read back (1 GiB): past any provider's limit, short of a junk file's size."""

_SCALARS = (str, int, float, bool, type(None))


class CheckpointError(PlaitError):
    """A checkpoint directory or file cannot be used: unsafe, unreadable, or not restorable."""


class MediaBlobs:
    """The ``blobs/`` folder of a checkpoint: media bytes stored once, named by their SHA-256."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def put(self, item: Media) -> None:
        """Stores the bytes of ``item`` unless a blob of that hash is already there."""
        path = self.directory / item.sha256
        if path.is_file():
            return
        self.directory.mkdir(exist_ok=True)
        _files.write_atomically(path, item.data or b"", error=CheckpointError)

    def get(self, digest: str) -> bytes:
        """Returns the bytes stored under ``digest`` (a hex SHA-256), checked against it.

        Raises:
            ValueError: the blob is missing, too large or changed since it was written.
        """
        path = self.directory / digest
        file = _files.open_for_reading(path, error=CheckpointError)
        if file is None:
            raise ValueError(f"its media blob {path} is missing")
        with file:
            data = file.read(_MAX_BLOB + 1)
        import hashlib  # import time: OpenSSL's load, only for a checkpoint holding media

        if len(data) > _MAX_BLOB or hashlib.sha256(data).hexdigest() != digest:
            raise ValueError(f"its media blob {path} was changed since it was written")
        return data


class OutputCodec:
    """Turns outputs into (JSON, shape) and back, knowing only the declared types.

    Args:
        declared: type annotations the program declares (``Literal``, ``list[Model]``,
            ``Model | None`` … are searched for the classes inside them).
        output_type: the type the program declares for its whole output, or
            None when it declares none; `encode_output` and `decode_output`
            refuse a value of another type.

    Example::

        codec = OutputCodec([Verdict], output_type=Verdict)
        data, shape = codec.encode_output(Verdict(label="spam"))
        codec.decode_output(data, shape)    # Verdict(label='spam')
        codec.decode_output("spam", None)   # ValueError: it holds a str where …
    """

    def __init__(self, declared: Iterable[Any], output_type: Any = None) -> None:
        self._classes: dict[str, type] = {}
        self.output_type = output_type
        self.blobs: MediaBlobs | None = None
        """Where media bytes go; None (no checkpoint folder) refuses media outputs."""
        seen: set[int] = set()
        for annotation in (*declared, output_type):
            self._collect(annotation, seen)

    @property
    def class_names(self) -> list[str]:
        """The ``module:Qualname`` of every class a shape may name."""
        return sorted(self._classes)

    def _collect(self, annotation: Any, seen: set[int]) -> None:
        if id(annotation) in seen:
            return
        seen.add(id(annotation))
        for inner in typing.get_args(annotation):  # list[Model], Model | None, Annotated[...]
            self._collect(inner, seen)
        if isinstance(annotation, type) and _is_restorable_class(annotation):
            self._classes[_name_of(annotation)] = annotation

    # ------------------------------------------------------------------ whole outputs
    def encode_output(self, value: Any) -> tuple[Any, Any]:
        """Returns ``(data, shape)`` for a whole output, which must be of the declared type.

        Raises:
            CheckpointError: ``value`` is not of ``output_type``, or cannot be
                stored so that it comes back the same (see `encode`).
        """
        if not _fits(value, self.output_type):
            raise CheckpointError(
                f"the output is {_kind(value)}, but the program declares "
                f"{_type_name(self.output_type)} for it (a response_format, or the return "
                "annotation of forward); return that type, or correct the declaration"
            )
        return self.encode(value, "the output")

    def decode_output(self, data: Any, shape: Any) -> Any:
        """Returns the whole output ``(data, shape)`` stands for, checked against ``output_type``.

        Raises:
            ValueError: as `decode` does, or the value is not of ``output_type``.
        """
        value = self.decode(data, shape)
        if not _fits(value, self.output_type):
            declared = _type_name(self.output_type)
            raise ValueError(f"it holds {_kind(value)} where the program declares {declared}")
        return value

    # ------------------------------------------------------------------ encode
    def encode(self, value: Any, where: str) -> tuple[Any, Any]:
        """Returns ``(data, shape)`` for ``value``.

        Raises:
            CheckpointError: ``value`` (or a part of it, named by its path from
                ``where``) cannot be stored so that it comes back the same.
        """
        if isinstance(value, _SCALARS):
            return value, None
        if isinstance(value, list):
            return self._encode_items(value, where, "list")
        if isinstance(value, tuple) and type(value) is tuple:
            data, shape = self._encode_items(value, where, "tuple")
            return data, shape if shape is not None else {"tuple": [None] * len(value)}
        if type(value) is dict:
            return self._encode_dict(value, where)
        if isinstance(value, Media):
            return self._encode_media(value, where)
        name = _name_of(type(value))
        if self._classes.get(name) is not type(value):
            raise CheckpointError(_undeclared(value, where, self.class_names))
        if isinstance(value, Mapping):
            data, shape = self._encode_dict(dict(value), where)
            return data, {"mapping": name, "items": (shape or {}).get("dict", {})}
        if isinstance(value, enum.Enum):
            return self.encode(value.value, where)[0], {"type": name}
        return _adapter(type(value)).dump_python(value, mode="json"), {"type": name}

    def _encode_items(self, items: list[Any] | tuple[Any, ...], where: str, kind: str) -> Any:
        pairs = [self.encode(item, f"{where}[{i}]") for i, item in enumerate(items)]
        data = [d for d, _ in pairs]
        shapes = [s for _, s in pairs]
        return data, ({kind: shapes} if any(s is not None for s in shapes) else None)

    def _encode_dict(self, value: dict[Any, Any], where: str) -> tuple[Any, Any]:
        data: dict[str, Any] = {}
        shapes: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CheckpointError(
                    f"{where} has the key {key!r} ({type(key).__name__}); JSON keys are "
                    "strings, so it would come back changed. Use string keys."
                )
            data[key], shape = self.encode(item, f"{where}[{key!r}]")
            if shape is not None:
                shapes[key] = shape
        return data, ({"dict": shapes} if shapes else None)

    def _encode_media(self, item: Media, where: str) -> tuple[Any, Any]:
        data: dict[str, Any] = {
            "sha256": item.sha256,
            "media_type": item.media_type,
            "url": item.url,
            "name": item.name,
        }
        if isinstance(item, Image):
            data["detail"] = item.detail
        if item.url is None:
            if self.blobs is None:
                raise CheckpointError(f"{where} is {item!r}, and there is no folder for its bytes")
            self.blobs.put(item)
        return data, {"media": item.kind}

    def _decode_media(self, data: Any, kind: Any) -> Media:
        cls = _MEDIA_KINDS.get(kind) if isinstance(kind, str) else None
        if cls is None or not isinstance(data, dict):
            raise ValueError(f"malformed media shape {_preview(kind)}")
        digest, url = data.get("sha256"), data.get("url")
        options: dict[str, Any] = {"media_type": data.get("media_type"), "name": data.get("name")}
        if cls is Image:
            options["detail"] = data.get("detail")
        if not all(v is None or isinstance(v, str) for v in (*options.values(), url)):
            raise ValueError(f"a {kind} record holds a field that is not text")
        if url is not None:
            source: str | bytes = url
        elif not isinstance(digest, str) or not is_media_key(digest):
            raise ValueError(f"a {kind} names the blob {_preview(digest)}, not a hex SHA-256")
        elif self.blobs is None:
            raise ValueError(f"a {kind} needs the checkpoint's blobs folder")
        else:
            source = self.blobs.get(digest)
            options["max_bytes"] = len(source)
        try:
            return cls(source, **options)
        except MediaError as exc:
            raise ValueError(str(exc)) from None

    # ------------------------------------------------------------------ decode
    def decode(self, data: Any, shape: Any) -> Any:
        """Returns the output that ``(data, shape)`` stands for.

        Raises:
            ValueError: the shape is malformed, names a class the program does
                not declare, or the data does not fit it (the caller names the
                file and line).
        """
        if shape is None:
            return data
        if not isinstance(shape, dict) or len(shape) not in (1, 2):
            raise ValueError(f"malformed shape {_preview(shape)}")
        if "list" in shape or "tuple" in shape:
            kind = "list" if "list" in shape else "tuple"
            items = self._decode_items(data, shape[kind])
            return items if kind == "list" else tuple(items)
        if "dict" in shape:
            return self._decode_dict(data, shape["dict"])
        if "media" in shape:
            return self._decode_media(data, shape["media"])
        if "mapping" in shape:
            cls = self._declared(shape["mapping"])
            return cls(self._decode_dict(data, shape.get("items", {})))
        if "type" in shape:
            cls = self._declared(shape["type"])
            # import time: pydantic loads on first use, not on a plain call
            from pydantic import ValidationError

            try:
                return _adapter(cls).validate_python(data)
            except ValidationError as exc:
                raise ValueError(f"the data does not fit {shape['type']}: {exc}") from None
        raise ValueError(f"malformed shape {_preview(shape)}")

    def _decode_items(self, data: Any, shapes: Any) -> list[Any]:
        if not isinstance(data, list) or not isinstance(shapes, list) or len(data) != len(shapes):
            raise ValueError("a list shape does not match its data")
        return [self.decode(item, shape) for item, shape in zip(data, shapes, strict=True)]

    def _decode_dict(self, data: Any, shapes: Any) -> dict[str, Any]:
        if not isinstance(data, dict) or not isinstance(shapes, dict):
            raise ValueError("a dict shape does not match its data")
        unknown = [key for key in shapes if key not in data]
        if unknown:
            raise ValueError(f"the shape names keys the data lacks: {unknown}")
        return {key: self.decode(item, shapes.get(key)) for key, item in data.items()}

    def _declared(self, name: Any) -> type:
        cls = self._classes.get(name) if isinstance(name, str) else None
        if cls is None:
            known = ", ".join(self.class_names) or "none"
            raise ValueError(
                f"it names the type {_preview(name)}, which this program does not declare "
                f"(declared: {known}); checkpoints never import a type by name"
            )
        return cls


def _fits(value: Any, annotation: Any) -> bool:
    """Whether ``value`` is of the declared type, as far as a plain check can tell.

    Classes are checked with ``isinstance`` (an int passes for a float, as the
    typing rules allow); unions, ``Optional``, ``Literal``, ``Annotated`` and
    the items of lists, tuples, sets and dicts are followed. What this cannot
    check (``Any``, a type variable, a protocol, a JSON-schema dict, None for
    "nothing declared") passes: the check refuses only what is surely wrong.
    """
    if annotation is None or annotation is Any or annotation is object:
        return True
    if annotation is type(None):
        return value is None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _fits(value, args[0])
    if origin is typing.Union or origin is types.UnionType:
        return any(_fits(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if origin is not None:
        return not isinstance(origin, type) or (
            _is_instance(value, origin) and _items_fit(value, args)
        )
    if annotation is float:
        return isinstance(value, int | float)
    if isinstance(annotation, type) and typing.is_typeddict(annotation):
        return isinstance(value, dict)
    if isinstance(annotation, type):
        return _is_instance(value, annotation)
    return True


def _items_fit(value: Any, args: tuple[Any, ...]) -> bool:
    if not args:
        return True
    if isinstance(value, tuple):
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(item, args[0]) for item in value)
        return len(value) == len(args) and all(map(_fits, value, args))
    if isinstance(value, Mapping) and len(args) == 2:
        return all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    if isinstance(value, list | set | frozenset) and len(args) == 1:
        return all(_fits(item, args[0]) for item in value)
    return True


def _is_instance(value: Any, cls: type) -> bool:
    try:
        return isinstance(value, cls)
    except TypeError:  # a protocol that is not runtime-checkable: nothing to check against
        return True


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    name = type(value).__qualname__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__qualname__
    return str(annotation).replace("typing.", "")


def _is_restorable_class(cls: type) -> bool:
    """Whether instances can go to JSON and come back: a model, dataclass, enum or Mapping."""
    if issubclass(cls, enum.Enum) or dataclasses.is_dataclass(cls):
        return True
    if hasattr(cls, "model_validate") and hasattr(cls, "model_dump"):
        return True
    return issubclass(cls, Mapping) and cls is not dict


def _name_of(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _adapter(cls: type) -> Any:
    # import time: only a checkpointed value of a class (a model, a dataclass) needs it
    from plait.execution.structured import type_adapter

    return type_adapter(cls)


def _undeclared(value: Any, where: str, declared: list[str]) -> str:
    cls = type(value)
    known = ", ".join(declared) or "none"
    return (
        f"{where} is a {cls.__module__}.{cls.__qualname__}, which cannot be checkpointed: "
        "a checkpoint keeps JSON data and the types the program declares (a response_format, "
        "a signature's output fields, or the return annotation of a forward), so that a "
        f"resumed run gets back exactly what it stored. Declared here: {known}. Return JSON "
        f"data, a pydantic model or a dataclass, and declare it (e.g. `def forward(...) -> "
        f"{cls.__name__}:`)."
    )


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "…"
