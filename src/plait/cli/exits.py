"""How a command stops on a mistake or a signal: one line on stderr and an exit code.

`_fail` says ``plait: error: <what>; <what to do>`` and exits (2 unless told);
`_usage_errors` does so for a mistake found before the run; `_handled` runs a command's
work and turns plait's errors and Ctrl-C / SIGTERM into their lines and the exit codes
`plait.cli` lists. The names are the ``plait.cli`` package's own, for its commands.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import click

from plait.cli import EXIT_ABORTED, EXIT_USAGE
from plait.cli.datasets import DatasetError
from plait.cli.programs import ProgramError, one_line
from plait.errors import ConfigError, PlaitError, described


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    click.echo(f"plait: error: {one_line(message)}", err=True)
    sys.exit(code)


@contextlib.contextmanager
def _usage_errors() -> Iterator[None]:
    """Turns a mistake found before the run (program, columns, resources, files) into its
    one-line message and exit 2."""
    try:
        yield
    except (ProgramError, DatasetError, ConfigError) as exc:
        _fail(str(exc))


def _handled(work: Any, on_stop: str | Callable[[], str]) -> Any:
    """Runs a coroutine, turning plait's errors and stopping signals into messages and exit codes.

    ``on_stop`` tells the user what was kept and how to resume after Ctrl-C or SIGTERM (a
    function: asked once the work has stopped).
    """
    # import time: `plait --help` loads none of this, the command does
    from plait.cli.stopping import Stopped, run_stoppable
    from plait.execution.checkpoint_codec import CheckpointError

    try:
        return run_stoppable(work)
    except Stopped as stop:
        told = on_stop() if callable(on_stop) else on_stop
        click.echo(f"plait: stopped by {stop.name}; {told}", err=True)
        sys.exit(stop.exit_code)
    except (ProgramError, DatasetError, ConfigError) as exc:
        _fail(str(exc))
    except (CheckpointError, PlaitError, OSError) as exc:
        _fail(described(exc), EXIT_ABORTED)


async def _awaited(function: Any, *args: Any, **kwargs: Any) -> Any:
    """Calls ``function`` on the command's loop and awaits what it returns (a public
    entry point returns an awaitable only when called inside a running loop)."""
    return await function(*args, **kwargs)
