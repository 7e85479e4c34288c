# size: all seven commands in one click group; issue 35 moves each command to a module of its own.
"""The ``plait`` commands, built with click (imported only by `plait.cli.main`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
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
from plait.cli.programs import (
    ProgramError,
    RowMapper,
    load_metric,
    load_program,
    one_line,
    trace_program,
)
from plait.errors import ConfigError, FileError, PlaitError

__all__ = ["cli"]

_REPORT_SAMPLE = 20_000
"""Node and request spans a CLI run keeps for its trace (counters stay exact)."""

_RESOURCES_EXAMPLE = """\
# res.toml: a table per alias the program calls; ["*"] serves all the others
[llm]
provider = "openai"             # openai, anthropic or local
model = "gpt-4o-mini"
api_key_env = "OPENAI_API_KEY"  # or base_url = "http://localhost:8000/v1"
max_concurrent = 32             # also rpm, tpm, timeout, max_retries, cache
rpm = 500
["*"]
provider = "local"              # the embedded model: no key, no network
"""
"""What a ``--resources`` file looks like (the same example is in the README)."""

_RESOURCES_HELP = "\b\n--resources names a TOML, YAML or JSON file such as:\n\n\b\n" + "\n".join(
    f"  {line}" for line in _RESOURCES_EXAMPLE.splitlines()
)


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


def _check_writable(path: Path | None, option: str) -> None:
    """Stops before any work when a file to write is a folder or has no folder to go in."""
    if path is None:
        return
    if path.is_dir():
        _fail(f"{option} {path} is a folder; name a file")
    folder = path.parent
    if not folder.is_dir():
        problem = "is a file" if folder.exists() else "does not exist"
        _fail(
            f"{option} {path}: the folder {folder} {problem}; create it first, or write elsewhere"
        )


def _check_checkpoint_dir(path: Path | None) -> None:
    if path is not None and path.exists() and not path.is_dir():
        _fail(f"--checkpoint-dir {path} is a file; name a folder (it is made if missing)")


def _resources(path: Path | None, program: Any) -> Any:
    """Returns the resources of a run: read from ``--resources``, or bound to the program.

    Raises:
        ConfigError: the file is missing or invalid (names the file and alias).
    """
    from plait.resources import ResourceConfig

    if path is not None:
        if not path.exists():
            _fail(f"--resources {path}: no such file; check the path (read from {Path.cwd()})")
        return ResourceConfig.from_file(path)
    if program._bound_resources is not None:
        return program._bound_resources
    _fail(
        f"{type(program).__name__} has no resources: pass --resources res.toml (a file of "
        "alias -> endpoint settings), or bind them where the program is built"
    )


def _with_state(resources: Any, url: str) -> Any:
    """Returns the resources keeping their state in ``--state``, the store checked first.

    Raises:
        StateError: the store cannot be reached (host and port named, password
            masked) or is newer than this plait; a `ConfigError`, so one line and exit 2.
    """
    from plait.resources.config import resources_with_state
    from plait.resources.state import open_store, release_store

    try:
        resources = resources_with_state(resources, url)
    except TypeError as exc:
        _fail(f"--state: {exc}")
    release_store(open_store(resources.state))
    return resources


def _aliases(program: Any) -> list[str]:
    """Returns the aliases the program's modules call, in module order."""
    found = (getattr(module, "alias", None) for module in program.modules())
    return list(dict.fromkeys(alias for alias in found if isinstance(alias, str)))


def _check_aliases(path: Path | None, resources: Any, calls: list[tuple[str, str]]) -> None:
    """Stops before any call when ``--resources`` serves none of an alias that is called.

    Args:
        calls: ``(who, alias)`` for each alias called (the program's, the optimizer's).
    """
    if path is None:
        return  # resources bound in code are the program's own business
    for who, alias in calls:
        if alias not in resources:
            served = ", ".join(repr(name) for name in resources.aliases()) or "none"
            entry = f"a table [{alias}]" if path.suffix == ".toml" else f"an entry {alias!r}"
            _fail(
                f"{who} calls the alias {alias!r}, which {path} does not serve (it serves: "
                f"{served}); add {entry} to it, or '*' for every alias"
            )


def _check_credentials(path: Path | None, resources: Any, calls: list[tuple[str, str]]) -> None:
    """Stops before any call when an endpoint an alias called is served by lacks its API key
    (the variable unset, none in the file): every call would fail without being sent."""
    from plait.resources import ResourceConfig
    from plait.resources.endpoint import missing_credential

    config = getattr(resources, "config", resources)  # a manager's, or a config itself
    if not isinstance(config, ResourceConfig):
        return  # a mapping bound in code: its first call says the same
    for who, alias in calls:
        if alias not in config:
            continue  # bound in code and not served: the program's own business
        for endpoint in config.fallbacks(alias):
            missing = missing_credential(endpoint)
            if missing is not None:
                table = '["*"]' if endpoint.name == "*" else f"[{endpoint.name}]"
                where = f"{table} in {path}" if path is not None else "its entry in code"
                _fail(f"{who} calls the alias {alias!r}, whose {missing} ({where})")


def _check_priced(path: Path | None, resources: Any, calls: list[tuple[str, str]]) -> None:
    """Stops before any call when --max-cost is given and an endpoint called has no price:
    the budget could price none of its calls, and would refuse every one."""
    config = getattr(resources, "config", resources)  # a manager's, or a config itself
    if not hasattr(config, "fallbacks"):
        return  # a mapping bound in code: the budget itself names an unpriced endpoint
    toml = path is not None and path.suffix == ".toml"
    price = "price = {input = 0.15, output = 0.60}" if toml else '"price": {"input": 0.15, ...}'
    for who, alias in calls:
        for endpoint in config.fallbacks(alias):
            if endpoint.effective_price is None:
                table = '["*"]' if endpoint.name == "*" else f"[{endpoint.name}]"
                where = f"{table} in {path}" if toml else f"its entry in {path or 'code'}"
                _fail(
                    f"--max-cost needs the price of every endpoint, and {endpoint.name!r} "
                    f"({who}'s alias {alias!r}) has none; add {price} (dollars per "
                    f"million tokens) to {where}, or budget with --max-calls / --max-tokens"
                )


def _check_bound(programs: list[tuple[str, Any]]) -> None:
    """Stops before serving when a program calls a model and has no resources (no
    ``--resources``, none bound in code nor configured), since every call would fail."""
    from plait.execution.settings import find_resources

    for who, program in programs:
        aliases = _aliases(program)
        if aliases and find_resources(bound=program._bound_resources, module=program) is None:
            _fail(
                f"{who} calls the alias {aliases[0]!r} and has no resources: pass --resources "
                "res.toml (a file of alias -> endpoint settings), or bind them where the "
                "program is built"
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
    """Returns the program ``spec`` names, with ``--load``'s parameters, and its row mapper.

    Raises:
        ProgramError: the program, the parameter file or the columns cannot be used.
    """
    program = load_program(spec)
    if load is not None:
        try:
            program.load(load)
        except (KeyError, TypeError, ValueError, OSError) as exc:
            text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            raise ProgramError(f"--load {load}: {text}") from None
    program.eval()
    return program, RowMapper(program, _renames(columns))


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


def _handled(work: Any, on_stop: str | Callable[[], str]) -> Any:
    """Runs a coroutine, turning plait's errors and stopping signals into messages and exit codes.

    ``on_stop`` tells the user what was kept and how to resume after Ctrl-C or SIGTERM (a
    function: asked once the work has stopped).
    """
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
        _fail(f"{type(exc).__name__}: {exc}", EXIT_ABORTED)


def _resume_hint(kwargs: dict[str, Any]) -> str:
    """What a stopped ``run``/``eval`` kept, and how to go on from there."""
    if kwargs["checkpoint_dir"] is not None:
        return (
            f"finished rows are checkpointed in {kwargs['checkpoint_dir']}: rerun the same "
            "command to resume"
        )
    return (
        f"rows finished in order so far are in {kwargs['output_path']}; without "
        "--checkpoint-dir nothing was checkpointed, so a rerun starts over (add "
        "--checkpoint-dir DIR to make a run resumable)"
    )


common_run_options = [
    click.option("-i", "--input", "input_path", type=click.Path(path_type=Path), required=True,
                 help="Rows to run: .jsonl, .csv or .parquet."),
    click.option("-o", "--output", "output_path", type=click.Path(path_type=Path), required=True,
                 help="Where outputs go, one row per input row, in input order."),
    click.option("-r", "--resources", type=click.Path(path_type=Path),
                 help="Endpoints file (.toml, .yaml, .json): alias -> provider settings "
                      "(example below)."),
    click.option("--checkpoint-dir", type=click.Path(path_type=Path),
                 help="Makes the run resumable: rerun with the same directory to continue."),
    click.option("--state", "state", metavar="URL",
                 help="State store (postgresql://user@host:port/db?schema=NAME, or an SQLite "
                      "path): endpoints with cache = true share their replies there."),
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


_ESTIMATE_STOPPED = "nothing ran but the sample's calls"


class _WholeNumber(click.IntRange):
    """A count of at least ``min``; "'abc' is not a valid whole number", not click's
    "... integer range", which reads as if a range were wanted."""

    name = "whole number"


class _Amount(click.FloatRange):
    """An amount such as dollars, of at least ``min``; "'abc' is not a valid number"."""

    name = "number"


estimate_options = [
    click.option("--estimate", is_flag=True,
                 help="Print the calls, tokens and dollars it would spend (low / expected / "
                      "high), measured on --sample rows run for real (train also makes one "
                      "optimizer step on a copy); nothing else runs."),
    click.option("--sample", type=_WholeNumber(min=0), default=2, show_default=True,
                 help="Rows --estimate runs for real to measure one run (0: none)."),
]  # fmt: skip


budget_options = [
    click.option("--max-calls", type=_WholeNumber(min=0), help="Most model calls to send."),
    click.option("--max-tokens", type=_WholeNumber(min=0), help="Most tokens to spend."),
    click.option("--max-cost", type=_Amount(min=0),
                 help="Most dollars to spend (every endpoint needs a price)."),
]  # fmt: skip
"""The hard budget of ``plait train`` and ``plait eval`` (`plait.resources.usage.Budget`)."""


def _with(options: list[Any]) -> Any:
    def decorate(function: Any) -> Any:
        for option in reversed(options):
            function = option(function)
        return function

    return decorate


@click.group(cls=_Plait, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="plait")
def cli() -> None:
    """Build, run and train programs made of LLM calls, over data files.

    PROGRAM is pkg.module:Name or path/to/file.py:Name — a Module class,
    instance, or a function returning one (a file may import the files beside
    it). Only the code you name runs.
    """


def _file_run(program_spec: str, kwargs: dict[str, Any], **extra: Any) -> Any:
    """Returns the `FileRun` of ``plait run`` / ``plait eval``, every part of it checked:
    files to write, program, parameters, columns, resources and aliases, the first row.

    Raises:
        ProgramError, DatasetError, ConfigError: what is wrong (see `_usage_errors`).
    """
    from plait.cli.driver import FileRun

    _check_writable(kwargs["output_path"], "--output")
    _check_writable(kwargs["report_path"], "--report")
    _check_writable(kwargs["trace_path"], "--trace")
    _check_checkpoint_dir(kwargs["checkpoint_dir"])
    program, mapper = _prepare(program_spec, kwargs["load"], kwargs["columns"])
    resources = _resources(kwargs["resources"], program)
    if kwargs.get("state"):
        resources = _with_state(resources, kwargs["state"])
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


def _budget(kwargs: dict[str, Any]) -> Any:
    """Returns the `Budget` of ``--max-calls``, ``--max-tokens`` and ``--max-cost`` (None
    when none is given, or the command has none)."""
    from plait.resources.usage import Budget

    return Budget.of(kwargs.get("max_calls"), kwargs.get("max_tokens"), kwargs.get("max_cost"))


async def _profiled_run(run: Any, spec: str, kind: str, kwargs: dict[str, Any]) -> Any:
    from plait.cli.driver import default_report_path, run_file
    from plait.report.profiling import Profiler

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
    unlisted = outcome.failed - outcome.undone - len(outcome.first_failures)
    if unlisted > 0:
        click.echo(f"  … {unlisted} more failed rows", err=True)
    click.echo(f"outputs: {run.output}; report: {report_path}", err=True)
    return outcome


@cli.command("run", epilog=_RESOURCES_HELP)
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


@cli.command("eval", epilog=_RESOURCES_HELP)
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
@_with(budget_options)
@_with(estimate_options)
def eval_command(program_spec: str, metric: str, target_column: str,
                 fail_under: float | None, estimate: bool, sample: int,
                 **kwargs: Any) -> None:  # fmt: skip
    """Run PROGRAM on every row of --input and score each output against --target.

    Writes outputs with a `score` column; a failed row scores 0. Prints the
    mean score. --max-calls, --max-tokens and --max-cost are a hard budget:
    once it is spent, the rows not yet run are written left undone (scored 0,
    their `error` says so) and the command exits 3; rerunning with
    --checkpoint-dir and a larger budget runs only those. With --estimate,
    prints what the evaluation would spend instead (calls, tokens, dollars)
    and writes nothing.
    """
    with _usage_errors():
        scorer = load_metric(metric)  # a wrong metric stops an estimate too, as it would the run
    if estimate:
        _estimate_eval(program_spec, target_column, sample, kwargs)
    with _usage_errors():
        run = _file_run(program_spec, kwargs, target_column=target_column, metric=scorer)
    outcome = _handled(_profiled_run(run, program_spec, "eval", kwargs), _resume_hint(kwargs))
    score = outcome.score or 0.0
    undone = f", {outcome.undone} of them left undone and scored 0" if outcome.undone else ""
    click.echo(f"score: {score:.4f} ({metric} over {outcome.rows} rows{undone})")
    if outcome.undone:
        click.echo(f"plait: stopped by the budget: {_left_undone(run, outcome, kwargs)}", err=True)
        sys.exit(EXIT_ABORTED)
    if fail_under is not None and score < fail_under:
        sys.exit(EXIT_BELOW_THRESHOLD)
    sys.exit(EXIT_ROWS_FAILED if outcome.failed else EXIT_OK)


def _left_undone(run: Any, outcome: Any, kwargs: dict[str, Any]) -> str:
    """What a budget let ``plait eval`` spend, what it left undone and how to go on."""
    budget = run.budget
    if budget is None:  # the resource configuration's own 'budget' (dollars) refused
        spent = "the budget in the resource configuration is spent"
    else:
        used = budget.spent()
        cost = f", ${used['cost']:.4f}" if budget.max_cost is not None or used["cost"] else ""
        why = budget.refusal or "the budget in the resource configuration is spent"
        spent = f"{why} ({used['calls']} calls, {used['tokens']} tokens{cost} spent)"
    undone = (
        f"{outcome.undone} of {outcome.rows} rows left undone (scored 0; their error column "
        "says so)"
    )
    if kwargs["checkpoint_dir"] is not None:
        rerun = (
            f"finished rows are checkpointed in {kwargs['checkpoint_dir']}: rerun the same "
            "command with a larger budget to run only those left undone"
        )
    else:
        rerun = "nothing was checkpointed (add --checkpoint-dir DIR to make it resumable)"
    return f"{spent}; {undone}; {rerun}"


def _estimate_eval(spec: str, target: str, sample: int, kwargs: dict[str, Any]) -> NoReturn:
    """Prints the estimate of ``plait eval`` (only the sample's calls are made); exits 0."""
    from plait.optimization.costs import estimate

    with _usage_errors():
        program, mapper = _prepare(spec, kwargs["load"], kwargs["columns"])
        pairs = _pairs(kwargs["input_path"], kwargs["input_format"], mapper, target)
        resources = _resources(kwargs["resources"], program)
        calls = [("the program", alias) for alias in _aliases(program)]
        _check_aliases(kwargs["resources"], resources, calls)
        _check_credentials(kwargs["resources"], resources, calls)
        if kwargs["max_cost"] is not None:  # as the run would be refused
            _check_priced(kwargs["resources"], resources, calls)
    told = _handled(
        _awaited(estimate, mapper.module, pairs, resources=resources, sample=sample),
        _ESTIMATE_STOPPED,
    )
    click.echo(str(told))
    sys.exit(EXIT_OK)


async def _awaited(function: Any, *args: Any, **kwargs: Any) -> Any:
    """Calls ``function`` on the command's loop and awaits what it returns (a public
    entry point returns an awaitable only when called inside a running loop)."""
    return await function(*args, **kwargs)


def _pairs(path: Path, fmt: str | None, mapper: RowMapper, target: str) -> list[tuple[Any, Any]]:
    pairs = []
    for number, row in read_rows(path, fmt):
        if target not in row:
            raise ProgramError(
                f"{path}: row {number} has no target column {target!r}; its columns: "
                f"{', '.join(row) or 'none'}. Name the target with --target COLUMN"
            )
        pairs.append((mapper.item(number, row, str(path)), row[target]))
    if not pairs:
        raise ProgramError(f"{path} has no rows")
    return pairs


@cli.command("mcp", epilog=_RESOURCES_HELP)
@click.argument("program_specs", metavar="PROGRAM...", nargs=-1, required=True)
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio for Claude Desktop and IDEs; http: streamable HTTP.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve HTTP on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option(
    "-r",
    "--resources",
    type=click.Path(path_type=Path),
    help="Endpoints file (.toml, .yaml, .json) for the programs' LLM calls.",
)
@click.option("--name", default="plait", show_default=True, help="The server's name.")
@click.option(
    "--api-key-env",
    "api_key_envs",
    multiple=True,
    metavar="NAME",
    help="HTTP: environment variable holding API key(s), comma-separated.",
)
@click.option(
    "--api-key-file",
    "api_key_files",
    multiple=True,
    type=click.Path(path_type=Path),
    help="HTTP: file of API keys, one a line.",
)
def mcp_command(program_specs: tuple[str, ...], transport: str, host: str, port: int,
                resources: Path | None, name: str, api_key_envs: tuple[str, ...],
                api_key_files: tuple[Path, ...]) -> None:  # fmt: skip
    """Serve each PROGRAM as an MCP tool, so other agents and apps can call it.

    A PROGRAM is a Module (class, instance or builder), a plait Tool, or a list
    of them, named after its class; NAME=PROGRAM names it. A program's arguments
    are forward's parameters or its signature's input fields; its result comes
    back as text and structured content.
    Serves stdio until the client leaves, or HTTP at http://HOST:PORT/mcp
    until stopped; off loopback it needs API keys (--api-key-env, --api-key-file),
    sent as Authorization: Bearer <key>. Needs the mcp extra: pip install 'plait[mcp]'.
    """
    with _usage_errors():
        from plait.mcp.serving import check_exposure, load_named, server
        from plait.serve.options import read_api_keys
        from plait.tools import Tool

        keys = read_api_keys(api_key_envs, api_key_files)
        if keys and transport != "http":
            _fail("--api-key-env and --api-key-file are for --transport http")
        if transport == "http":
            check_exposure(host, keys)

        served = load_named(program_specs)
        items = served.items() if isinstance(served, dict) else ((None, p) for p in served)
        programs = [(who or type(p).__name__, p) for who, p in items if not isinstance(p, Tool)]
        config = None
        if resources is not None:
            from plait.resources import ResourceConfig

            config = ResourceConfig.from_file(resources)
            calls = [(who, alias) for who, p in programs for alias in _aliases(p)]
            _check_aliases(resources, config, calls)
            _check_credentials(resources, config, calls)
        else:
            _check_bound(programs)
        try:
            mcp_server = server(served, config, name=name)
        except (ValueError, TypeError, ImportError) as exc:
            raise ProgramError(str(exc)) from None
    if transport == "http":
        _check_port(host, port)
    if transport == "http":
        click.echo(f"plait: serving {', '.join(mcp_server.entries)} over MCP at "
                   f"http://{host}:{port}/mcp", err=True)  # fmt: skip
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a served program stops
        mcp_server.run(transport, host=host, port=port, api_keys=keys)


@cli.command("train", epilog=_RESOURCES_HELP)
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
@click.option(
    "-r",
    "--resources",
    type=click.Path(path_type=Path),
    help="Endpoints file (.toml, .yaml, .json): alias -> provider settings (example below).",
)
@click.option("--target", "target_column", default="target", show_default=True)
@click.option("--metric", default="exact_match", show_default=True)
@click.option("--optimizer-alias", help="Alias of the optimizer's LLM (default: the program's).")
@click.option("--epochs", type=_WholeNumber(min=1), default=1, show_default=True)
@click.option("--batch-size", type=_WholeNumber(min=1), default=8, show_default=True)
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
@_with(budget_options)
@_with(estimate_options)
def train_command(program_spec: str, **kwargs: Any) -> None:  # fmt: skip
    """Train PROGRAM's parameters on --train, keeping the best on --val.

    Each row's target column is checked with --metric (a VerifierLoss); the
    optimizer (SFA) rewrites the prompts; the best parameters are saved.
    --max-calls, --max-tokens and --max-cost are a hard budget: training stops
    before passing it, saves the best parameters so far and exits 3; rerunning
    with --checkpoint-dir and a larger budget goes on. Ctrl-C or SIGTERM
    stops it the same way (exit 130 / 143): the report of what ran is
    written, and the best parameters validated so far are saved. With
    --estimate, prints what training would spend instead and saves nothing.
    """
    save = kwargs["save_path"]
    report_path = kwargs["report_path"] or save.with_name(save.name.split(".")[0] + ".run.json")
    with _usage_errors():
        _check_writable(save, "--save")
        _check_writable(report_path, "--report")
        _check_checkpoint_dir(kwargs["checkpoint_dir"])
        program, mapper = _prepare(program_spec, kwargs["load"], kwargs["columns"])
        metric = load_metric(kwargs["metric"])
        train = _pairs(kwargs["train_path"], None, mapper, kwargs["target_column"])
        val = _pairs(kwargs["val_path"], None, mapper, kwargs["target_column"])
        resources = _resources(kwargs["resources"], program)
        aliases = _aliases(program)
        alias = kwargs["optimizer_alias"] or (aliases[0] if aliases else "optimizer")
        calls = [("the program", name) for name in aliases] + [("the optimizer", alias)]
        _check_aliases(kwargs["resources"], resources, calls)
        _check_credentials(kwargs["resources"], resources, calls)
        if kwargs["max_cost"] is not None:
            _check_priced(kwargs["resources"], resources, calls)
        graph = trace_program(mapper.module, (train[0][0],))
    trainer = _trainer(mapper, train, val, metric, resources, alias, kwargs)
    _check_training_checkpoint(trainer)
    if kwargs["estimate"]:
        click.echo(str(_handled(_awaited(trainer.estimate, kwargs["sample"]), _ESTIMATE_STOPPED)))
        sys.exit(EXIT_OK)
    kept: list[str] = []  # what a stopped training wrote
    report = _handled(
        _train(trainer, program_spec, graph, kwargs, (program, save, report_path), kept),
        lambda: "; ".join([*kept, _training_resume_hint(kwargs)]),
    )
    program.save(save)
    report.save(report_path)
    training = report.training or {}
    click.echo(report.summary(), err=True)
    click.echo(f"{_validation_line(training)}; saved {save}; report {report_path}")
    click.echo(f"training {_as_options(training.get('reason', ''))}")
    if training.get("stopped_by_budget"):
        left = _as_options(training.get("left_undone", ""))
        click.echo(f"plait: stopped by the budget: {left}", err=True)
        sys.exit(EXIT_ABORTED)
    sys.exit(EXIT_OK)


def _check_training_checkpoint(trainer: Any) -> None:
    """Stops before any call when --checkpoint-dir holds a training of other settings or
    data, or a file plait cannot resume from."""
    from plait.execution.checkpoint_codec import CheckpointError

    try:
        trainer._read_checkpoint()
    except (ValueError, CheckpointError) as exc:
        _fail(_as_options(str(exc)))


def _as_options(text: str) -> str:
    """The Trainer's words with its settings named as this command's options."""
    text = text.replace("give checkpoint_dir to", "add --checkpoint-dir DIR to")
    text = text.replace("another checkpoint_dir", "another --checkpoint-dir")
    return text.replace("the same checkpoint_dir", "the same --checkpoint-dir")


def _validation_line(training: dict[str, Any]) -> str:
    """The scores a training run ends with, or that it has none to show."""
    from plait.optimization.training.report import NOTHING_VALIDATED

    if training.get("reason", "").endswith(NOTHING_VALIDATED):
        return "validation: none finished (the program is saved as it was)"
    return (
        f"validation: {training.get('initial_score', 0):.4f} -> {training.get('best_score', 0):.4f}"
        f" (best epoch {training.get('best_epoch')})"
    )


def _training_resume_hint(kwargs: dict[str, Any]) -> str:
    """What a stopped ``train`` kept, and how to go on from there."""
    if kwargs["checkpoint_dir"] is not None:
        return (
            f"the training state is saved in {kwargs['checkpoint_dir']} after every minibatch: "
            "rerun the same command to resume"
        )
    return "nothing was saved (add --checkpoint-dir DIR to make training resumable)"


def _trainer(
    mapper: RowMapper,
    train: list[tuple[Any, Any]],
    val: list[tuple[Any, Any]],
    metric: Any,
    resources: Any,
    alias: str,
    kwargs: dict[str, Any],
) -> Any:
    """Returns the `Trainer` of ``plait train``: SFA on the program's prompts, judged by
    ``metric`` through a `VerifierLoss`."""
    from plait.optimization import SFAOptimizer, Trainer, VerifierLoss

    return Trainer(
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
        max_calls=kwargs["max_calls"],
        max_tokens=kwargs["max_tokens"],
        max_cost=kwargs["max_cost"],
    )


async def _train(
    trainer: Any,
    spec: str,
    graph: Any,
    kwargs: dict[str, Any],
    written: tuple[Any, Path, Path],
    kept: list[str],
) -> Any:
    """Trains; returns the run report. Stopped (Ctrl-C, SIGTERM), it still writes the report
    of what ran to --report and, when a validation finished, the program with the best
    parameters validated so far to --save (``written``: the program and those two paths),
    and says in ``kept`` what it wrote."""
    import asyncio

    from plait.optimization.training.report import NOTHING_VALIDATED
    from plait.report.learning import LearningLog
    from plait.report.profiling import Profiler

    with Profiler(max_records=_REPORT_SAMPLE) as profiler, LearningLog() as learning:
        try:
            await trainer.fit()
        except asyncio.CancelledError:
            program, save, report_path = written
            _train_report(trainer, profiler, learning, spec, graph, kwargs).save(report_path)
            told = trainer.report
            if told.reason.endswith(NOTHING_VALIDATED):
                kept.append(f"nothing was validated, so nothing saved; report {report_path}")
            else:
                program.save(save)
                kept.append(
                    f"saved the best parameters validated so far (epoch {told.best_epoch}, "
                    f"validation {told.best_score:.4f}) to {save}; report {report_path}"
                )
            raise
    return _train_report(trainer, profiler, learning, spec, graph, kwargs)


def _train_report(
    trainer: Any, profiler: Any, learning: Any, spec: str, graph: Any, kwargs: dict[str, Any]
) -> Any:
    """The run report of ``plait train`` (of a stopped one too: its ``training`` says so)."""
    from dataclasses import asdict

    return profiler.report(
        program=spec,  # as the user typed it, like `plait run`
        kind="train",
        graph=graph,
        training=asdict(trainer.report),
        learning=learning.steps,
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
    from plait import _files

    try:
        _files.write_atomically(output_path, text + "\n")
    except FileError as exc:
        _fail(str(exc))


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


PENDING_DB_NAME = "plait-pending.sqlite"


def _default_pending_db(resources: Path | None) -> Path:
    """Returns where paused runs are kept unless ``--pending-db`` says: beside the resources
    file (a deployment's own directory), else in the current directory."""
    return (resources.parent if resources is not None else Path()) / PENDING_DB_NAME


@cli.command("serve", epilog=_RESOURCES_HELP)
@click.argument("program_specs", metavar="PROGRAM...", nargs=-1, required=True)
@click.option(
    "-r",
    "--resources",
    type=click.Path(path_type=Path),
    help="Endpoints file (.toml, .yaml, .json) every request shares (example below).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Interface to listen on; other than loopback needs an API key.",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Processes; each holds 1/N of every endpoint's limits (together, the limits).",
)
@click.option(
    "--ray-replicas",
    type=click.IntRange(min=1),
    help="Serve from N Ray Serve replicas (a local Ray, or RAY_ADDRESS's cluster); "
    "endpoint limits hold across all of them.",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds runs in flight may take to finish on SIGTERM.",
)
@click.option(
    "--api-key-env",
    "api_key_envs",
    multiple=True,
    metavar="NAME",
    help="Environment variable holding API key(s), comma-separated.",
)
@click.option(
    "--api-key-file",
    "api_key_files",
    multiple=True,
    type=click.Path(path_type=Path),
    help="File of API keys, one a line.",
)
@click.option(
    "--cors-origin",
    "cors_origins",
    multiple=True,
    metavar="ORIGIN",
    help="Let browsers on ORIGIN call the API ('*' for any); CORS is off without it.",
)
@click.option(
    "--max-queued",
    type=click.IntRange(min=0),
    default=512,
    show_default=True,
    help="Runs that may wait for a place; beyond, 429 with Retry-After.",
)
@click.option(
    "--max-active",
    type=click.IntRange(min=1),
    default=128,
    show_default=True,
    help="Runs executing at once.",
)
@click.option(
    "--max-body",
    "max_body_bytes",
    type=click.IntRange(min=1),
    default=1_048_576,
    show_default=True,
    help="Largest request body in bytes (413 beyond).",
)
@click.option(
    "--deadline",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds one request may run (504 beyond).",
)
@click.option(
    "--pending-db",
    type=click.Path(path_type=Path, dir_okay=False),
    help="SQLite file of runs waiting for approval and of used approvals "
    f"[default: {PENDING_DB_NAME} beside --resources, else in the current directory].",
)
@click.option(
    "--pending-ttl",
    type=click.FloatRange(min=0, min_open=True),
    default=86_400.0,
    show_default=True,
    help="Seconds a paused run waits for its answer (410 beyond).",
)
@click.option(
    "--max-pending-bytes",
    type=click.IntRange(min=1),
    default=4 * 1_048_576,
    show_default=True,
    help="Largest stored state of one paused run (507 beyond).",
)
@click.option(
    "--max-pending-runs",
    type=click.IntRange(min=1),
    default=1_000,
    show_default=True,
    help="Paused runs kept at once, of every key (503 beyond).",
)
@click.option(
    "--max-pending-per-key",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Paused runs kept at once for one API key (429 beyond).",
)
@click.option(
    "--access-log/--no-access-log",
    default=True,
    show_default=True,
    help="Write one JSON line per request (request id, method, path, status, duration, "
    "client) to standard error.",
)
@click.option(
    "--approval-key-env",
    metavar="NAME",
    help="Environment variable holding the approval key (32+ bytes) that seals pauses, so "
    "paused runs can be resumed after a restart [default: PLAIT_APPROVAL_KEY].",
)
def serve_command(program_specs: tuple[str, ...], resources: Path | None, host: str, port: int,
                  workers: int, ray_replicas: int | None, api_key_envs: tuple[str, ...],
                  api_key_files: tuple[Path, ...], pending_db: Path | None,
                  **options: Any) -> None:  # fmt: skip
    """Serve PROGRAM(s) over HTTP: typed runs, SSE, OpenAI-compatible chat, approvals, a
    chat page, metrics.

    Each PROGRAM is pkg.module:Name or file.py:Name, served under its name, or
    NAME=PROGRAM to choose the name. Routes: GET / (the chat page), POST /programs/NAME/run,
    POST /programs/NAME/runs/ID/resume, POST /v1/chat/completions, GET /openapi.json,
    /healthz, /readyz, /metrics.
    """
    from plait.serve.options import ServeOptions, check_exposure, read_api_keys

    with _usage_errors():
        named = [_served_name(spec) for spec in program_specs]
        keys = read_api_keys(api_key_envs, api_key_files)
        serve_options = ServeOptions(
            api_keys=tuple(keys),
            cors_origins=tuple(options.pop("cors_origins")),
            pending_db=str(pending_db or _default_pending_db(resources)),
            workers=workers,
            **options,
        )
        check_exposure(host, serve_options)
        if ray_replicas is not None and workers > 1:
            _fail("--ray-replicas and --workers both run copies of the server; choose one")
        if workers > 1:
            from plait.serve.runs import check_shares
            from plait.serve.server import serve_workers

            # found wrong here, once, rather than in every worker
            loaded = {name: load_program(spec) for name, spec in named}
            config = _resources(resources, next(iter(loaded.values())))
            for name, program in loaded.items():
                calls = [(name, alias) for alias in _aliases(program)]
                _check_aliases(resources, config, calls)
                _check_credentials(resources, config, calls)
            check_shares(config, workers)
            _check_port(host, port)
            serve_workers(
                named, str(resources) if resources else None,
                host=host, port=port, options=serve_options,
            )  # fmt: skip
            return
        programs = {name: _prepare(spec, None, ())[0] for name, spec in named}
        config = _resources(resources, next(iter(programs.values())))
        for name, program in programs.items():
            calls = [(name, alias) for alias in _aliases(program)]
            _check_aliases(resources, config, calls)
            _check_credentials(resources, config, calls)
        if ray_replicas is not None:  # Ray Serve's proxy takes the port on the cluster's node
            _serve_on_ray(named, config, ray_replicas, host, port, serve_options)
            return
        _check_port(host, port)
        from plait.serve import app, serve

        try:
            served = app(programs, config, **vars(serve_options))
        except FileError as exc:  # the pending runs file is a link, or not a store
            _fail(str(exc))
    serve(served, host=host, port=port, options=serve_options)


def _serve_on_ray(
    named: list[tuple[str, str]],
    config: Any,
    replicas: int,
    host: str,
    port: int,
    options: Any,
) -> None:
    """Serves the programs from Ray Serve replicas (each loads them) until SIGTERM/Ctrl-C."""
    from plait.serve.ray_serve import programs_loader, run

    loader = programs_loader(named)
    run(loader, config, replicas=replicas, host=host, port=port, blocking=True, **vars(options))


def _check_port(host: str, port: int) -> None:
    """Stops with one line when the server could not listen on ``host:port`` (a port another
    server holds, an address not of this machine), once the programs and resources are
    found right (a mistake in them is the more useful thing to hear first).

    The port is bound as uvicorn binds it (``SO_REUSEADDR``) and let go at once, so what
    this finds free the server then takes, unless another process takes it in between.
    """
    import errno
    import socket

    if port == 0:
        return  # the system picks a free one
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            _fail(
                f"port {port} on {host} is in use (another server listens there); stop it, "
                "or pass --port with a free port"
            )
        _fail(f"cannot listen on {host} port {port}: {exc.strerror or exc}; pass another --host")


def _served_name(spec: str) -> tuple[str, str]:
    """Returns ``(name, program)`` of ``NAME=PROGRAM``, or of ``PROGRAM`` named after it."""
    name, sep, program = spec.partition("=")
    if sep:
        return name, program
    return spec.rpartition(":")[2].rpartition(".")[2], spec
