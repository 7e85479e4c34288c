"""Starts importing what an endpoint's first call needs as soon as its configuration is built.

A cold process spent part of its first call importing, on the event loop's
thread, in the middle of the first request. A `ResourceConfig` that lists an
OpenAI-compatible endpoint on the http transport (the default) starts those
imports on a background thread
(`plait.backends._imports.import_in_background`) while the program is built
and bound. They are small since the transport is plait's own (the backend's
module, ~20 ms, and httptools, ~2 ms; aiohttp took ~100 ms), so a first call
that comes before they end just waits on the module's import lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from plait.backends._imports import BackgroundImport, import_in_background

if TYPE_CHECKING:
    from plait.resources.config import EndpointConfig

__all__ = ["modules_for", "start_for"]

# What the first call of an OpenAI-compatible endpoint imports that `import plait`
# and `ResourceConfig` do not: the backend's module, then the http transport's
# parser. Found with ``python -X importtime`` on a script that builds a program
# and runs it against plait.testing's scripted server. (With aiohttp as the
# transport, this also held `http.client` and the IDNA codec for the first
# requests sent while aiohttp loaded; plait's own client needs neither: it
# encodes an ASCII host name without the codec.)
_HTTP_FIRST_CALL = ("plait.backends.openai", "httptools")


def modules_for(endpoint: EndpointConfig) -> tuple[str, ...]:
    """Returns the modules the first call of ``endpoint`` imports (none for most providers).

    Only the OpenAI-compatible endpoint on http, the default transport, is
    warmed up: its imports are plait's own dependencies, safe to run on a
    thread. The SDKs (``transport="sdk"``, ``anthropic``) and llama-cpp are
    optional packages whose imports are not known to be thread-safe, and a
    user-written backend is the user's.
    """
    if endpoint.backend is not None or endpoint.provider != "openai":
        return ()
    if endpoint.transport not in (None, "http"):
        return ()
    return _HTTP_FIRST_CALL


def start_for(endpoints: Iterable[EndpointConfig]) -> BackgroundImport | None:
    """Starts importing, on a thread, what the first calls of ``endpoints`` need.

    Called by `ResourceConfig` once it is valid. Nothing starts when a
    background import already ran in this process, or when every module
    needed is already imported (a warm process, or endpoints that need none).

    Returns:
        The background import running or finished, or None.
    """
    wanted: list[str] = []
    for endpoint in endpoints:
        wanted.extend(name for name in modules_for(endpoint) if name not in wanted)
    return import_in_background(wanted) if wanted else None
