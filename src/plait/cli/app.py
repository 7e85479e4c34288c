"""The ``plait`` click group (imported only by `plait.cli.main`): click's usage errors told
on one line, and the eight commands, one module each in `plait.cli.commands`, each loaded
only when named (``plait run`` pays for run's module, not eval's or serve's)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import click

from plait.cli import EXIT_INTERRUPTED
from plait.cli.programs import one_line

__all__ = ["cli"]

_COMMANDS = {
    name: f"plait.cli.commands.{name}:{name}_command"
    for name in ("eval", "graph", "mcp", "report", "run", "serve", "state", "train")
}
"""Each command's name and where its click command lives: a fixed table in the code, so
nothing typed on the command line chooses a module beyond these."""


class _OneLineUsage(click.UsageError):
    """A usage error click found, shown like every other mistake: on one line."""

    def show(self, file: Any = None) -> None:
        command = self.ctx.command_path if self.ctx is not None else "plait"
        message = one_line(self.format_message()).rstrip(".")
        click.echo(f"plait: error: {message}; see '{command} --help'", err=True)


@contextlib.contextmanager
def _one_line_usage() -> Iterator[None]:
    try:
        yield
    except click.UsageError as exc:
        if isinstance(exc, _OneLineUsage | click.exceptions.NoArgsIsHelpError):
            raise  # `plait` alone shows the help, as it should
        raise _OneLineUsage(exc.format_message(), exc.ctx) from None


class _Plait(click.Group):
    """The ``plait`` group: click's usage errors (an unknown option or command, a bad
    option value) are one line too, and so is a Ctrl-C while a command loads its module or
    its program (exit 130, as for a Ctrl-C later; click would say "Aborted!" and exit 1).

    A command's module is imported when that command is asked for: its name on the command
    line, or ``plait --help``, which lists each command's first docstring line and so
    loads all eight (their modules load none of the commands' work, so that stays cheap,
    and a second copy of the short help here could only drift from the docstrings)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None  # click's "No such command", told on one line
        module, attribute = _COMMANDS[cmd_name].split(":")
        # __import__, not importlib.import_module: the import statement's own path, which
        # `python -X importtime` times (import_module's is not shown there)
        command: click.Command = getattr(__import__(module, fromlist=[attribute]), attribute)
        return command

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _one_line_usage():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with _one_line_usage():
                return super().invoke(ctx)
        except KeyboardInterrupt:  # Ctrl-C before the command's own handling (loading it)
            click.echo("plait: stopped by Ctrl-C", err=True)
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=_Plait, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="plait")
def cli() -> None:
    """Build, run and train programs made of LLM calls, over data files.

    PROGRAM is pkg.module:Name or path/to/file.py:Name — a Module class,
    instance, or a function returning one (a file may import the files beside
    it). Only the code you name runs.
    """
