"""``plait report``: a run report (*.run.json) drawn as one HTML page (`plait.report`)."""

from __future__ import annotations

from pathlib import Path

import click

from plait.cli.checks import _check_writable
from plait.cli.exits import _fail
from plait.errors import FileError

__all__ = ["report_command"]


@click.command("report")
@click.argument("run_json", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option(
    "-o",
    "--output",
    "output_path",
    type=click.Path(path_type=Path),
    required=True,
    help="The HTML page to write (one self-contained file).",
)
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(path_type=Path),
    help="Also write the run's Perfetto / Chrome trace here.",
)
def report_command(run_json: Path, output_path: Path, trace_path: Path | None) -> None:  # fmt: skip
    """Draw a run report (*.run.json) as one HTML page of plots (needs plait[report])."""
    # import time: `plait --help` loads no report
    from plait.report import RunReport, RunReportError, write_html

    _check_writable(output_path, "--output")
    _check_writable(trace_path, "--trace")
    try:
        report = RunReport.load(run_json)
    except RunReportError as exc:
        _fail(str(exc))
    try:
        write_html(report, str(output_path))
        if trace_path is not None:
            report.save_trace(trace_path)
    except ModuleNotFoundError as exc:
        _fail(f"the report needs {exc.name}: pip install 'plait[report]'")
    except FileError as exc:
        _fail(str(exc))
    click.echo(f"wrote {output_path}", err=True)
