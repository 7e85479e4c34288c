"""Runs a program over the rows of a file, chunk by chunk, streaming outputs to a file.

Rows are read a chunk at a time (``chunk_size``, 2,000 by default); each chunk
is one streaming batch (one shared resource manager, every item concurrent up
to ``max_concurrent``), and its results are written in input order as they
finish. Memory is bounded by the chunk, not the file. With a checkpoint
directory, each chunk checkpoints into ``chunk-NNNNNN/`` there, so a rerun
replays what finished from disk (no model calls) and runs only the rest; the
output file is rewritten whole on each run, so it is never half of two runs.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from plait import _files
from plait._jsondata import as_json_data
from plait.cli.datasets import count_rows, open_writer, read_rows
from plait.cli.programs import ProgramError, RowMapper
from plait.errors import described
from plait.execution.checkpoint_codec import CheckpointError
from plait.execution.graph_cache import RunGraphs
from plait.execution.run import execute_bound
from plait.module import Module

if TYPE_CHECKING:
    from plait.execution.batch import BatchStream

__all__ = ["FileRun", "RunOutcome", "default_report_path", "output_columns", "run_file"]

_STATE = "cli.json"


@dataclass
class FileRun:
    """What ``plait run`` / ``plait eval`` was asked to do."""

    program: Module
    mapper: RowMapper
    input: Path
    output: Path
    resources: Any
    input_format: str | None = None
    output_format: str | None = None
    checkpoint_dir: Path | None = None
    max_concurrent: int | None = None
    chunk_size: int = 2000
    progress: bool | None = None
    keep_inputs: bool = True
    target_column: str | None = None
    """For ``eval``: the column each output is scored against."""
    metric: Callable[[Any, Any], Any] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """More execution options (``timeout``, ``deadline``, ``cache``)."""
    budget: Any = None
    """A `plait.resources.usage.Budget` every call of the file run is held to (``eval
    --max-calls`` …): a row whose call it refuses is left undone, and the run goes on
    through the rest (refused at once, nothing sent) so every row is written."""
    graphs: Any = field(default=None, init=False)
    """The `RunGraphs` of the whole file run: the first row's check before any call and
    every chunk look each input shape up once, so a program is traced once per shape."""

    def __post_init__(self) -> None:
        self.graphs = RunGraphs(self.mapper.module)

    @property
    def own_columns(self) -> tuple[str, ...]:
        """The columns plait writes itself: the row number, the error, and for ``eval`` the
        score."""
        return ("row", "score", "error") if self.metric is not None else ("row", "error")


@dataclass
class RunOutcome:
    scored: bool = False
    """Whether rows were scored (``eval``); a run without a metric has no score."""
    rows: int = 0
    failed: int = 0
    undone: int = 0
    """Rows among ``failed`` that a budget left undone (it refused their calls)."""
    score_total: float = 0.0
    first_failures: list[str] = field(default_factory=list)
    graphs: Any = None
    """The file run's `RunGraphs` (`FileRun.graphs`)."""

    @property
    def graph(self) -> Any:
        """The graph of the first row run, which the run report draws (None before one ran)."""
        return self.graphs.first if self.graphs is not None else None

    @property
    def score(self) -> float | None:
        """The mean score of the rows; None when there was no metric or no row."""
        return self.score_total / self.rows if self.scored and self.rows else None


def output_columns(output: Any) -> dict[str, Any]:
    """Returns an output as columns: a mapping (a `Prediction` too), pydantic model or
    dataclass by field, anything else as ``output``."""
    if type(output) is str:  # the usual reply, already JSON data: no serializer per row
        return {"output": output}
    data = as_json_data(output, fallback=_jsonable)
    if isinstance(data, dict) and data and all(isinstance(key, str) for key in data):
        return data
    return {"output": data}


def _jsonable(value: Any) -> Any:
    """What pydantic cannot write as JSON: a mapping that is not a dict (a `Prediction`)
    as a dict, so its fields stay fields; anything else as its text."""
    return dict(value) if isinstance(value, Mapping) else str(value)


def _chunks(rows: Iterator[tuple[int, dict]], size: int) -> Iterator[list[tuple[int, dict]]]:
    while True:
        chunk = list(itertools.islice(rows, size))
        if not chunk:
            return
        yield chunk


def _check_state(directory: Path, run: FileRun) -> None:
    """Keeps a checkpoint directory to one chunking, so chunks line up on resume.

    Raises:
        ProgramError: the directory was written with another chunk size.
        CheckpointError: ``cli.json`` there is a link, not a regular file, or not plait's.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / _STATE
    remedy = "delete it, or use another --checkpoint-dir"
    found = _files.read_json(path, error=CheckpointError, remedy=remedy)
    if isinstance(found, dict) and found.get("chunk_size") != run.chunk_size:
        raise ProgramError(
            f"{directory} was written with --chunk-size {found.get('chunk_size')}; resume "
            "with the same chunk size, or use another --checkpoint-dir"
        )
    state = {"chunk_size": run.chunk_size}
    _files.write_atomically(path, json.dumps(state) + "\n", error=CheckpointError)


async def run_file(run: FileRun) -> RunOutcome:
    """Runs the program over every row of ``run.input``; writes ``run.output``.

    Raises:
        ProgramError: the first row lacks a column the program needs.
        DatasetError: a file cannot be read or written (names file and row).
        CheckpointError: the checkpoint belongs to another program or input.
    """
    # import time: `plait --help` loads none of this (nor rich, for the progress bar)
    from plait.execution.progress import BatchProgress
    from plait.resources.usage import budgeted

    source = str(run.input)
    total = count_rows(run.input, run.input_format)
    outcome = RunOutcome(scored=run.metric is not None, graphs=run.graphs)
    if run.checkpoint_dir is not None:
        _check_state(run.checkpoint_dir, run)
    writer = open_writer(run.output, run.output_format)
    try:
        with BatchProgress(total, run.progress) as progress, budgeted(run.budget):
            rows = read_rows(run.input, run.input_format)
            for number, chunk in enumerate(_chunks(rows, run.chunk_size)):
                await _run_chunk(run, number, chunk, source, writer, progress, outcome)
    finally:
        writer.close()
    return outcome


async def _run_chunk(
    run: FileRun,
    number: int,
    chunk: list[tuple[int, dict]],
    source: str,
    writer: Any,
    progress: Any,
    outcome: RunOutcome,
) -> None:
    items: list[Any] = []
    positions: list[int] = []  # chunk position of each item
    mapping_errors: dict[int, str] = {}
    for position, (row_number, row) in enumerate(chunk):
        try:
            items.append(run.mapper.item(row_number, row, source))
        except ProgramError as exc:
            if row_number == 0:
                raise  # the very first row: the columns are wrong, not one row
            mapping_errors[position] = str(exc)
            continue
        positions.append(position)
    options = {
        **run.options,
        "resources": run.resources,
        "streaming": True,
        "preserve_order": True,
        "progress": False,
        "max_concurrent": run.max_concurrent,
    }
    if run.checkpoint_dir is not None:
        options["checkpoint_dir"] = str(run.checkpoint_dir / f"chunk-{number:06d}")
    results: dict[int, Any] = {}
    next_position = 0

    def flush() -> None:
        nonlocal next_position
        while next_position < len(chunk):
            if next_position in mapping_errors:
                _write(run, chunk[next_position], None, mapping_errors[next_position], writer,
                       progress, outcome)  # fmt: skip
            elif next_position in results:
                result = results.pop(next_position)
                error, undone = (None, False) if result.ok else _error_text(result.error)
                _write(run, chunk[next_position], result.output, error, writer, progress, outcome,
                       undone)  # fmt: skip
            else:
                return
            next_position += 1

    if items:
        # A batch run with streaming=True is a BatchStream, never a coroutine.
        stream = cast(
            "BatchStream", execute_bound(run.mapper.module, (items,), options, run.graphs)
        )
        async for result in stream:
            results[positions[result.index]] = result
            flush()
    flush()


def _error_text(error: BaseException) -> tuple[str, bool]:
    """Returns what a failed row's ``error`` column says, and whether a budget left the row
    undone (it refused a call: the row is said to be left undone, not to have failed)."""
    # import time: `plait --help` loads none of this, the command does
    from plait.report.profiling import budget_refusal

    refusal = budget_refusal(error)
    if refusal is None:
        return described(error, index=False), False
    return f"left undone by the budget: {refusal}", True


def _write(
    run: FileRun,
    entry: tuple[int, dict],
    output: Any,
    error: str | None,
    writer: Any,
    progress: Any,
    outcome: RunOutcome,
    undone: bool = False,
) -> None:
    row_number, row = entry
    record = _record(run, row_number, row, output_columns(output) if error is None else {})
    if run.metric is not None:
        score, error = _score(run, output, row, error)
        record["score"] = score
        outcome.score_total += score
    record["error"] = error
    writer.write(record)
    outcome.rows += 1
    if error is not None:
        outcome.failed += 1
        outcome.undone += undone
        if not undone and len(outcome.first_failures) < 5:
            outcome.first_failures.append(f"row {row_number}: {error}")
    progress.advance(error is None)


def _record(run: FileRun, row_number: int, row: dict, outputs: dict[str, Any]) -> dict[str, Any]:
    """Returns the written row before its score and error: the row number, the inputs
    (unless ``--no-inputs``), then the outputs.

    No value hides another: an input column named like one of ``run.own_columns``
    is written as ``input.<name>``, and an output key named like one of them or like
    an input column as ``output.<name>``.
    """
    taken = run.own_columns
    record: dict[str, Any] = {"row": row_number}
    if run.keep_inputs:
        for key, value in row.items():
            record[_free_name(key, "input.", record, taken)] = value
    for key, value in outputs.items():
        record[_free_name(key, "output.", record, taken)] = value
    return record


def _free_name(key: str, prefix: str, record: dict[str, Any], taken: tuple[str, ...]) -> str:
    """Returns ``key``, behind ``prefix`` as often as it takes to name no column taken."""
    name = key
    while name in record or name in taken:
        name = prefix + name
    return name


def _score(run: FileRun, output: Any, row: dict, error: str | None) -> tuple[float, str | None]:
    """Returns a row's score and error: a failed row, or a metric that fails or returns no
    finite number, scores 0."""
    # import time: `plait --help` loads none of this, the command does
    from plait.optimization.evaluation import score_of

    if error is not None:
        return 0.0, error
    try:
        metric = cast(Callable[[Any, Any], Any], run.metric)  # rows are scored only with one
        score = score_of(metric, output, row.get(run.target_column))
    except Exception as exc:  # a metric that fails on one row fails that row
        return 0.0, f"metric failed: {type(exc).__name__}: {exc}"
    if not math.isfinite(score):
        return 0.0, f"metric returned {score}; a score is a finite number"
    return score, None


def default_report_path(output: Path) -> Path:
    """Returns where the run report of ``output`` goes: ``out.jsonl`` → ``out.run.json``."""
    return output.with_name(output.name.split(".")[0] + ".run.json")
