"""Who started a run: the fingerprint of the API key a request carried.

A paused run is read and resumed only with the key that started it, so the server keeps,
with each paused run, a fingerprint of that key: a SHA-256 under a name of its own, never the
key. `plait.serve.middleware.RequireApiKey` notes the fingerprint of the key a request
matched in its scope; the routes read it with `owner_of`. A server without keys has no
owners (None): every client of it is the same one.
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["OWNER", "fingerprint", "owner_of"]

OWNER = "plait.owner"
"""The key of the request's owner in its ASGI scope's ``state``."""


def fingerprint(key: str) -> str:
    """Returns what a store keeps of an API key: a hash that names it and gives nothing of it
    back (under a prefix of its own, so it matches no other hash of the key)."""
    return hashlib.sha256(b"plait.serve owner\x00" + key.encode()).hexdigest()


def owner_of(scope: Any) -> str | None:
    """Returns the fingerprint of the key the request was let in with, or None (no keys)."""
    state = scope.get("state")
    return state.get(OWNER) if isinstance(state, dict) else None
