"""What the commands check before any model call, each mistake told on one line (exit 2):
files to write, the checkpoint folder, the resources and the aliases they serve, API keys,
prices for ``--max-cost``, resources for served programs, the port to listen on.

The names are the ``plait.cli`` package's own, for its commands.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

from plait.cli.exits import _fail


def _check_writable(path: Path | None, option: str) -> None:
    """Stops before any work when a file to write is a folder or has no folder to go in."""
    if path is None:
        return
    if path.is_dir():
        _fail(f"{option} {path} is a folder; name a file")
    folder = path.parent
    if not folder.is_dir():
        problem = "is a file" if folder.exists() else "does not exist"
        _fail(
            f"{option} {path}: the folder {folder} {problem}; create it first, or write elsewhere"
        )


def _check_checkpoint_dir(path: Path | None) -> None:
    if path is not None and path.exists() and not path.is_dir():
        _fail(f"--checkpoint-dir {path} is a file; name a folder (it is made if missing)")


def _with_state(resources: Any, url: str | None) -> Any:
    """Returns the resources keeping their state in ``--state`` (``url``), else in their own
    ``[state] url``; that store is opened once here, so one that cannot be reached stops
    the command before any work. Every command taking ``--state`` goes through this.

    Raises:
        StateError: the store cannot be reached (host and port named, password
            masked) or is newer than this plait; a `ConfigError`, so one line and exit 2.
    """
    # import time: `plait --help` loads none of this, the command does
    from plait.resources.config import resources_with_state
    from plait.resources.state import open_store, release_store

    if url is not None:
        try:
            resources = resources_with_state(resources, url)
        except TypeError as exc:
            _fail(f"--state: {exc}")
    state = getattr(resources, "state", None)  # a manager, or no resources, names none
    if state is not None:
        release_store(open_store(state))
    return resources


def _resources(path: Path | None, program: Any) -> Any:
    """Returns the resources of a run: read from ``--resources``, or bound to the program.

    Raises:
        ConfigError: the file is missing or invalid (names the file and alias).
    """
    # import time: `plait --help` loads none of this, the command does
    from plait.resources import ResourceConfig

    if path is not None:
        if not path.exists():
            _fail(f"--resources {path}: no such file; check the path (read from {Path.cwd()})")
        return ResourceConfig.from_file(path)
    if program._bound_resources is not None:
        return program._bound_resources
    _fail(
        f"{type(program).__name__} has no resources: pass --resources res.toml (a file of "
        "alias -> endpoint settings), or bind them where the program is built"
    )


def _aliases(program: Any) -> list[str]:
    """Returns the aliases the program's modules call, in module order."""
    found = (getattr(module, "alias", None) for module in program.modules())
    return list(dict.fromkeys(alias for alias in found if isinstance(alias, str)))


def _check_aliases(path: Path | None, resources: Any, calls: list[tuple[str, str]]) -> None:
    """Stops before any call when ``--resources`` serves none of an alias that is called.

    Args:
        calls: ``(who, alias)`` for each alias called (the program's, the optimizer's).
    """
    if path is None:
        return  # resources bound in code are the program's own business
    for who, alias in calls:
        if alias not in resources:
            served = ", ".join(repr(name) for name in resources.aliases()) or "none"
            entry = f"a table [{alias}]" if path.suffix == ".toml" else f"an entry {alias!r}"
            _fail(
                f"{who} calls the alias {alias!r}, which {path} does not serve (it serves: "
                f"{served}); add {entry} to it, or '*' for every alias"
            )


def _check_credentials(path: Path | None, resources: Any, calls: list[tuple[str, str]]) -> None:
    """Stops before any call when an endpoint an alias called is served by lacks its API key
    (the variable unset, none in the file): every call would fail without being sent."""
    # import time: `plait --help` loads none of this, the command does
    from plait.resources import ResourceConfig
    from plait.resources.endpoint import missing_credential

    config = getattr(resources, "config", resources)  # a manager's, or a config itself
    if not isinstance(config, ResourceConfig):
        return  # a mapping bound in code: its first call says the same
    for who, alias in calls:
        if alias not in config:
            continue  # bound in code and not served: the program's own business
        for endpoint in config.fallbacks(alias):
            missing = missing_credential(endpoint)
            if missing is not None:
                table = '["*"]' if endpoint.name == "*" else f"[{endpoint.name}]"
                where = f"{table} in {path}" if path is not None else "its entry in code"
                _fail(f"{who} calls the alias {alias!r}, whose {missing} ({where})")


def _check_priced(path: Path | None, resources: Any, calls: list[tuple[str, str]]) -> None:
    """Stops before any call when --max-cost is given and an endpoint called has no price:
    the budget could price none of its calls, and would refuse every one."""
    config = getattr(resources, "config", resources)  # a manager's, or a config itself
    if not hasattr(config, "fallbacks"):
        return  # a mapping bound in code: the budget itself names an unpriced endpoint
    toml = path is not None and path.suffix == ".toml"
    price = "price = {input = 0.15, output = 0.60}" if toml else '"price": {"input": 0.15, ...}'
    for who, alias in calls:
        for endpoint in config.fallbacks(alias):
            if endpoint.effective_price is None:
                table = '["*"]' if endpoint.name == "*" else f"[{endpoint.name}]"
                where = f"{table} in {path}" if toml else f"its entry in {path or 'code'}"
                _fail(
                    f"--max-cost needs the price of every endpoint, and {endpoint.name!r} "
                    f"({who}'s alias {alias!r}) has none; add {price} (dollars per "
                    f"million tokens) to {where}, or budget with --max-calls / --max-tokens"
                )


def _check_bound(programs: list[tuple[str, Any]]) -> None:
    """Stops before serving when a program calls a model and has no resources (no
    ``--resources``, none bound in code nor configured), since every call would fail."""
    # import time: `plait --help` loads none of this, the command does
    from plait.execution.settings import find_resources

    for who, program in programs:
        aliases = _aliases(program)
        if aliases and find_resources(bound=program._bound_resources, module=program) is None:
            _fail(
                f"{who} calls the alias {aliases[0]!r} and has no resources: pass --resources "
                "res.toml (a file of alias -> endpoint settings), or bind them where the "
                "program is built"
            )


def _check_port(host: str, port: int) -> None:
    """Stops with one line when the server could not listen on ``host:port`` (a port another
    server holds, an address not of this machine), once the programs and resources are
    found right (a mistake in them is the more useful thing to hear first).

    The port is bound as uvicorn binds it (``SO_REUSEADDR``) and let go at once, so what
    this finds free the server then takes, unless another process takes it in between.
    """
    import socket  # import time: only `plait serve` checks its port

    if port == 0:
        return  # the system picks a free one
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            _fail(
                f"port {port} on {host} is in use (another server listens there); stop it, "
                "or pass --port with a free port"
            )
        _fail(f"cannot listen on {host} port {port}: {exc.strerror or exc}; pass another --host")
