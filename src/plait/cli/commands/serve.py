"""``plait serve``: programs served over HTTP (`plait.serve`), in one process, in
``--workers`` processes, or on Ray Serve replicas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from plait.cli.checks import (
    _aliases,
    _check_aliases,
    _check_credentials,
    _check_port,
    _resources,
    _with_state,
)
from plait.cli.collection import fewer_collections
from plait.cli.exits import _fail, _usage_errors
from plait.cli.loading import _prepare
from plait.cli.options import _RESOURCES_HELP, Amount, WholeNumber
from plait.cli.programs import load_program
from plait.errors import FileError

__all__ = ["serve_command"]


PENDING_DB_NAME = "plait-pending.sqlite"


def _default_pending_db(resources: Path | None) -> Path:
    """Returns where paused runs are kept unless ``--pending-db`` says: beside the resources
    file (a deployment's own directory), else in the current directory."""
    return (resources.parent if resources is not None else Path()) / PENDING_DB_NAME


@click.command("serve", epilog=_RESOURCES_HELP)
@click.argument("program_specs", metavar="PROGRAM...", nargs=-1, required=True)
@click.option(
    "-r",
    "--resources",
    type=click.Path(path_type=Path),
    help="Endpoints file (.toml, .yaml, .json) every request shares (example below).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Interface to listen on; other than loopback needs an API key.",
)
@click.option("--port", type=WholeNumber(0, 65535), default=8000, show_default=True)
@click.option(
    "--workers",
    type=WholeNumber(min=1),
    default=1,
    show_default=True,
    help="Processes; each holds 1/N of every endpoint's limits (together, the limits); "
    "each loads its own local model.",
)
@click.option(
    "--ray-replicas",
    type=WholeNumber(min=1),
    help="Serve from N Ray Serve replicas (a local Ray, or RAY_ADDRESS's cluster); "
    "endpoint limits hold across all of them.",
)
@click.option(
    "--grace",
    type=Amount(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds runs in flight may take to finish on SIGTERM.",
)
@click.option(
    "--api-key-env",
    "api_key_envs",
    multiple=True,
    metavar="NAME",
    help="Environment variable holding API key(s), comma-separated.",
)
@click.option(
    "--api-key-file",
    "api_key_files",
    multiple=True,
    type=click.Path(path_type=Path),
    help="File of API keys, one a line.",
)
@click.option(
    "--cors-origin",
    "cors_origins",
    multiple=True,
    metavar="ORIGIN",
    help="Let browsers on ORIGIN call the API ('*' for any); CORS is off without it.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A host name clients may reach the server by besides localhost, 127.0.0.1 and "
    "[::1] ('*' for any); without API keys no other name is answered (421).",
)
@click.option(
    "--max-queued",
    type=WholeNumber(min=0),
    default=512,
    show_default=True,
    help="Runs that may wait for a place; beyond, 429 with Retry-After.",
)
@click.option(
    "--max-active",
    type=WholeNumber(min=1),
    default=128,
    show_default=True,
    help="Runs executing at once.",
)
@click.option(
    "--max-body",
    "max_body_bytes",
    type=WholeNumber(min=1),
    default=1_048_576,
    show_default=True,
    help="Largest request body in bytes (413 beyond).",
)
@click.option(
    "--deadline",
    type=Amount(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds one request may run (504 beyond).",
)
@click.option(
    "--pending-db",
    type=click.Path(path_type=Path, dir_okay=False),
    help="SQLite file of runs waiting for approval and of used approvals "
    f"[default: {PENDING_DB_NAME} beside --resources, else in the current directory].",
)
@click.option(
    "--pending-ttl",
    type=Amount(min=0, min_open=True),
    default=86_400.0,
    show_default=True,
    help="Seconds a paused run waits for its answer (410 beyond).",
)
@click.option(
    "--max-pending-bytes",
    type=WholeNumber(min=1),
    default=4 * 1_048_576,
    show_default=True,
    help="Largest stored state of one paused run (507 beyond).",
)
@click.option(
    "--max-pending-runs",
    type=WholeNumber(min=1),
    default=1_000,
    show_default=True,
    help="Paused runs kept at once, of every key (503 beyond).",
)
@click.option(
    "--max-pending-per-key",
    type=WholeNumber(min=1),
    default=100,
    show_default=True,
    help="Paused runs kept at once for one API key (429 beyond).",
)
@click.option(
    "--state",
    metavar="URL",
    help="State store (postgresql://user@host:port/db?schema=NAME, or an SQLite path) "
    "keeping paused runs, used approvals and the cache (endpoints with cache = true), "
    "shared by every process and replica given it; instead of --pending-db.",
)
@click.option(
    "--access-log/--no-access-log",
    default=True,
    show_default=True,
    help="Write one JSON line per request (request id, method, path, status, duration, "
    "client) to standard error.",
)
@click.option(
    "--approval-key-env",
    metavar="NAME",
    help="Environment variable holding the approval key (32+ bytes) that seals pauses, so "
    "paused runs can be resumed after a restart [default: PLAIT_APPROVAL_KEY].",
)
def serve_command(program_specs: tuple[str, ...], resources: Path | None, host: str, port: int,
                  workers: int, ray_replicas: int | None, api_key_envs: tuple[str, ...],
                  api_key_files: tuple[Path, ...], pending_db: Path | None,
                  state: str | None, **options: Any) -> None:  # fmt: skip
    """Serve PROGRAM(s) over HTTP: typed runs, SSE, OpenAI-compatible chat, approvals, a
    chat page, metrics.

    Each PROGRAM is pkg.module:Name or file.py:Name, served under its name, or
    NAME=PROGRAM to choose the name. Routes: GET / (the chat page), POST /programs/NAME/run,
    POST /programs/NAME/runs/ID/resume, POST /v1/chat/completions, GET /openapi.json,
    /healthz, /readyz, /metrics.
    """
    # import time: `plait --help` loads no server
    from plait.serve.options import ServeOptions, check_exposure, read_api_keys

    with _usage_errors():
        named = [_served_name(spec) for spec in program_specs]
        keys = read_api_keys(api_key_envs, api_key_files)
        serve_options = ServeOptions(
            api_keys=tuple(keys),
            cors_origins=tuple(options.pop("cors_origins")),
            allowed_hosts=tuple(options.pop("allowed_hosts")),
            pending_db=str(pending_db or _default_pending_db(resources)),
            state=state,
            workers=workers,
            **options,
        )
        check_exposure(host, serve_options)
        if ray_replicas is not None and workers > 1:
            _fail("--ray-replicas and --workers both run copies of the server; choose one")
        if workers > 1:
            # import time: `plait --help` loads no server
            from plait.serve.runs import check_shares
            from plait.serve.server import serve_workers

            # found wrong here, once, rather than in every worker
            loaded = {name: load_program(spec) for name, spec in named}
            config = _resources(resources, next(iter(loaded.values())))
            _with_state(config, state)  # refused before any process serves
            for name, program in loaded.items():
                calls = [(name, alias) for alias in _aliases(program)]
                _check_aliases(resources, config, calls)
                _check_credentials(resources, config, calls)
            check_shares(config, workers)
            _check_port(host, port)
            serve_workers(
                named, str(resources) if resources else None,
                host=host, port=port, options=serve_options,
            )  # fmt: skip
            return
        programs = {name: _prepare(spec, None, ())[0] for name, spec in named}
        config = _resources(resources, next(iter(programs.values())))
        _with_state(config, state)  # refused before the server starts
        for name, program in programs.items():
            calls = [(name, alias) for alias in _aliases(program)]
            _check_aliases(resources, config, calls)
            _check_credentials(resources, config, calls)
        if ray_replicas is not None:  # Ray Serve's proxy takes the port on the cluster's node
            _serve_on_ray(named, config, ray_replicas, host, port, serve_options)
            return
        _check_port(host, port)
        from plait.serve import app, serve  # import time: `plait --help` loads no server

        try:
            served = app(programs, config, **vars(serve_options))
        except FileError as exc:  # the pending runs file is a link, or not a store
            _fail(str(exc))
    with fewer_collections():  # a request's objects are freed by reference counting
        serve(served, host=host, port=port, options=serve_options)


def _serve_on_ray(
    named: list[tuple[str, str]],
    config: Any,
    replicas: int,
    host: str,
    port: int,
    options: Any,
) -> None:
    """Serves the programs from Ray Serve replicas (each loads them) until SIGTERM/Ctrl-C."""
    from plait.serve.ray_serve import programs_loader, run  # optional extra (plait[serve-ray])

    loader = programs_loader(named)
    run(loader, config, replicas=replicas, host=host, port=port, blocking=True, **vars(options))


def _served_name(spec: str) -> tuple[str, str]:
    """Returns ``(name, program)`` of ``NAME=PROGRAM``, or of ``PROGRAM`` named after it."""
    name, sep, program = spec.partition("=")
    if sep:
        return name, program
    return spec.rpartition(":")[2].rpartition(".")[2], spec
