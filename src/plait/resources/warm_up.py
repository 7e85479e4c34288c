"""Starts importing what an endpoint's first call needs as soon as its configuration is built.

A cold process spent most of its first call importing aiohttp, on the event
loop's thread, in the middle of the first request. A `ResourceConfig` that
lists an OpenAI-compatible endpoint on the aiohttp transport (the default)
now starts those imports on a background thread
(`plait.backends._imports.import_in_background`) while the program is built
and bound; the transport's first requests do not wait for it (they go over
the standard library while aiohttp loads, `plait.backends.openai._first_requests`),
and a stream waits for it without blocking the loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from plait.backends._imports import BackgroundImport, import_in_background

if TYPE_CHECKING:
    from plait.resources.config import EndpointConfig

__all__ = ["modules_for", "start_for"]

# What the first call of an OpenAI-compatible endpoint imports that `import plait`
# and `ResourceConfig` do not: the backend's module, then aiohttp (which brings
# yarl, multidict and asyncio). Found with ``python -X importtime`` on a script
# that builds a program and runs it against plait.testing's scripted server.
# Before aiohttp, what the first requests use while it loads (`http.client` on
# threads, and the IDNA codec that encodes a connection's host name): imported
# on the way to the first request, they delayed it by their import time twice
# over (aiohttp's import held the GIL half the time); imported here, they are
# ready while the program is traced (cold_start_bench: ideal + 156 -> 135 ms
# with the lazy imports of the same change, nearly all of it from this).
_AIOHTTP_FIRST_CALL = ("plait.backends.openai", "http.client", "encodings.idna", "aiohttp")


def modules_for(endpoint: EndpointConfig) -> tuple[str, ...]:
    """Returns the modules the first call of ``endpoint`` imports (none for most providers).

    Only the OpenAI-compatible endpoint on aiohttp, the default transport, is
    warmed up: its imports are plait's own dependencies, safe to run on a
    thread. The SDKs (``transport="sdk"``, ``anthropic``) and llama-cpp are
    optional packages whose imports are not known to be thread-safe, and a
    user-written backend is the user's.
    """
    if endpoint.backend is not None or endpoint.provider != "openai":
        return ()
    if endpoint.transport not in (None, "aiohttp"):
        return ()
    return _AIOHTTP_FIRST_CALL


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
