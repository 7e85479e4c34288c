"""``plait run``: a program over every row of a data file, one output row per input row."""

from __future__ import annotations

import sys
from typing import Any

import click

from plait.cli import EXIT_OK, EXIT_ROWS_FAILED
from plait.cli.exits import _handled, _usage_errors
from plait.cli.file_run import _file_run, _profiled_run, _resume_hint
from plait.cli.options import _RESOURCES_HELP, _with, common_run_options

__all__ = ["run_command"]


@click.command("run", epilog=_RESOURCES_HELP)
@click.argument("program_spec", metavar="PROGRAM")
@_with(common_run_options)
def run_command(program_spec: str, **kwargs: Any) -> None:
    """Run PROGRAM on every row of --input; write one output row per input row.

    Columns fill the program's inputs by name: forward's arguments, or the
    input fields of a Predict's signature. Outputs stream to --output in input
    order (a Prediction, mapping, pydantic model or dataclass becomes one column
    per field, anything else the column `output`); a failed row has its reason
    in the `error` column.
    """
    with _usage_errors():
        run = _file_run(program_spec, kwargs)
    outcome = _handled(_profiled_run(run, program_spec, "run", kwargs), _resume_hint(kwargs))
    sys.exit(EXIT_ROWS_FAILED if outcome.failed else EXIT_OK)
