"""``plait state``: looking after the state store (`plait.resources.state`); ``prune`` removes
what was written long ago."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from plait.cli.exits import _fail, _usage_errors

if TYPE_CHECKING:
    from plait.resources.state import StateURL

__all__ = ["state_command"]

_UNITS = {"d": 86_400, "h": 3_600, "m": 60}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([dhm])")


def parse_duration(text: str) -> float:
    """Returns the seconds of ``30d``, ``12h`` or ``90m``.

    Raises:
        ValueError: saying what to write instead.
    """
    found = _DURATION.fullmatch(text.strip())
    if found is None or float(found[1]) <= 0:
        raise ValueError(
            f"--older-than {text!r} is not a duration; write a number and a unit: "
            "30d (days), 12h (hours) or 90m (minutes)"
        )
    return float(found[1]) * _UNITS[found[2]]


@click.group("state")
def state_command() -> None:
    """Look after the state store (--state URL): the shared cache, checkpoints, paused runs,
    budgets and learning checkpoints."""


@state_command.command("prune")
@click.option(
    "--state",
    "url",
    metavar="URL",
    help="State store (postgresql://user@host:port/db?schema=NAME, or an SQLite path) "
    "[default: the [state] url of --resources].",
)
@click.option(
    "-r",
    "--resources",
    type=click.Path(path_type=Path),
    help="Endpoints file whose [state] table names the store.",
)
@click.option(
    "--older-than",
    "older_than",
    required=True,
    metavar="AGE",
    help="Remove rows written longer ago than AGE: 30d, 12h or 90m.",
)
@click.option(
    "--table",
    "tables",
    multiple=True,
    type=click.Choice(["responses", "checkpoints", "pauses", "budgets", "learning", "all"]),
    default=("all",),
    show_default=True,
    help="Table to prune (repeatable).",
)
def prune_command(
    url: str | None, resources: Path | None, older_than: str, tables: tuple[str, ...]
) -> None:
    """Remove what the state store holds that was written before a time: replies cached,
    checkpoints of finished runs, notes of resumed pauses, books of old budgets.

    A row is removed by when it was last written: a checkpoint or budget still in use is
    rewritten as it moves on, so it stays.
    """
    # import time: the CLI starts fast; the store loads when this command runs
    from plait.resources.state import TABLES, open_store, release_store

    try:
        age = parse_duration(older_than)
    except ValueError as exc:
        _fail(str(exc))
    with _usage_errors():
        where: str | StateURL | None = url
        if where is None and resources is not None:
            from plait.resources import ResourceConfig  # import time: only with --resources

            where = ResourceConfig.from_file(resources).state
        if where is None:
            _fail(
                "plait state prune: name the store with --state URL (or -r FILE with [state] url)"
            )
        store = open_store(where)
    before = time.time() - age
    chosen = TABLES if "all" in tables else tuple(t for t in TABLES if t in tables)
    try:
        if not store.is_usable:
            _fail(f"state store {store.url} cannot be used; see the warning above")
        moment = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(before))
        for table in chosen:
            removed = store.prune(table, before)
            click.echo(f"{table}: removed {removed} rows written before {moment}")
    finally:
        release_store(store)
