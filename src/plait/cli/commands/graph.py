"""``plait graph``: a program's dataflow graph as Mermaid or DOT, traced without a call."""

from __future__ import annotations

from pathlib import Path

import click

from plait import _files
from plait.cli.checks import _check_writable
from plait.cli.datasets import read_rows
from plait.cli.exits import _fail, _usage_errors
from plait.cli.loading import _prepare
from plait.cli.programs import ProgramError, trace_program
from plait.errors import FileError

__all__ = ["graph_command"]


@click.command("graph")
@click.argument("program_spec", metavar="PROGRAM")
@click.option(
    "--format", "fmt", type=click.Choice(["mermaid", "dot"]), default="mermaid", show_default=True
)
@click.option(
    "-i",
    "--input",
    "input_path",
    type=click.Path(path_type=Path),
    help="Trace with the first row of this file (default: placeholder text).",
)
@click.option("--column", "columns", multiple=True, metavar="ARG=COLUMN")
@click.option(
    "-o",
    "--output",
    "output_path",
    type=click.Path(path_type=Path),
    help="Write here instead of stdout.",
)
def graph_command(program_spec: str, fmt: str, input_path: Path | None,
                  columns: tuple[str, ...], output_path: Path | None) -> None:  # fmt: skip
    """Print PROGRAM's dataflow graph as Mermaid or Graphviz DOT (nothing is called)."""
    with _usage_errors():
        _check_writable(output_path, "--output")
        program, mapper = _prepare(program_spec, None, columns)
        if input_path is not None:
            first = next(read_rows(input_path), None)
            if first is None:
                raise ProgramError(f"{input_path} has no rows to trace with; give it one")
            row = first[1]
            mapper.item(first[0], row, str(input_path))  # names a missing column
        else:
            row = {mapper.column(name): f"<{name}>" for name in mapper.names}
        arguments = {n: row[mapper.column(n)] for n in mapper.names if mapper.column(n) in row}
        graph = trace_program(program, kwargs=arguments)
    text = graph.to_mermaid() if fmt == "mermaid" else graph.to_dot()
    if output_path is None:
        click.echo(text)
        return

    try:
        _files.write_atomically(output_path, text + "\n")
    except FileError as exc:
        _fail(str(exc))
