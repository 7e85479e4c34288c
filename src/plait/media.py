"""Images, audio and documents as inputs to model calls: `Image`, `Audio`, `File`.

Each is an immutable value (a frozen dataclass) holding the bytes, their
media type and the SHA-256 of the bytes, or a URL kept as a URL (never
fetched by plait: the provider reads it). Build one from a path, bytes, a
URL or a ``data:`` URI::

    Image("invoice.png")                      # a file, read once, here
    Image(png_bytes, detail="low")            # bytes in memory
    Image("https://example.com/cat.jpg")      # a URL, sent as a URL
    Audio("question.wav"), File("report.pdf")

The format is read from the bytes' magic numbers, never from a file name, so
a ``.png`` that holds a JPEG is sent as ``image/jpeg`` and a file that is not
an image is refused at once, naming where it came from. Every item is capped
(`DEFAULT_MAX_BYTES`, or ``max_bytes=``) because providers refuse large inputs
only after the upload, and the whole request is held in memory.

The values travel as they are through programs: as `Signature` input fields,
``forward`` arguments, parts of a chat `Message` and prompts of an
`LLMInference`. Only a backend turns them into its wire form. Their ``repr``
is a short description (kind, media type, size, short hash), so logs, spans
and reports never hold the bytes; the response cache and checkpoints key them
by their hash (`Media.key`).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from plait.errors import MediaError

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "DEFAULT_MAX_BYTES",
    "WITH_CONTENT",
    "Audio",
    "File",
    "Image",
    "Media",
    "as_data",
    "is_media_key",
]

DEFAULT_MAX_BYTES = 20 * 1024 * 1024
"""The largest item accepted unless ``max_bytes=`` says otherwise (20 MiB)."""

_DATA_URI = re.compile(r"data:([\w.+-]+/[\w.+-]+)?(;[^,]*)?,", re.ASCII)
_HEX_KEY = re.compile(r"[0-9a-f]{64}", re.ASCII)

Detail = Literal["auto", "low", "high"]


def _sha256(data: bytes) -> str:
    """Returns the SHA-256 of ``data`` in hex; hashlib (OpenSSL behind it) loads with the first
    media value, since `import plait` and programs of text never hash anything."""
    import hashlib  # import time: only media that hash their bytes

    return hashlib.sha256(data).hexdigest()


def _sniff_image(data: bytes) -> str | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _sniff_audio(data: bytes) -> str | None:
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    # An MP3 starts with an ID3 tag or with a frame header (11 sync bits set).
    if data.startswith(b"ID3") or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "audio/mpeg"
    return None


def _sniff_document(data: bytes) -> str | None:
    if data.startswith(b"%PDF-"):
        return "application/pdf"
    if b"\x00" in data[:8192]:
        return None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return "text/plain"


def _size(count: int) -> str:
    for unit, scale in (("MB", 1024 * 1024), ("kB", 1024)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


class _Content:
    """Holds the bytes outside the dataclass fields.

    Anything that serialises a dataclass by its fields (pydantic for reports,
    run rows and input hashes; ``dataclasses.asdict``) then sees the media
    type, URL and hash, never the bytes.
    """

    __slots__ = ("_data",)
    _data: bytes | None


@dataclass(frozen=True, slots=True, repr=False, init=False)
class Media(_Content):
    """What `Image`, `Audio` and `File` share: bytes (or a URL), media type and hash.

    Equal items are equal by content: the same bytes read from two paths are
    one value (the file name is kept only to label documents).
    """

    kind: ClassVar[str] = "media"
    """``image``, ``audio`` or ``file``: how providers and descriptions name it."""
    accepts: ClassVar[str] = ""
    """The formats this kind takes, for error messages."""

    media_type: str | None
    """The MIME type read from the bytes (``image/png``); for a URL, the one given, if any."""
    url: str | None
    """The ``http(s)`` URL sent as is, when the item is a URL."""
    sha256: str
    """Hex SHA-256 of the bytes (of the URL's text, for a URL): the item's identity."""
    name: str | None = field(compare=False)
    """A file name for providers that label documents; the path's name when read from one."""

    def __init__(
        self,
        source: str | os.PathLike[str] | bytes,
        *,
        media_type: str | None = None,
        name: str | None = None,
        max_bytes: int | None = None,
    ) -> None:
        cap = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
        if isinstance(source, bytes | bytearray | memoryview):
            self._set_bytes(bytes(source), "bytes", media_type, name, cap)
        elif isinstance(source, str) and source.startswith(("http://", "https://")):
            self._set_url(source, media_type, name)
        elif isinstance(source, str) and source.startswith("data:"):
            self._set_bytes(
                _decode_data_uri(source, self.kind), "a data URI", media_type, name, cap
            )
        elif isinstance(source, str | os.PathLike):
            from pathlib import Path  # import time: only media read from a file need it

            path = Path(source)
            data = _read_file(path, self.kind, cap)
            self._set_bytes(data, repr(str(path)), media_type, name or path.name, cap)
        else:
            raise MediaError(
                f"{type(self).__name__}(...) takes a path, bytes, an http(s) URL or a data: URI; "
                f"got {type(source).__name__}"
            )

    def _set_bytes(
        self, data: bytes, origin: str, media_type: str | None, name: str | None, cap: int
    ) -> None:
        if len(data) > cap:
            raise MediaError(
                f"{type(self).__name__} from {origin} is {_size(len(data))}, over the cap of "
                f"{_size(cap)} per item; shrink it, or pass max_bytes= to allow more"
            )
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "media_type", self._detect(data, origin, media_type))
        object.__setattr__(self, "url", None)
        object.__setattr__(self, "sha256", _sha256(data))
        object.__setattr__(self, "name", name)

    def _set_url(self, url: str, media_type: str | None, name: str | None) -> None:
        object.__setattr__(self, "_data", None)
        object.__setattr__(self, "media_type", media_type)
        object.__setattr__(self, "url", url)
        object.__setattr__(self, "sha256", _sha256(url.encode()))
        object.__setattr__(self, "name", name)

    def _detect(self, data: bytes, origin: str, declared: str | None) -> str:
        found = self._sniff(data)
        if found is None:
            raise MediaError(
                f"{type(self).__name__} from {origin}: the bytes are not {self.accepts} "
                f"(they start {data[:8]!r}); pass the right file, or use the matching kind "
                "(Image, Audio or File)"
            )
        return found

    @staticmethod
    def _sniff(data: bytes) -> str | None:  # pragma: no cover - each kind defines it
        raise NotImplementedError

    @property
    def data(self) -> bytes | None:
        """The content; None for a URL the provider fetches."""
        return self._data

    @property
    def size(self) -> int | None:
        """The number of bytes; None for a URL."""
        return None if self.data is None else len(self.data)

    @property
    def key(self) -> str:
        """What identifies the content in cache keys and checkpoints (kind and hash)."""
        return f"{self.kind}:{self.sha256}"

    def base64(self) -> str:
        """Returns the bytes as base64 text (for a provider's wire form).

        Raises:
            MediaError: the item is a URL, whose bytes plait never fetched.
        """
        if self.data is None:
            raise MediaError(
                f"{self!r} is a URL; this provider needs the bytes: download it and pass "
                "the bytes or a path"
            )
        return base64.b64encode(self.data).decode("ascii")

    def data_uri(self) -> str:
        """Returns the bytes as a ``data:`` URI (or the URL itself, for a URL)."""
        if self.url is not None:
            return self.url
        return f"data:{self.media_type};base64,{self.base64()}"

    def describe(self) -> str:
        """Returns the short description shown in reprs, logs, spans and reports."""
        if self.url is not None:
            shown = _shown_url(self.url)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            return f"{self.kind} {shown}"
        return f"{self.kind} {self.media_type}, {_size(len(self.data or b''))}, {self.sha256[:12]}"

    def summary(self) -> dict[str, Any]:
        """Returns the item as JSON data without its bytes: what spans, run reports, result
        rows and input hashes hold of it (kind, media type, size, hash, name or URL)."""
        data: dict[str, Any] = {
            "kind": self.kind,
            "media_type": self.media_type,
            "size": self.size,
            "sha256": self.sha256,
            "name": self.name,
            "url": None if self.url is None else _shown_url(self.url),
        }
        detail = getattr(self, "detail", None)
        if detail is not None:
            data["detail"] = detail
        return data

    def __repr__(self) -> str:
        return f"<{self.describe()}>"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        # A frozen slots class with its own __init__: pickle (Ray, deep copies) rebuilds it.
        return (_rebuild, (type(self), self._state()))

    def _state(self) -> dict[str, Any]:
        return {
            "_data": self._data,
            "media_type": self.media_type,
            "url": self.url,
            "sha256": self.sha256,
            "name": self.name,
        }

    def __copy__(self) -> Media:
        return self

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """Tells pydantic how to take this kind from data: an item as it is, or a ``data:``
        URI or ``http(s)`` URL built as the constructor builds it (the format read from the
        bytes, the cap applied). A path is refused: data reaching pydantic comes from outside
        (a served program's request, an MCP tool's arguments), which must not name the
        server's files. As data, an item is its `summary` (see `as_data`)."""
        # import time: pydantic loads on first use, not on a plain call
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(
            cls.from_data,
            serialization=core_schema.plain_serializer_function_ser_schema(as_data, info_arg=True),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        return {
            "type": "string",
            "format": "uri",
            "description": f"The {cls.kind} as a data: URI (data:<type>;base64,...) or an "
            f"http(s) URL; {cls.accepts}.",
        }

    @classmethod
    def from_data(cls, value: Any) -> Media:
        """Returns this kind from data: an item as it is, or one built from a ``data:`` URI or
        ``http(s)`` URL; never from a path (data comes from outside: a request, a data file).

        Raises:
            ValueError: anything else, or a URI whose bytes are not of this kind.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.startswith(("data:", "http://", "https://")):
            try:
                return cls(value)
            except MediaError as exc:
                raise ValueError(str(exc)) from None
        raise ValueError(
            f"give the {cls.kind} as a data: URI (data:<type>;base64,...) or an http(s) URL"
            + ("; a path is not read from a request" if isinstance(value, str) else "")
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> Media:
        return self


class _SummarySerializer:
    """``__pydantic_serializer__`` of every medium, built on first use (pydantic is heavy).

    Serialising a value into JSON data (``pydantic_core.to_jsonable_python``:
    spans, run reports, result rows, input hashes) then gives `Media.summary`.
    """

    def __get__(self, item: Any, owner: type) -> Any:
        # import time: pydantic loads on first use, not on a plain call
        from pydantic_core import SchemaSerializer, core_schema

        serializer = SchemaSerializer(
            core_schema.any_schema(
                serialization=core_schema.plain_serializer_function_ser_schema(
                    as_data, info_arg=True
                )
            )
        )
        Media.__pydantic_serializer__ = serializer  # type: ignore[attr-defined]  # built once
        return serializer


Media.__pydantic_serializer__ = _SummarySerializer()  # type: ignore[attr-defined]

WITH_CONTENT = {"plait_media": "content"}
"""The serialization context (``to_jsonable_python(..., context=WITH_CONTENT)``) in which
media are their content rather than their summary (see `as_data`)."""


def as_data(medium: Media, info: Any) -> Any:
    """Returns a medium as JSON data: its `summary`, or, in the context `WITH_CONTENT`, its
    `data_uri` (its bytes, or its URL), which pydantic reads back into an item of the same
    content and hash (not the ``name`` or ``detail`` it was given, which a request never
    gives): how a served program's paused run keeps its inputs until it is resumed."""
    if info.context == WITH_CONTENT:
        return medium.data_uri()
    return medium.summary()


def _shown_url(url: str) -> str:
    """A URL as plait shows it: without its query string, which may hold a token."""
    return url.split("?", 1)[0]


def _rebuild(cls: type[Media], state: dict[str, Any]) -> Media:
    item = object.__new__(cls)
    for key, value in state.items():
        object.__setattr__(item, key, value)
    return item


def is_media_key(text: Any) -> bool:
    """Whether ``text`` is a hex SHA-256, the only name a stored blob may have."""
    return isinstance(text, str) and _HEX_KEY.fullmatch(text) is not None


def _decode_data_uri(uri: str, kind: str) -> bytes:
    match = _DATA_URI.match(uri)
    if match is None or "base64" not in (match.group(2) or ""):
        raise MediaError(
            f"a {kind} data URI must look like data:<type>;base64,<data>; got {uri[:40]!r}"
        )
    try:
        return base64.b64decode(uri[match.end() :], validate=True)
    except binascii.Error:
        raise MediaError(f"the {kind} data URI does not hold valid base64") from None


def _read_file(path: Path, kind: str, cap: int) -> bytes:
    try:
        size = path.stat().st_size
        if size > cap:
            raise MediaError(
                f"{kind} file {str(path)!r} is {_size(size)}, over the cap of {_size(cap)} per "
                "item; shrink it, or pass max_bytes= to allow more"
            )
        with path.open("rb") as file:
            return file.read(cap + 1)
    except FileNotFoundError as exc:
        raise MediaError(
            f"cannot read {kind} file {str(path)!r}: {exc.strerror}; check the path (it is read "
            f"from {os.getcwd()}), or give an http(s) URL or a data: URI"
        ) from None
    except OSError as exc:
        raise MediaError(f"cannot read {kind} file {str(path)!r}: {exc.strerror}") from None


@dataclass(frozen=True, slots=True, repr=False, init=False)
class Image(Media):
    """An image: PNG, JPEG, GIF or WebP bytes, or an http(s) URL.

    Args:
        source: a path, bytes, an ``http(s)`` URL or a ``data:`` URI.
        detail: how closely the model looks (``low``, ``high`` or ``auto``);
            OpenAI reads it, other providers ignore it. None sends nothing.
        media_type: for a URL only, the type to announce (bytes say their own).
        name: a label (the file name when read from a path).
        max_bytes: the cap for this item (default `DEFAULT_MAX_BYTES`).

    Raises:
        MediaError: unreadable, over the cap, or not one of the formats above.
    """

    kind: ClassVar[str] = "image"
    accepts: ClassVar[str] = "a PNG, JPEG, GIF or WebP image"

    detail: Detail | None = None

    def __init__(
        self,
        source: str | os.PathLike[str] | bytes,
        *,
        detail: Detail | None = None,
        media_type: str | None = None,
        name: str | None = None,
        max_bytes: int | None = None,
    ) -> None:
        if detail not in (None, "auto", "low", "high"):
            raise MediaError(f"Image detail must be 'auto', 'low' or 'high'; got {detail!r}")
        Media.__init__(self, source, media_type=media_type, name=name, max_bytes=max_bytes)
        object.__setattr__(self, "detail", detail)

    _sniff = staticmethod(_sniff_image)

    @property
    def key(self) -> str:
        return f"image:{self.sha256}:{self.detail or ''}"

    def _state(self) -> dict[str, Any]:
        return {**Media._state(self), "detail": self.detail}


@dataclass(frozen=True, slots=True, repr=False, init=False)
class Audio(Media):
    """A sound clip: WAV or MP3 bytes (read from a path, bytes or a data URI).

    Providers take audio only as bytes, so a URL is refused when the call is
    made, not here. `format` is the short name the OpenAI wire wants.

    Raises:
        MediaError: unreadable, over the cap, or neither WAV nor MP3.
    """

    kind: ClassVar[str] = "audio"
    accepts: ClassVar[str] = "WAV or MP3 audio"

    _sniff = staticmethod(_sniff_audio)

    @property
    def format(self) -> str:
        """``wav`` or ``mp3`` (from the media type)."""
        return "mp3" if self.media_type == "audio/mpeg" else "wav"


@dataclass(frozen=True, slots=True, repr=False, init=False)
class File(Media):
    """A document: PDF, or UTF-8 text (plain, Markdown, CSV ...).

    Text has no magic number; it is recognised as valid UTF-8 without NUL
    bytes and sent as ``text/plain`` unless ``media_type=`` names another
    ``text/`` type. The name labels the document for providers that show one
    (``document.pdf`` when there is none).

    Raises:
        MediaError: unreadable, over the cap, or neither PDF nor UTF-8 text.
    """

    kind: ClassVar[str] = "file"
    accepts: ClassVar[str] = "a PDF or UTF-8 text document"

    _sniff = staticmethod(_sniff_document)

    def _detect(self, data: bytes, origin: str, declared: str | None) -> str:
        found = Media._detect(self, data, origin, declared)
        if found == "text/plain" and declared and declared.startswith("text/"):
            return declared
        return found

    @property
    def filename(self) -> str:
        """The name providers show for the document."""
        if self.name:
            return self.name
        return "document.pdf" if self.media_type == "application/pdf" else "document.txt"
