"""``plait mcp``: programs and tools served as MCP tools (`plait.mcp.serving`)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from plait.cli.checks import (
    _aliases,
    _check_aliases,
    _check_bound,
    _check_credentials,
    _check_port,
    _with_state,
)
from plait.cli.exits import _fail, _usage_errors
from plait.cli.options import _RESOURCES_HELP, WholeNumber
from plait.cli.programs import ProgramError

__all__ = ["mcp_command"]


@click.command("mcp", epilog=_RESOURCES_HELP)
@click.argument("program_specs", metavar="PROGRAM...", nargs=-1, required=True)
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio for Claude Desktop and IDEs; http: streamable HTTP.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve HTTP on.")
@click.option("--port", type=WholeNumber(1, 65535), default=8000, show_default=True)
@click.option(
    "-r",
    "--resources",
    type=click.Path(path_type=Path),
    help="Endpoints file (.toml, .yaml, .json) for the programs' LLM calls.",
)
@click.option("--name", default="plait", show_default=True, help="The server's name.")
@click.option(
    "--api-key-env",
    "api_key_envs",
    multiple=True,
    metavar="NAME",
    help="HTTP: environment variable holding API key(s), comma-separated.",
)
@click.option(
    "--api-key-file",
    "api_key_files",
    multiple=True,
    type=click.Path(path_type=Path),
    help="HTTP: file of API keys, one a line.",
)
@click.option(
    "--state",
    metavar="URL",
    help="State store (postgresql://user@host:port/db?schema=NAME, or an SQLite path): "
    "endpoints of --resources with cache = true share their replies there.",
)
def mcp_command(program_specs: tuple[str, ...], transport: str, host: str, port: int,
                resources: Path | None, name: str, api_key_envs: tuple[str, ...],
                api_key_files: tuple[Path, ...], state: str | None) -> None:  # fmt: skip
    """Serve each PROGRAM as an MCP tool, so other agents and apps can call it.

    A PROGRAM is a Module (class, instance or builder), a plait Tool, or a list
    of them, named after its class; NAME=PROGRAM names it. A program's arguments
    are forward's parameters or its signature's input fields; its result comes
    back as text and structured content.
    Serves stdio until the client leaves, or HTTP at http://HOST:PORT/mcp
    until stopped; off loopback it needs API keys (--api-key-env, --api-key-file),
    sent as Authorization: Bearer <key>. Needs the mcp extra: pip install 'plait[mcp]'.
    """
    with _usage_errors():
        # optional extra (plait[mcp]); import time: `plait --help` loads none of this
        from plait.mcp.serving import check_exposure, load_named, server
        from plait.serve.options import read_api_keys
        from plait.tools import Tool

        keys = read_api_keys(api_key_envs, api_key_files)
        if keys and transport != "http":
            _fail("--api-key-env and --api-key-file are for --transport http")
        if transport == "http":
            check_exposure(host, keys)

        served = load_named(program_specs)
        items = served.items() if isinstance(served, dict) else ((None, p) for p in served)
        programs = [(who or type(p).__name__, p) for who, p in items if not isinstance(p, Tool)]
        config = None
        if resources is not None:
            # import time: `plait --help` loads none of this, the command does
            from plait.resources import ResourceConfig

            config = ResourceConfig.from_file(resources)
            calls = [(who, alias) for who, p in programs for alias in _aliases(p)]
            _check_aliases(resources, config, calls)
            _check_credentials(resources, config, calls)
        else:
            _check_bound(programs)
        if state is not None and config is None:
            _fail("--state keeps the state of the endpoints of --resources; give -r FILE")
        config = _with_state(config, state)
        try:
            mcp_server = server(served, config, name=name)
        except (ValueError, TypeError, ImportError) as exc:
            raise ProgramError(str(exc)) from None
    if transport == "http":
        _check_port(host, port)
    if transport == "http":
        click.echo(f"plait: serving {', '.join(mcp_server.entries)} over MCP at "
                   f"http://{host}:{port}/mcp", err=True)  # fmt: skip
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a served program stops
        mcp_server.run(transport, host=host, port=port, api_keys=keys)
