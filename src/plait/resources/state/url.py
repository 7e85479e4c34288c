"""The one reader of a state URL: which store it names, and how it may be shown.

``state="postgresql://user:secret@db:5432/plait?schema=myproject"`` names a
PostgreSQL database (``postgres://`` too); ``sqlite:///path/state.sqlite`` or
a plain path names an SQLite file. The password never leaves this module in
text: `StateURL.shown` (also its ``str`` and ``repr``, and every error that
names a store) puts ``***`` in its place, including a ``password=`` query
option.

``schema`` is plait's own query option (removed before the URL reaches the
driver): the PostgreSQL schema that holds the project's tables, ``plait``
unless given, so several projects share one database without sharing state.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit

from plait.errors import ConfigError

__all__ = ["DEFAULT_SCHEMA", "StateURL"]

DEFAULT_SCHEMA = "plait"
"""The PostgreSQL schema of a URL without ``?schema=``."""

_POSTGRES_SCHEMES = frozenset({"postgresql", "postgres"})
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_MAX_URL = 4096


@dataclass(frozen=True)
class StateURL:
    """A parsed state URL.

    Attributes:
        kind: ``"postgres"`` or ``"sqlite"``.
        target: what the driver opens (the URL without plait's options, or
            the SQLite file path); holds the password, so never shown.
        schema: the PostgreSQL schema (``plait`` unless ``?schema=``).
        host, port: where a PostgreSQL server is looked for (for messages).
        shown: the URL with its password masked; what ``str`` and ``repr`` give.
    """

    kind: str
    target: str = field(repr=False)
    schema: str
    host: str
    port: int | None
    shown: str

    @classmethod
    def parse(cls, text: str | os.PathLike[str] | StateURL) -> StateURL:
        """Returns the URL of ``text``.

        Raises:
            ConfigError: not a PostgreSQL URL, ``sqlite://`` URL or path; a
                bad port or schema name (the message shows the URL masked).
        """
        if isinstance(text, StateURL):
            return text
        if isinstance(text, os.PathLike):
            return cls._sqlite(os.fspath(text))
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(
                f"state must be a PostgreSQL URL or an SQLite path, got {type(text).__name__} "
                f"{'(empty)' if isinstance(text, str) else ''}".rstrip()
            )
        if len(text) > _MAX_URL:
            raise ConfigError(f"state URL is {len(text)} characters long; at most {_MAX_URL}")
        scheme = text.split("://", 1)[0].lower() if "://" in text else ""
        if scheme in _POSTGRES_SCHEMES:
            return cls._postgres(text)
        if scheme == "sqlite":
            return cls._sqlite(text.split("://", 1)[1] or ".")
        if scheme:
            raise ConfigError(
                f"state URL {_masked(text)}: unknown scheme {scheme!r}; use "
                "postgresql://user@host:port/database or an SQLite file path"
            )
        return cls._sqlite(text)

    @classmethod
    def _sqlite(cls, path: str) -> StateURL:
        from pathlib import Path  # import time: only an SQLite URL (a first call imports none)

        resolved = str(Path(path).expanduser().absolute())
        return cls("sqlite", resolved, DEFAULT_SCHEMA, "", None, f"sqlite://{resolved}")

    @classmethod
    def _postgres(cls, text: str) -> StateURL:
        shown = _masked(text)
        parts = urlsplit(text)
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"state URL {shown}: the port is not a number 0-65535") from None
        options = parse_qsl(parts.query, keep_blank_values=True)
        schema = DEFAULT_SCHEMA
        kept = []
        for name, value in options:
            if name == "schema":
                schema = value
            else:
                kept.append((name, value))
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ConfigError(
                f"state URL {shown}: schema {schema!r} must be 1-63 lowercase letters, digits "
                "or _, not starting with a digit"
            )
        host = parts.hostname or dict(kept).get("host") or "localhost"
        base = text.split("?", 1)[0].split("#", 1)[0]
        target = f"{base}?{urlencode(kept)}" if kept else base
        return cls("postgres", target, schema, host, port or 5432, shown)

    @property
    def where(self) -> str:
        """The server's host and port (PostgreSQL) or the file (SQLite), for messages."""
        return f"{self.host}:{self.port}" if self.kind == "postgres" else self.target

    def __str__(self) -> str:
        return self.shown

    def __repr__(self) -> str:
        return f"StateURL({self.shown!r})"


def _masked(text: str) -> str:
    """Returns ``text`` with the password of its userinfo and any ``password=`` option masked."""
    scheme, sep, rest = text.partition("://")
    if sep:
        query = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
        at = rest.rfind("@", 0, query)
        user, colon, _ = rest[: max(at, 0)].partition(":")
        if at >= 0 and colon:
            rest = f"{user}:***{rest[at:]}"
        text = scheme + sep + rest
    return re.sub(r"(?i)(password=)[^&#]*", r"\1***", text)
