"""What ``plait run`` and ``plait eval`` share: their `FileRun` (`plait.cli.driver`),
every part of it checked before the first call, run under a `Profiler` whose report is
written, and what a stopped run tells about resuming.

The names are the ``plait.cli`` package's own, for its commands.
"""

from __future__ import annotations

from typing import Any

import click

from plait.cli.checks import (
    _aliases,
    _check_aliases,
    _check_checkpoint_dir,
    _check_credentials,
    _check_priced,
    _check_writable,
    _resources,
    _with_state,
)
from plait.cli.datasets import read_rows
from plait.cli.loading import _prepare
from plait.cli.options import _REPORT_SAMPLE, _budget
from plait.cli.programs import ProgramError, trace_program


def _check_first_row(run: Any) -> None:
    """Stops before anything is written when the first row cannot fill the program's
    inputs or has no target to score against, or the program cannot be traced with it.

    Raises:
        ProgramError, DatasetError: what is wrong, naming the file and row.
    """
    first = next(read_rows(run.input, run.input_format), None)
    if first is None:
        return
    number, row = first
    target = run.target_column
    if target is not None and target not in row:
        raise ProgramError(
            f"{run.input}: row {number} has no column {target!r} to score against; its "
            f"columns: {', '.join(row)}. Name the right one with --target COLUMN"
        )
    item = run.mapper.item(number, row, str(run.input))
    trace_program(run.mapper.module, (item,), graphs=run.graphs)


def _resume_hint(kwargs: dict[str, Any]) -> str:
    """What a stopped ``run``/``eval`` kept, and how to go on from there."""
    if kwargs["checkpoint_dir"] is not None:
        return (
            f"finished rows are checkpointed in {kwargs['checkpoint_dir']}: rerun the same "
            "command to resume"
        )
    if kwargs.get("state"):
        return (
            "finished rows are checkpointed in the state store (--state): rerun the same "
            "command, on this machine or another, to resume"
        )
    return (
        f"rows finished in order so far are in {kwargs['output_path']}; without "
        "--checkpoint-dir nothing was checkpointed, so a rerun starts over (add "
        "--checkpoint-dir DIR to make a run resumable)"
    )


def _file_run(program_spec: str, kwargs: dict[str, Any], **extra: Any) -> Any:
    """Returns the `FileRun` of ``plait run`` / ``plait eval``, every part of it checked:
    files to write, program, parameters, columns, resources and aliases, the first row.

    Raises:
        ProgramError, DatasetError, ConfigError: what is wrong (see `_usage_errors`).
    """
    # import time: `plait --help` loads none of this, the command does
    from plait.cli.driver import FileRun

    _check_writable(kwargs["output_path"], "--output")
    _check_writable(kwargs["report_path"], "--report")
    _check_writable(kwargs["trace_path"], "--trace")
    _check_checkpoint_dir(kwargs["checkpoint_dir"])
    program, mapper = _prepare(program_spec, kwargs["load"], kwargs["columns"])
    resources = _resources(kwargs["resources"], program)
    resources = _with_state(resources, kwargs.get("state"))
    calls = [("the program", alias) for alias in _aliases(program)]
    _check_aliases(kwargs["resources"], resources, calls)
    _check_credentials(kwargs["resources"], resources, calls)
    if kwargs.get("max_cost") is not None:
        _check_priced(kwargs["resources"], resources, calls)
    options = {"timeout": kwargs["timeout"]} if kwargs["timeout"] else {}
    run = FileRun(
        program=program,
        mapper=mapper,
        input=kwargs["input_path"],
        output=kwargs["output_path"],
        resources=resources,
        input_format=kwargs["input_format"],
        output_format=kwargs["output_format"],
        checkpoint_dir=kwargs["checkpoint_dir"],
        max_concurrent=kwargs["max_concurrent"],
        chunk_size=kwargs["chunk_size"],
        progress=kwargs["progress"],
        keep_inputs=not kwargs["no_inputs"],
        options=options,
        budget=_budget(kwargs),
        **extra,
    )
    _check_first_row(run)
    return run


async def _profiled_run(run: Any, spec: str, kind: str, kwargs: dict[str, Any]) -> Any:
    # import time: `plait --help` loads none of this, the command does
    from plait.cli.driver import default_report_path, run_file
    from plait.report.profiling import Profiler
    from plait.resources.books import books_of
    from plait.resources.manager import ResourceManager

    with Profiler(max_records=_REPORT_SAMPLE) as profiler:
        outcome = await run_file(run)
    metrics: dict[str, Any] = {"input": str(run.input), "output": str(run.output)}
    if outcome.score is not None:
        metrics["score"] = round(outcome.score, 6)
    books = books_of(run.budget, ResourceManager.shared(run.resources))
    report = profiler.report(
        program=spec, kind=kind, graph=outcome.graph, metrics=metrics, budgets=books
    )
    report_path = kwargs["report_path"] or default_report_path(run.output)
    report.save(report_path)
    if kwargs["trace_path"]:
        report.save_trace(kwargs["trace_path"])
    click.echo(report.summary(), err=True)
    for line in outcome.first_failures:
        click.echo(f"  {line}", err=True)
    unlisted = outcome.failed - outcome.undone - len(outcome.first_failures)
    if unlisted > 0:
        click.echo(f"  … {unlisted} more failed rows", err=True)
    click.echo(f"outputs: {run.output}; report: {report_path}", err=True)
    return outcome
