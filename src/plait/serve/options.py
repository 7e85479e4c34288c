"""`ServeOptions`: the limits, keys and switches of one server, checked when they are made."""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait.errors import ConfigError

__all__ = ["ServeOptions", "check_exposure", "is_loopback", "read_api_keys"]


@dataclass(frozen=True)
class ServeOptions:
    """How a server admits, limits and protects requests.

    Example::

        ServeOptions(api_keys=("s3cret-key",), max_queued=100, deadline=60)
    """

    api_keys: tuple[str, ...] = ()
    """Bearer tokens a request may carry; empty means no authentication (loopback only)."""
    max_active: int = 128
    """Runs executing at once; more wait in the queue. Model calls are limited separately,
    per endpoint, by the resources (``max_concurrent``, ``rpm`` …)."""
    max_queued: int = 512
    """Runs waiting for a place; beyond this a request is answered 429 with Retry-After."""
    retry_after: int = 1
    """Seconds a 429 (or a 503 while draining) asks the client to wait."""
    max_body_bytes: int = 1_048_576
    """Largest request body; a larger one is answered 413."""
    deadline: float | None = 300.0
    """Seconds one request may run (waits for limits included); past it, 504. None: no limit."""
    cors_origins: tuple[str, ...] = ()
    """Origins a browser may call from (``"*"`` for any); empty: CORS off."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names a request may name in its ``Host`` (and a browser's ``Origin``) besides
    ``localhost``, ``127.0.0.1`` and ``[::1]``, any port; ``"*"`` for any. Without API keys
    the check is always on (a web page whose own name was pointed at 127.0.0.1 cannot call
    the server: 421, or 403 for its ``Origin``); with keys, only when names are given."""
    max_head_bytes: int = 65_536
    """Largest request head (request line and headers); a larger one is answered 431 and
    its connection closed before the rest is read. Held by `plait.serve.serve`'s server
    (`plait.serve.server.http_protocol`)."""
    head_timeout: float = 10.0
    """Seconds a connection may take to send a request's head, from its opening or the
    request's first byte; then 408 and the connection is closed. Held like ``max_head_bytes``."""
    body_timeout: float = 60.0
    """Seconds a request may take to send its body once its head is in; then 408 and the
    connection is closed. Held like ``max_head_bytes``."""
    grace: float = 30.0
    """Seconds a stopping server lets runs in flight finish before it cancels them."""
    access_log: bool = True
    """Log one structured line per request (logger ``plait.serve.access``)."""
    workers: int = 1
    """Processes serving together with these resources (``plait serve --workers``): each
    holds one ``workers``-th of every endpoint's limits (``max_concurrent``, ``rpm``,
    ``tpm``), so together they never pass them."""
    budget_store: Any = None
    """Where the endpoints' ``budget`` are kept when processes spend them together (a
    `plait.resources.shared_budget.BudgetStore`); None: in this process. ``plait serve
    --workers N`` gives every worker the one SQLite file its parent made."""
    pending_store: Any = None
    """Where paused runs wait (a `PendingStore`); None: the state store ``state``, else the
    file ``pending_db``, else memory."""
    state: Any = None
    """The state store's URL (`plait.resources.state`; also a resources file's ``[state]
    url``): paused runs and used approvals are kept there (`StatePendingStore`), so every
    process and replica using it resumes any pause, once; the response cache too."""
    pending_db: str | None = None
    """The SQLite file of paused runs and used approvals (`SQLitePendingStore`); None: keep
    them in memory (lost when the server stops)."""
    pending_ttl: float = 86_400.0
    """Seconds a paused run waits for its answer; then it expires (a resume answers 410)."""
    max_pending_bytes: int = 4 * 1_048_576
    """Largest stored state of one paused run (its inputs, media included, and pause as JSON);
    a larger pause is answered 507."""
    max_pending_runs: int = 1_000
    """Paused runs kept at once, of every key; a pause past it is answered 503."""
    max_pending_per_key: int = 100
    """Paused runs kept at once for one API key; a pause past it is answered 429."""
    approval_key_env: str | None = None
    """The environment variable holding the approval key that seals pauses; None: the
    ``PLAIT_APPROVAL_KEY`` variable when set, else a random key of this process (so a paused
    run cannot be resumed after the server restarts)."""
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    """Room for later parts of the server (chat page, approvals) to carry their settings."""

    def __post_init__(self) -> None:
        counts = ("max_active", "max_queued", "max_body_bytes", "max_pending_bytes", "workers")
        for name in (*counts, "max_pending_runs", "max_pending_per_key", "max_head_bytes"):
            if getattr(self, name) < (0 if name == "max_queued" else 1):
                raise ConfigError(
                    f"serve option {name} must be positive, got {getattr(self, name)}"
                )
        for name in ("deadline", "grace", "pending_ttl", "head_timeout", "body_timeout"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"serve option {name} must be > 0 seconds, got {value}")
        if self.retry_after < 0:
            raise ConfigError(f"serve option retry_after must be >= 0, got {self.retry_after}")
        if self.approval_key_env is not None:
            self.approval_key()  # an unset variable or a short key is found now, not on a pause
        object.__setattr__(self, "api_keys", tuple(self.api_keys))
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))
        object.__setattr__(self, "allowed_hosts", tuple(map(_host_name, self.allowed_hosts)))
        for key in self.api_keys:
            if not isinstance(key, str) or len(key) < 8 or not key.isprintable() or " " in key:
                raise ConfigError(
                    "an API key must be text of at least 8 printable characters without spaces; "
                    "check the keys given to the server"
                )

    def approval_key(self) -> str | None:
        """Returns the approval key from ``approval_key_env``, or None when none is named.

        Raises:
            ConfigError: the variable is unset, or holds fewer than 32 bytes.
        """
        if self.approval_key_env is None:
            return None
        # import time: only when an approval key is named
        from plait.confirmation import MIN_KEY_BYTES

        key = os.environ.get(self.approval_key_env, "")
        if len(key.encode()) < MIN_KEY_BYTES:
            state = "is unset or empty" if not key else f"holds {len(key.encode())} bytes"
            raise ConfigError(
                f"--approval-key-env {self.approval_key_env}: the environment variable "
                f"{state}; it needs an approval key of at least {MIN_KEY_BYTES} bytes, made "
                "with python -c 'import secrets; print(secrets.token_hex(32))'"
            )
        return key


def read_api_keys(env_names: Iterable[str] = (), files: Iterable[str | Path] = ()) -> list[str]:
    """Returns the API keys held by environment variables and files.

    A variable may hold several keys separated by commas; a file holds one key a line
    (blank lines and lines starting with ``#`` are skipped).

    Raises:
        ConfigError: a variable is unset or empty, or a file cannot be read or has no key;
            names the variable or file (never a key).
    """
    keys: list[str] = []
    for name in env_names:
        found = [key.strip() for key in os.environ.get(name, "").split(",") if key.strip()]
        if not found:
            raise ConfigError(
                f"--api-key-env {name}: the environment variable {name} is unset or empty; "
                "export the key(s) there, comma-separated"
            )
        keys += found
    for path in map(Path, files):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise ConfigError(
                f"--api-key-file {path}: cannot read it ({reason}); name a UTF-8 text file "
                f"with one key a line (a relative path is read from {Path.cwd()})"
            ) from None
        found = [
            line.strip() for line in text.splitlines() if line.strip() and line.strip()[0] != "#"
        ]
        if not found:
            raise ConfigError(f"--api-key-file {path} holds no key; write one key a line")
        keys += found
    return keys


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, options: ServeOptions) -> None:
    """Refuses to serve a non-loopback host without API keys.

    Raises:
        ConfigError: ``host`` is reachable from other machines and no key is set.
    """
    if options.api_keys or is_loopback(host):
        return
    raise ConfigError(
        f"refusing to serve on {host} without API keys: anyone who can reach it could run "
        "the program at your expense; pass --api-key-env NAME or --api-key-file PATH, or "
        "bind 127.0.0.1"
    )


def _host_name(entry: str) -> str:
    """Returns an ``allowed_hosts`` entry as the ``Host`` header spells its name: lower case,
    an IPv6 address in brackets.

    Raises:
        ConfigError: the entry is not a bare host name (a URL, a port, spaces).
    """
    name = entry.strip().lower() if isinstance(entry, str) else ""
    if ":" in name and not name.startswith("["):
        with contextlib.suppress(ValueError):  # an IPv6 address given without its brackets
            name = f"[{ipaddress.IPv6Address(name)}]"
    bracketed = name.startswith("[") and name.endswith("]")
    port = ":" in name and not bracketed
    if not name or port or any(c in name for c in "/@ \t,") or not name.isprintable():
        raise ConfigError(
            f"allowed host {entry!r} is not a host name; give the name alone, as a client "
            "puts it in the Host header without its port (api.example.com, 10.0.0.5, [::1]), "
            "or '*' for any"
        )
    return name
