"""Media-typed input fields given text: the one place a string becomes an `Image`,
`Audio` or `File` on its way to a model.

Values from data files (``plait run``/``plait eval`` columns) and hand-written calls
arrive as text. For a field typed with a media kind (``Image``, ``list[Image]``,
``Image | None``), a ``data:`` URI or an ``http(s)`` URL is that medium, built by the
kind's own parser (the one a served program's request goes through); any other text is
refused. A path is never read here: a data row must not make plait read files, and in
Python the caller builds the medium (``plait.Image('shape.png')``) where it chose the
path. Without this, the text reached the model as words ("picture: shape.png").
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from plait.errors import MediaError
from plait.media import Media

if TYPE_CHECKING:
    from plait.signatures.signature import Signature

__all__ = ["media_inputs"]


def media_inputs(signature: type[Signature], inputs: Mapping[str, Any]) -> Mapping[str, Any]:
    """Returns ``inputs`` with the text given to media-typed fields made media.

    Raises:
        MediaError: a media-typed field got text that is neither a ``data:`` URI nor an
            ``http(s)`` URL, or a URI whose bytes are not of the field's kind; the one-line
            message names the field, its type and what to give.
    """
    changed: dict[str, Any] = {}
    for name, spec in signature.input_fields.items():
        kind = _media_kind(spec.annotation)
        value = inputs.get(name)
        if kind is None:
            continue
        if isinstance(value, str):
            changed[name] = _medium(kind, signature, name, value)
        elif isinstance(value, list | tuple) and any(isinstance(item, str) for item in value):
            changed[name] = [
                _medium(kind, signature, name, item) if isinstance(item, str) else item
                for item in value
            ]
    return {**inputs, **changed} if changed else inputs


def _media_kind(annotation: Any) -> type[Media] | None:
    """Returns the media kind of ``Image``, ``Image | None``, ``list[Image]``…, else None."""
    if isinstance(annotation, type):
        return annotation if issubclass(annotation, Media) else None
    origin = typing.get_origin(annotation)
    if origin not in (list, tuple, typing.Union, types.UnionType):
        return None
    # Every member a medium of one kind: ``str | Image`` takes text as text.
    args = [a for a in typing.get_args(annotation) if a not in (type(None), Ellipsis)]
    kinds = {_media_kind(arg) for arg in args}
    return kinds.pop() if len(kinds) == 1 else None


def _medium(kind: type[Media], signature: type[Signature], name: str, text: str) -> Media:
    where = f"{signature.__name__} input {name!r} (typed {kind.__name__})"
    if not text.startswith(("data:", "http://", "https://")):
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise MediaError(
            f"{where} got the text {shown!r}, which is not sent as text: in Python give "
            f"plait.{kind.__name__}({shown!r}); in a data file give a data: URI "
            f"(data:<type>;base64,...) or an https: URL (a path in a data file is not read)"
        )
    try:
        return kind.from_data(text)
    except ValueError as exc:
        raise MediaError(f"{where}: {exc}") from None
