"""`plait serve` on Ray Serve: the same app as replicas across a Ray cluster, with each
endpoint's limits held for the whole cluster (the ``serve-ray`` extra).

::

    from plait.serve.ray_serve import run
    run({"qa": QA()}, "res.toml", replicas=4, port=8000)     # a local Ray, or RAY_ADDRESS's
    # or: plait serve qa=prog.py:QA --resources res.toml --ray-replicas 4

    from plait.serve.ray_serve import deployment             # to deploy it yourself
    serve.run(deployment({"qa": QA()}, "res.toml", replicas=4), name="plait")

Each replica builds the app `plait.serve.app` builds (every route: typed runs, SSE, the
OpenAI-compatible ones, health and metrics) around a `ResourceManager` of its own whose
limiters lease their permits, rpm and tpm from one Ray actor per endpoint
(`plait.distributed`'s `EndpointLimits`, see `plait.distributed.leases`), so all replicas
together never put more than an endpoint's ``max_concurrent`` requests on the wire, and a
replica's calls rarely wait for the actor. A replica opens its leases (for the endpoints its
programs' modules name) before it takes requests, so finding the actors and the first
connection to them are not on a request's path. The actors are detached, so replicas can
restart or scale without taking the limits with them (a replica that dies gives its
permits back when its lease lapses), and named after the app and its limits, so a
redeploy with other limits gets fresh ones; they hold no CPU and go with the cluster.

The endpoints' ``budget`` are spent once by all replicas together: one more detached actor
of the app (`plait.distributed.ray.BudgetActor`) keeps their books, and every request
holds its worst case there before it is sent (two messages a request: the hold, and its
settle), waiting while room held by any replica may come back. The books last as long as
the actor, with the cluster: a redeploy with the same budgets goes on from what was
spent, one with other budgets or limits starts new books.

What stays per replica: admission (``max_active`` runs, ``max_queued`` waiting), the
response cache, usage totals, ``/metrics``, and paused runs (a paused run is kept by the
replica that paused it). Ray Serve may send a replica twice its places at once,
so an overload is still answered by plait's own 429 and health probes get through.

Programs and resources travel to the replicas: programs pickled (or a function, run on
each replica, that builds them), resources as a mapping or the path of their file.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from plait.errors import ConfigError

try:
    from ray import serve
except ModuleNotFoundError as exc:
    raise ConfigError(
        f"plait.serve.ray_serve needs {exc.name}: pip install 'plait[serve-ray]'"
    ) from None

import ray

from plait.cli.programs import load_program
from plait.distributed.ray import (
    budget_actor,
    build_config,
    cluster_budgets,
    cluster_limiters,
    config_spec,
    endpoints_used,
)
from plait.resources import ResourceManager
from plait.resources.config import ResourceConfig
from plait.serve import app
from plait.serve.options import ServeOptions, check_exposure

__all__ = ["PlaitReplica", "deployment", "programs_loader", "run"]


class PlaitReplica:
    """One Ray Serve replica: the served app around resources whose limits are the cluster's.

    Args:
        programs: what `plait.serve.app` takes, or a function that returns it on the replica.
        resources: a mapping of alias -> endpoint settings, or the path of their file.
        options: the server's options.
        namespace: names the endpoint actors every replica of the app shares.
    """

    def __init__(
        self, programs: Any, resources: dict[str, Any] | str, options: ServeOptions, namespace: str
    ) -> None:
        self._programs = programs
        self._resources = resources
        self._options = options
        self._namespace = namespace
        self._manager: Any = None

    async def __serve_build_asgi_app__(self) -> Any:
        programs = self._programs() if _is_builder(self._programs) else self._programs
        config = build_config(self._resources)
        # One state store for every replica: their paused runs, approvals and cache.
        state = self._options.state or config.state
        if state is not None:
            config = config.with_state(state)
        # "detached": the limits outlive any one replica, which Ray may restart or remove.
        limiters = cluster_limiters(self._namespace, lifetime="detached")
        # Before the replica takes requests: reaching the actors is not on a request's path.
        await limiters.open(endpoints_used(programs, config))
        # The books of the endpoints' budgets, one for all replicas, outlive any replica too.
        budgets = cluster_budgets(budget_actor(self._namespace, lifetime="detached"))
        self._manager = ResourceManager(config, limiter_factory=limiters, budget_store=budgets)
        return app(programs, self._manager, **{**vars(self._options), "state": state})

    async def __del__(self) -> None:
        # The app does not close resources it was handed; the replica made them, it closes them.
        if self._manager is not None:
            await self._manager.aclose()


def deployment(
    programs: Any,
    resources: Any,
    *,
    replicas: int = 2,
    name: str = "plait",
    ray_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Returns a Ray Serve application serving ``programs`` from ``replicas`` replicas.

    Args:
        programs: a `Module`, a list or mapping of Modules (as `plait.serve.app` takes), or a
            function that returns one of those (run on each replica, e.g. to load a file).
        resources: a mapping of alias -> endpoint settings, a config file path, or a
            `ResourceConfig` read from a file.
        replicas: how many replicas serve requests.
        name: the application's name; with the limits it names the endpoint actors.
        ray_options: more `serve.deployment` options (``ray_actor_options``,
            ``autoscaling_config``…); they win over the ones set here.
        **options: `ServeOptions` fields (``api_keys``, ``max_queued``, ``deadline``…).

    Raises:
        ConfigError: the options or resources are invalid, or ``replicas`` is below 1.
    """
    if replicas < 1:
        raise ConfigError(f"ray replicas must be at least 1, got {replicas}")
    serve_options = ServeOptions(**options)
    spec = _resources_spec(resources)
    config = build_config(spec)  # a wrong file is told here, once, not by every replica
    places = serve_options.max_active + serve_options.max_queued
    settings: dict[str, Any] = {
        "name": name,
        "num_replicas": replicas,
        "max_ongoing_requests": 2 * places,
        "graceful_shutdown_timeout_s": serve_options.grace,
        **(ray_options or {}),
    }
    replica = serve.deployment(**settings)(serve.ingress()(PlaitReplica))
    return replica.bind(programs, spec, serve_options, _namespace(name, config))


def run(
    programs: Any,
    resources: Any,
    *,
    replicas: int = 2,
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str = "plait",
    blocking: bool = False,
    ray_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> None:
    """Deploys ``programs`` on Ray Serve; returns once every replica is up, or with
    ``blocking`` once SIGTERM or Ctrl-C has stopped the app.

    Uses the Ray cluster this process is connected to, or starts one (``RAY_ADDRESS``
    names an existing cluster). Ray Serve's proxy answers on ``host:port``; Serve keeps
    those of its first start on a cluster. Stopping deletes the app: each replica takes no
    new requests and finishes those it has within ``grace`` seconds (a Ray this call
    started is then shut down). Without ``blocking``, ``ray.serve.delete(name)`` stops it.

    Raises:
        ConfigError: as `deployment`, or ``host`` is not loopback and no API key is set.
    """
    check_exposure(host, ServeOptions(**options))
    application = deployment(
        programs, resources, replicas=replicas, name=name, ray_options=ray_options, **options
    )

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init()
    # After ray.init, whose own SIGTERM handler exits at once, and before the app is up.
    stop = _stop_on_signals() if blocking else None
    serve.start(http_options={"host": host, "port": port})
    serve.run(application, name=name, route_prefix="/")
    if stop is None:
        return
    while not stop.wait(1.0):  # a bounded wait lets Python run the signal handlers
        pass
    serve.delete(name)
    if started_ray:
        ray.shutdown()


def _stop_on_signals() -> threading.Event:
    """Returns an event that SIGTERM or SIGINT sets (handlers of this main thread)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _is_builder(programs: Any) -> bool:
    """Whether ``programs`` is a function that builds the programs (a Module is callable too,
    so only plain functions and partials count)."""
    return inspect.isfunction(programs) or isinstance(programs, functools.partial)


def _resources_spec(resources: Any) -> dict[str, Any] | str:
    """Returns what a replica rebuilds the resources from.

    Raises:
        ConfigError: the resources cannot be sent to replicas, or are invalid.
    """
    try:
        return config_spec(resources)
    except TypeError as exc:
        raise ConfigError(f"Ray Serve replicas cannot get these resources: {exc}") from None


def _namespace(name: str, config: ResourceConfig) -> str:
    """Names the endpoint and budget actors of an app: its name and a digest of each
    endpoint's limits and budget, so replicas of one deployment share them and a redeploy
    with other limits or budgets does not."""
    limits = [
        (endpoint.name, endpoint.max_concurrent, endpoint.rpm, endpoint.tpm, endpoint.budget)
        for endpoint in config.endpoints()
    ]
    digest = hashlib.sha256(json.dumps(limits).encode()).hexdigest()[:12]
    return f"serve:{name}:{digest}"


def load_programs(named: list[tuple[str, str]]) -> dict[str, Any]:
    """Loads ``(name, "file.py:Name")`` programs as ``plait serve`` does (on a replica)."""
    return {name: load_program(spec) for name, spec in named}


def programs_loader(named: list[tuple[str, str]]) -> Callable[[], dict[str, Any]]:
    """Returns a function that loads ``(name, spec)`` programs where it runs (each replica).

    A ``file.py`` is named by its absolute path, since a replica's working directory is not
    this one; a ``pkg.module`` must be importable on every node.
    """
    return functools.partial(load_programs, [(name, _absolute(spec)) for name, spec in named])


def _absolute(spec: str) -> str:
    where, sep, attribute = spec.partition(":")
    if sep and where.endswith(".py"):
        return f"{Path(where).resolve()}:{attribute}"
    return spec
