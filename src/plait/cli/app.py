"""The ``plait`` click group (imported only by `plait.cli.main`): click's usage errors told
on one line, and the seven commands, one module each in `plait.cli.commands`, added to it."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import click

from plait.cli import EXIT_INTERRUPTED
from plait.cli.commands.eval import eval_command
from plait.cli.commands.graph import graph_command
from plait.cli.commands.mcp import mcp_command
from plait.cli.commands.report import report_command
from plait.cli.commands.run import run_command
from plait.cli.commands.serve import serve_command
from plait.cli.commands.state import state_command
from plait.cli.commands.train import train_command
from plait.cli.programs import one_line

__all__ = ["cli"]


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
    option value) are one line too, and so is a Ctrl-C while a command loads its program
    (exit 130, as for a Ctrl-C later; click would say "Aborted!" and exit 1)."""

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


cli.add_command(run_command)
cli.add_command(eval_command)
cli.add_command(mcp_command)
cli.add_command(train_command)
cli.add_command(graph_command)
cli.add_command(report_command)
cli.add_command(serve_command)
cli.add_command(state_command)
