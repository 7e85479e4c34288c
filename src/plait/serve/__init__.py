"""``plait serve``: a program as an HTTP service (the ``serve`` extra: FastAPI, uvicorn,
prometheus_client).

::

    from plait.serve import app
    asgi = app(Report(), ResourceConfig.from_file("res.toml"))   # any ASGI server runs it
    # or: plait serve report.py:Report --resources res.toml

One app serves one or several programs (``app({"qa": qa, "chat": chat}, resources)``), all
sharing one `ResourceManager`, so endpoint limits, cache, retries and budgets hold across
every request. The routes, JSON shapes and options are in ``docs/how-to/serving.md``.

Layout: ``programs.py`` (request and response schemas from what a program declares),
``runs.py`` (the shared resources, admission, per-request usage, pauses and their resumes),
``pending.py`` (where paused runs wait: the `PendingStore` interface, its SQLite and
in-memory stores), ``pending_state.py`` (paused runs in the state store, shared by every
process and replica), ``owners.py`` (whose a paused run is: the fingerprint of its API key),
``page.py`` (the browser chat page at ``/``),
``events.py`` (stream events as SSE), ``asgi.py`` (the app and its routes),
``run_route.py`` (``POST /programs/{name}/run`` as plain ASGI in front of FastAPI),
``openai_api.py`` (``/v1/chat/completions``, ``/v1/models``), ``middleware.py`` (request ids,
access log, Host and Origin, API keys, JSON bodies and their size), ``metrics.py``
(Prometheus), ``responses.py`` (answers cancelled when their client leaves), ``errors.py``
(JSON errors, error ids), ``ids.py`` (request, run and completion ids from a pool of random
bytes), ``options.py``, ``server.py`` (uvicorn, draining on SIGTERM),
``http_protocol.py`` (uvicorn's protocol with request heads bounded in size and time),
``ray_serve.py`` (the same app as Ray Serve
replicas whose endpoint limits hold across the cluster; the ``serve-ray`` extra).

Nothing here is imported by ``import plait``; ``import plait.serve`` itself stays light
until `app` or `serve` is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plait import _lazy
from plait.errors import ConfigError

if TYPE_CHECKING:
    from fastapi import FastAPI

    from plait.serve.options import ServeOptions
    from plait.serve.pending import (
        GoneRun,
        MemoryPendingStore,
        PendingRun,
        PendingRunTooLarge,
        PendingStore,
        PendingStoreFull,
        SQLitePendingStore,
    )
    from plait.serve.server import serve

__all__ = [
    "GoneRun",
    "MemoryPendingStore",
    "PendingRun",
    "PendingRunTooLarge",
    "PendingStore",
    "PendingStoreFull",
    "SQLitePendingStore",
    "ServeOptions",
    "app",
    "serve",
]

_HOMES = {
    "GoneRun": "plait.serve.pending",
    "MemoryPendingStore": "plait.serve.pending",
    "PendingRun": "plait.serve.pending",
    "PendingRunTooLarge": "plait.serve.pending",
    "PendingStore": "plait.serve.pending",
    "PendingStoreFull": "plait.serve.pending",
    "SQLitePendingStore": "plait.serve.pending",
    "ServeOptions": "plait.serve.options",
    "serve": "plait.serve.server",
}


def app(programs: Any, resources: Any = None, **options: Any) -> FastAPI:
    """Returns an ASGI app (FastAPI) that serves ``programs`` with one set of ``resources``.

    Args:
        programs: a `Module`, a list of Modules (each named after its class), or a mapping
            ``name -> Module``; each is served at ``/programs/{name}/run`` and, if it takes
            a conversation or a text, as the model ``name`` of ``/v1/chat/completions``.
        resources: a `ResourceConfig`, a mapping, or a `ResourceManager`, shared by every
            request; None: the resources the programs are bound to.
        **options: `ServeOptions` fields (``api_keys``, ``max_queued``, ``deadline`` …).

    Raises:
        ConfigError: a program cannot be served, an option is invalid, or there are no
            resources.
    """
    try:
        from plait.serve.asgi import build_app  # import time: `import plait.serve` loads no FastAPI
    except ModuleNotFoundError as exc:
        if exc.name in ("fastapi", "starlette", "uvicorn", "prometheus_client"):
            raise ConfigError(f"plait.serve needs {exc.name}: pip install 'plait[serve]'") from None
        raise
    # import time: `import plait.serve` loads no FastAPI
    from plait.serve.options import ServeOptions

    return build_app(programs, resources, ServeOptions(**options))


__getattr__, __dir__ = _lazy.exports("plait.serve", _HOMES, globals(), __all__)
