"""Running the app with uvicorn: the exposure check, and a stop that drains.

On SIGTERM (or Ctrl-C) the server first drains: ``/readyz`` answers 503 and new runs are
refused (503 ``draining``) while the runs in flight finish, for at most ``grace`` seconds;
then uvicorn stops as usual and cancels whatever is left. A second signal stops at once.
With ``workers > 1`` uvicorn's process manager runs the workers: each loads the programs
and opens its own resources holding one ``workers``-th of every endpoint's limits (so
together they never pass them), and a stop lets requests finish within ``grace``
(uvicorn's graceful timeout) without the readiness phase. Every connection is served by
`plait.serve.http_protocol.BoundedHttp`, which bounds a request's head and the time a client
takes to send a request. The endpoints' ``budget`` are not split but shared: the parent
makes a private folder (mode 0700) with one SQLite file
(`plait.resources.budget_file.BudgetFile`) that every worker holds and settles its
requests in, so the workers together spend each budget once; the folder goes when the
server stops. Given a state store, the budgets are kept there instead
(`plait.resources.budget_state.StateBooks`), shared with every machine serving with it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvicorn

from plait._files import read_json, write_atomically
from plait.cli.programs import load_program
from plait.resources import ResourceConfig
from plait.resources.shared_budget import BudgetStore
from plait.serve import app
from plait.serve.http_protocol import http_protocol
from plait.serve.options import ServeOptions, check_exposure

__all__ = ["DrainingServer", "log_access_to_stderr", "serve", "serve_workers", "worker_app"]

logger = logging.getLogger("plait.serve")

_WORKER_CONFIG_ENV = "PLAIT_SERVE_WORKER_CONFIG"
"""The environment variable naming the file where `serve_workers` tells each worker process
what to load (the command line's own arguments, API keys included: `_private_file`)."""


def serve(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    options: ServeOptions | None = None,
    log_level: str = "info",
) -> None:
    """Serves ``app`` (from `plait.serve.app`) until SIGTERM or Ctrl-C, then drains it.

    Raises:
        ConfigError: ``host`` is not loopback and no API key is set.
    """
    options = options or getattr(app.state, "options", None) or ServeOptions()
    check_exposure(host, options)
    if options.access_log:
        log_access_to_stderr()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=http_protocol(options),
        timeout_graceful_shutdown=1,  # what outlives the drain is cancelled soon after it
        access_log=False,  # plait.serve.access logs every request with its id
    )
    DrainingServer(config, app.state.runs, options.grace).run()


def serve_workers(
    programs: list[tuple[str, str]],
    resources_path: str | None,
    *,
    host: str,
    port: int,
    options: ServeOptions,
    log_level: str = "info",
) -> None:
    """Serves the named programs from ``options.workers`` processes (each builds its own
    app, holding its share of the endpoints' limits).

    Raises:
        ConfigError: ``host`` is not loopback and no API key is set.
    """
    check_exposure(host, options)
    folder = tempfile.mkdtemp(prefix="plait-serve-")  # mode 0700: this user's alone
    config = {
        "programs": programs,
        "resources": resources_path,
        "options": _plain(options),
        "budget_file": str(Path(folder) / "budgets.db"),
    }
    try:
        os.environ[_WORKER_CONFIG_ENV] = _private_file(folder, json.dumps(config))
        try:
            uvicorn.run(
                "plait.serve.server:worker_app",
                factory=True,
                host=host,
                port=port,
                workers=options.workers,
                log_level=log_level,
                http=http_protocol(options),
                timeout_graceful_shutdown=int(options.grace),
                access_log=False,
            )
        finally:
            del os.environ[_WORKER_CONFIG_ENV]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _private_file(folder: str, text: str) -> str:
    """Writes ``text`` to a file in ``folder`` (made with mode 0700, so this user's alone)
    and returns its path.

    The workers' configuration holds the API keys, so it never goes in the environment,
    which every process a tool starts inherits: the environment names this file, and each
    worker takes that name out of its own as it reads it. The file stays while the server
    runs, for the workers uvicorn starts again in place of ones that died; the folder goes
    when the server stops.
    """
    path = os.path.join(folder, "workers.json")
    write_atomically(path, text)
    return path


def worker_app() -> Any:
    """Builds the app of one worker process from what `serve_workers` wrote for it."""
    # import time: sqlite3 only for a shared budget
    from plait.resources.budget_file import BudgetFile

    config = read_json(os.environ.pop(_WORKER_CONFIG_ENV))
    if config["options"]["access_log"]:
        log_access_to_stderr()
    programs = {name: load_program(spec) for name, spec in config["programs"]}
    resources = ResourceConfig.from_file(config["resources"]) if config["resources"] else None
    # With a state store the budgets are kept there (every machine's workers share them).
    shared = config["options"]["state"] or getattr(resources, "state", None)
    budgets = None if shared else BudgetStore(BudgetFile(config["budget_file"]))
    return app(programs, resources, budget_store=budgets, **config["options"])


def log_access_to_stderr() -> None:
    """Sends the access log's lines (logger ``plait.serve.access``), one JSON object a line,
    to standard error, unless logging is configured to send them somewhere already."""
    # import time: only for an access log on stderr
    from plait.serve.middleware import MESSAGE_ONLY, BatchedStreamHandler, access_logger

    if access_logger.hasHandlers():
        return
    handler = BatchedStreamHandler(sys.stderr)
    handler.setFormatter(MESSAGE_ONLY)
    access_logger.addHandler(handler)
    access_logger.setLevel(logging.INFO)
    access_logger.propagate = False


def _plain(options: ServeOptions) -> dict[str, Any]:
    """Returns the options a worker can be given as JSON (a pending store cannot)."""
    return {
        "api_keys": list(options.api_keys),
        "max_active": options.max_active,
        "max_queued": options.max_queued,
        "retry_after": options.retry_after,
        "max_body_bytes": options.max_body_bytes,
        "deadline": options.deadline,
        "cors_origins": list(options.cors_origins),
        "allowed_hosts": list(options.allowed_hosts),
        "max_head_bytes": options.max_head_bytes,
        "head_timeout": options.head_timeout,
        "body_timeout": options.body_timeout,
        "grace": options.grace,
        "access_log": options.access_log,
        "workers": options.workers,
        "pending_db": options.pending_db,
        "state": options.state,
        "pending_ttl": options.pending_ttl,
        "max_pending_bytes": options.max_pending_bytes,
        "max_pending_runs": options.max_pending_runs,
        "max_pending_per_key": options.max_pending_per_key,
        "approval_key_env": options.approval_key_env,
    }


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first stop signal drains the runs before the server stops.

    Args:
        config: the uvicorn configuration.
        runs: the app's `RunService` (told it drains; asked how many runs are left).
        grace: seconds the runs in flight may take to finish.
    """

    def __init__(self, config: Any, runs: Any, grace: float) -> None:
        super().__init__(config)
        self.runs = runs
        self.grace = grace
        self.drain_started: float | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.drain_started is None:
            self.drain_started = time.monotonic()
            self.runs.draining = True
            logger.info(
                "plait serve: stopping; %d runs in flight may take up to %g s to finish",
                self.runs.admission.in_flight,
                self.grace,
            )
            return
        super().handle_exit(sig, frame)  # a second signal: stop now
        self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.drain_started is not None:
            left = self.runs.admission.in_flight
            if left == 0 or time.monotonic() - self.drain_started >= self.grace:
                if left:
                    logger.warning("plait serve: %d runs did not finish within the grace", left)
                self.should_exit = True
        return await super().on_tick(counter)
