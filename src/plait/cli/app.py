"""The ``plait`` commands, built with click (imported only by `plait.cli.main`)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from plait.cli import (
    EXIT_ABORTED,
    EXIT_BELOW_THRESHOLD,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_ROWS_FAILED,
    EXIT_USAGE,
)
from plait.cli.datasets import FORMATS, DatasetError, read_rows
from plait.cli.programs import ProgramError, RowMapper, load_metric, load_program
from plait.errors import ConfigError, PlaitError

__all__ = ["cli"]

_REPORT_SAMPLE = 20_000
"""Node and request spans a CLI run keeps for its trace (counters stay exact)."""


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    click.echo(f"plait: error: {message}", err=True)
    sys.exit(code)


def _resources(path: Path | None, program: Any) -> Any:
    from plait.resources import ResourceConfig

    if path is not None:
        return ResourceConfig.from_file(path)
    if program._bound_resources is not None:
        return program._bound_resources
    _fail(
        f"{type(program).__name__} has no resources: pass --resources res.toml (a file of "
        "alias -> endpoint settings), or bind them where the program is built"
    )


def _renames(pairs: tuple[str, ...]) -> dict[str, str]:
    renames = {}
    for pair in pairs:
        argument, sep, column = pair.partition("=")
        if not sep or not argument or not column:
            _fail(f"--column {pair!r} must look like ARGUMENT=COLUMN")
        renames[argument] = column
    return renames


def _prepare(spec: str, load: Path | None, columns: tuple[str, ...]) -> tuple[Any, RowMapper]:
    program = load_program(spec)
    if load is not None:
        program.load(load)
    program.eval()
    return program, RowMapper(program, _renames(columns))


def _handled(work: Any) -> Any:
    """Runs a coroutine, turning plait's errors into messages and exit codes."""
    from plait.execution.checkpoint_codec import CheckpointError

    try:
        return asyncio.run(work)
    except KeyboardInterrupt:
        click.echo(
            "plait: interrupted; rows already written are in the checkpoint: rerun with the "
            "same --checkpoint-dir to resume",
            err=True,
        )
        sys.exit(EXIT_INTERRUPTED)
    except (ProgramError, DatasetError, ConfigError) as exc:
        _fail(str(exc))
    except (CheckpointError, PlaitError, OSError) as exc:
        _fail(f"{type(exc).__name__}: {exc}", EXIT_ABORTED)


common_run_options = [
    click.option("-i", "--input", "input_path", type=click.Path(path_type=Path), required=True,
                 help="Rows to run: .jsonl, .csv or .parquet."),
    click.option("-o", "--output", "output_path", type=click.Path(path_type=Path), required=True,
                 help="Where outputs go, one row per input row, in input order."),
    click.option("-r", "--resources", type=click.Path(path_type=Path),
                 help="Endpoints file (.toml, .yaml, .json): alias -> provider settings."),
    click.option("--checkpoint-dir", type=click.Path(path_type=Path),
                 help="Makes the run resumable: rerun with the same directory to continue."),
    click.option("--max-concurrent", type=click.IntRange(min=1),
                 help="Most LLM calls in flight at once (endpoint limits apply too)."),
    click.option("--chunk-size", type=click.IntRange(min=1), default=2000, show_default=True,
                 help="Rows read and run at a time; memory is bounded by it."),
    click.option("--column", "columns", multiple=True, metavar="ARG=COLUMN",
                 help="Fill the program's input ARG from COLUMN (default: the column named ARG)."),
    click.option("--input-format", type=click.Choice(FORMATS), help="Default: from the suffix."),
    click.option("--output-format", type=click.Choice(FORMATS), help="Default: from the suffix."),
    click.option("--load", type=click.Path(path_type=Path, exists=True, dir_okay=False),
                 help="Parameters saved by Module.save or `plait train --save`."),
    click.option("--report", "report_path", type=click.Path(path_type=Path),
                 help="Where the run report goes (default: beside the output, *.run.json)."),
    click.option("--trace", "trace_path", type=click.Path(path_type=Path),
                 help="Also write a Perfetto / Chrome trace of the run here."),
    click.option("--no-inputs", is_flag=True, help="Write only row number and outputs."),
    click.option("--timeout", type=click.FloatRange(min=0, min_open=True),
                 help="Seconds per LLM request attempt."),
    click.option("--progress/--no-progress", default=None,
                 help="Progress bar on stderr (default: when it is a terminal)."),
]  # fmt: skip


def _with(options: list[Any]) -> Any:
    def decorate(function: Any) -> Any:
        for option in reversed(options):
            function = option(function)
        return function

    return decorate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="plait")
def cli() -> None:
    """Build, run and train programs made of LLM calls, over data files.

    PROGRAM is pkg.module:Name or path/to/file.py:Name — a Module class,
    instance, or a function returning one (a file may import the files beside
    it). Only the code you name runs.
    """


def _file_run(program: Any, mapper: RowMapper, kwargs: dict[str, Any], **extra: Any) -> Any:
    from plait.cli.driver import FileRun

    options = {"timeout": kwargs["timeout"]} if kwargs["timeout"] else {}
    return FileRun(
        program=program,
        mapper=mapper,
        input=kwargs["input_path"],
        output=kwargs["output_path"],
        resources=_resources(kwargs["resources"], program),
        input_format=kwargs["input_format"],
        output_format=kwargs["output_format"],
        checkpoint_dir=kwargs["checkpoint_dir"],
        max_concurrent=kwargs["max_concurrent"],
        chunk_size=kwargs["chunk_size"],
        progress=kwargs["progress"],
        keep_inputs=not kwargs["no_inputs"],
        options=options,
        **extra,
    )


async def _profiled_run(run: Any, spec: str, kind: str, kwargs: dict[str, Any]) -> Any:
    from plait.cli.driver import default_report_path, run_file
    from plait.profiling import Profiler

    with Profiler(max_records=_REPORT_SAMPLE) as profiler:
        outcome = await run_file(run)
    metrics: dict[str, Any] = {"input": str(run.input), "output": str(run.output)}
    if outcome.score is not None:
        metrics["score"] = round(outcome.score, 6)
    report = profiler.report(program=spec, kind=kind, graph=outcome.graph, metrics=metrics)
    report_path = kwargs["report_path"] or default_report_path(run.output)
    report.save(report_path)
    if kwargs["trace_path"]:
        report.save_trace(kwargs["trace_path"])
    click.echo(report.summary(), err=True)
    for line in outcome.first_failures:
        click.echo(f"  {line}", err=True)
    if outcome.failed > len(outcome.first_failures):
        click.echo(f"  … {outcome.failed - len(outcome.first_failures)} more failed rows", err=True)
    click.echo(f"outputs: {run.output}; report: {report_path}", err=True)
    return outcome


@cli.command("run")
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
    try:
        program, mapper = _prepare(program_spec, kwargs["load"], kwargs["columns"])
    except (ProgramError, ConfigError, KeyError, TypeError, ValueError) as exc:
        _fail(str(exc))
    run = _file_run(program, mapper, kwargs)
    outcome = _handled(_profiled_run(run, program_spec, "run", kwargs))
    sys.exit(EXIT_ROWS_FAILED if outcome.failed else EXIT_OK)


@cli.command("eval")
@click.argument("program_spec", metavar="PROGRAM")
@_with(common_run_options)
@click.option(
    "--metric",
    default="exact_match",
    show_default=True,
    help="exact_match, contains, or pkg.module:function(output, target).",
)
@click.option(
    "--target",
    "target_column",
    default="target",
    show_default=True,
    help="The column outputs are scored against.",
)
@click.option("--fail-under", type=float, help="Exit 4 when the mean score is below this.")
def eval_command(program_spec: str, metric: str, target_column: str,
                 fail_under: float | None, **kwargs: Any) -> None:  # fmt: skip
    """Run PROGRAM on every row of --input and score each output against --target.

    Writes outputs with a `score` column; a failed row scores 0. Prints the
    mean score.
    """
    try:
        program, mapper = _prepare(program_spec, kwargs["load"], kwargs["columns"])
        scorer = load_metric(metric)
    except (ProgramError, ConfigError, KeyError, TypeError, ValueError) as exc:
        _fail(str(exc))
    _require_column(kwargs["input_path"], kwargs["input_format"], target_column, "--target")
    run = _file_run(program, mapper, kwargs, target_column=target_column, metric=scorer)
    outcome = _handled(_profiled_run(run, program_spec, "eval", kwargs))
    score = outcome.score or 0.0
    click.echo(f"score: {score:.4f} ({metric} over {outcome.rows} rows)")
    if fail_under is not None and score < fail_under:
        sys.exit(EXIT_BELOW_THRESHOLD)
    sys.exit(EXIT_ROWS_FAILED if outcome.failed else EXIT_OK)


def _require_column(path: Path, fmt: str | None, column: str, option: str) -> None:
    try:
        first = next(read_rows(path, fmt), None)
    except DatasetError as exc:
        _fail(str(exc))
    if first is not None and column not in first[1]:
        _fail(
            f"{path}: row 0 has no column {column!r} to score against; its columns: "
            f"{', '.join(first[1])}. Name the right one with {option} COLUMN"
        )


def _pairs(path: Path, fmt: str | None, mapper: RowMapper, target: str) -> list[tuple[Any, Any]]:
    pairs = []
    for number, row in read_rows(path, fmt):
        if target not in row:
            raise ProgramError(f"{path}: row {number} has no target column {target!r}")
        pairs.append((mapper.item(number, row, str(path)), row[target]))
    if not pairs:
        raise ProgramError(f"{path} has no rows")
    return pairs


@cli.command("train")
@click.argument("program_spec", metavar="PROGRAM")
@click.option(
    "--train",
    "train_path",
    type=click.Path(path_type=Path),
    required=True,
    help="Training rows (.jsonl, .csv, .parquet) with a target column.",
)
@click.option(
    "--val",
    "val_path",
    type=click.Path(path_type=Path),
    required=True,
    help="Validation rows, scored after every epoch.",
)
@click.option("-r", "--resources", type=click.Path(path_type=Path))
@click.option("--target", "target_column", default="target", show_default=True)
@click.option("--metric", default="exact_match", show_default=True)
@click.option("--optimizer-alias", help="Alias of the optimizer's LLM (default: the program's).")
@click.option("--epochs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--save",
    "save_path",
    type=click.Path(path_type=Path),
    required=True,
    help="Where the trained parameters go (JSON; `plait run --load` reads it).",
)
@click.option("--checkpoint-dir", type=click.Path(path_type=Path))
@click.option("--max-concurrent", type=click.IntRange(min=1))
@click.option("--column", "columns", multiple=True, metavar="ARG=COLUMN")
@click.option("--load", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option(
    "--report",
    "report_path",
    type=click.Path(path_type=Path),
    help="Default: beside --save, *.run.json.",
)
@click.option("--progress/--no-progress", default=None)
def train_command(program_spec: str, **kwargs: Any) -> None:  # fmt: skip
    """Train PROGRAM's parameters on --train, keeping the best on --val.

    Each row's target column is checked with --metric (a VerifierLoss); the
    optimizer (SFA) rewrites the prompts; the best parameters are saved.
    """
    try:
        program, mapper = _prepare(program_spec, kwargs["load"], kwargs["columns"])
        metric = load_metric(kwargs["metric"])
        train = _pairs(kwargs["train_path"], None, mapper, kwargs["target_column"])
        val = _pairs(kwargs["val_path"], None, mapper, kwargs["target_column"])
    except (ProgramError, DatasetError, ConfigError, KeyError, TypeError, ValueError) as exc:
        _fail(str(exc))
    resources = _resources(kwargs["resources"], program)
    alias = kwargs["optimizer_alias"] or _first_alias(program)
    report = _handled(_train(program, mapper, train, val, metric, resources, alias, kwargs))
    program.save(kwargs["save_path"])
    path = kwargs["report_path"] or kwargs["save_path"].with_name(
        kwargs["save_path"].name.split(".")[0] + ".run.json"
    )
    report.save(path)
    training = report.training or {}
    click.echo(report.summary(), err=True)
    click.echo(
        f"validation: {training.get('initial_score', 0):.4f} -> {training.get('best_score', 0):.4f}"
        f" (best epoch {training.get('best_epoch')}); saved {kwargs['save_path']}; report {path}"
    )
    sys.exit(EXIT_OK)


def _first_alias(program: Any) -> str:
    for module in program.modules():
        alias = getattr(module, "alias", None)
        if isinstance(alias, str):
            return alias
    return "optimizer"


async def _train(program, mapper, train, val, metric, resources, alias, kwargs) -> Any:
    from dataclasses import asdict

    from plait.optimization import SFAOptimizer, Trainer, VerifierLoss
    from plait.profiling import Profiler

    trainer = Trainer(
        mapper.module,
        VerifierLoss(metric),
        SFAOptimizer(mapper.module.named_parameters(), alias=alias),
        resources=resources,
        train_set=train,
        val_set=val,
        metric=metric,
        epochs=kwargs["epochs"],
        batch_size=kwargs["batch_size"],
        checkpoint_dir=kwargs["checkpoint_dir"],
        progress=kwargs["progress"],
        max_concurrent=kwargs["max_concurrent"],
    )
    with Profiler(max_records=_REPORT_SAMPLE) as profiler:
        result = await trainer.fit()
    training = asdict(result)
    graph = None
    from plait.execution.runner import trace_cached

    graph = trace_cached(mapper.module, (train[0][0],), {})
    return profiler.report(
        program=f"{type(program).__module__}:{type(program).__qualname__}",
        kind="train",
        graph=graph,
        training=training,
        metrics={"train": str(kwargs["train_path"]), "val": str(kwargs["val_path"])},
    )


@cli.command("graph")
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
    from plait.tracing import Tracer

    try:
        program, mapper = _prepare(program_spec, None, columns)
        if input_path is not None:
            first = next(read_rows(input_path), None)
            if first is None:
                raise ProgramError(f"{input_path} has no rows to trace with")
            row = first[1]
            mapper.item(first[0], row, str(input_path))  # names a missing column
        else:
            row = {mapper.column(name): f"<{name}>" for name in mapper.names}
        arguments = {n: row[mapper.column(n)] for n in mapper.names if mapper.column(n) in row}
        graph = Tracer().trace(program, **arguments)
    except (ProgramError, DatasetError, PlaitError, KeyError, TypeError, ValueError) as exc:
        _fail(str(exc))
    text = graph.to_mermaid() if fmt == "mermaid" else graph.to_dot()
    if output_path is None:
        click.echo(text)
    else:
        output_path.write_text(text + "\n", encoding="utf-8")


@cli.command("report")
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
    from plait.report import RunReport, RunReportError, write_html

    try:
        report = RunReport.load(run_json)
    except RunReportError as exc:
        _fail(str(exc))
    try:
        write_html(report, str(output_path))
    except ModuleNotFoundError as exc:
        _fail(f"the report needs {exc.name}: pip install 'plait[report]'")
    if trace_path is not None:
        report.save_trace(trace_path)
    click.echo(f"wrote {output_path}", err=True)
