"""``plait train``: a program's prompts trained on rows, the best parameters on validation
saved, under a budget, resumable from a checkpoint, or its ``--estimate``."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from plait.cli import EXIT_ABORTED, EXIT_OK
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
from plait.cli.exits import _awaited, _fail, _handled, _usage_errors
from plait.cli.loading import _pairs, _prepare
from plait.cli.options import (
    _ESTIMATE_STOPPED,
    _REPORT_SAMPLE,
    _RESOURCES_HELP,
    WholeNumber,
    _with,
    budget_options,
    estimate_options,
)
from plait.cli.programs import RowMapper, load_metric, trace_program

__all__ = ["train_command"]


@click.command("train", epilog=_RESOURCES_HELP)
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
@click.option("--epochs", type=WholeNumber(min=1), default=1, show_default=True)
@click.option("--batch-size", type=WholeNumber(min=1), default=8, show_default=True)
@click.option(
    "--save",
    "save_path",
    type=click.Path(path_type=Path),
    help="Where the trained parameters go (JSON; `plait run --load` reads it); "
    "needed unless --estimate.",
)
@click.option("--checkpoint-dir", type=click.Path(path_type=Path))
@click.option(
    "--state",
    "state",
    metavar="URL",
    help="State store (postgresql://user@host:port/db?schema=NAME, or an SQLite path) that "
    "keeps the training checkpoint when no --checkpoint-dir is given [default: the [state] "
    "url of --resources].",
)
@click.option("--max-concurrent", type=WholeNumber(min=1))
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
    with --checkpoint-dir (or --state) and a larger budget goes on. Ctrl-C or SIGTERM
    stops it the same way (exit 130 / 143): the report of what ran is
    written, and the best parameters validated so far are saved. With
    --estimate, prints what training would spend instead and saves nothing.
    """
    save = kwargs["save_path"]
    if save is None and not kwargs["estimate"]:
        _fail(
            "--save is missing: name the file the trained parameters go to (--save "
            "learned.json), or add --estimate to see what training would spend"
        )
    report_path = kwargs["report_path"]
    if save is not None and report_path is None:
        report_path = save.with_name(save.name.split(".")[0] + ".run.json")
    with _usage_errors():
        if not kwargs["estimate"]:  # an estimate writes nothing
            _check_writable(save, "--save")
            _check_writable(report_path, "--report")
        _check_checkpoint_dir(kwargs["checkpoint_dir"])
        program, mapper = _prepare(program_spec, kwargs["load"], kwargs["columns"])
        metric = load_metric(kwargs["metric"])
        train = _pairs(kwargs["train_path"], None, mapper, kwargs["target_column"])
        val = _pairs(kwargs["val_path"], None, mapper, kwargs["target_column"])
        resources = _resources(kwargs["resources"], program)
        resources = _with_state(resources, kwargs["state"])
        kwargs["state"] = getattr(resources, "state", None)  # --state, or the file's [state]
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
    # import time: `plait --help` loads none of this, the command does
    from plait.execution.checkpoint_codec import CheckpointError

    try:
        trainer._read_checkpoint()
    except (ValueError, CheckpointError) as exc:
        _fail(_as_options(str(exc)))


def _as_options(text: str) -> str:
    """The Trainer's words with its settings named as this command's options."""
    text = text.replace("give checkpoint_dir to", "add --checkpoint-dir DIR to")
    text = text.replace("another checkpoint_dir", "another --checkpoint-dir")
    text = text.replace("the same state ", "the same --state ")
    return text.replace("the same checkpoint_dir", "the same --checkpoint-dir")


def _validation_line(training: dict[str, Any]) -> str:
    """The scores a training run ends with, or that it has none to show."""
    # import time: `plait --help` loads none of this, the command does
    from plait.optimization.training.report import NOTHING_VALIDATED

    if training.get("reason", "").endswith(NOTHING_VALIDATED):
        return "validation: none finished (the program is saved as it was)"
    return (
        f"validation: {training.get('initial_score', 0):.4f} -> {training.get('best_score', 0):.4f}"
        f" (best epoch {training.get('best_epoch')})"
    )


def _training_resume_hint(kwargs: dict[str, Any]) -> str:
    """What a stopped ``train`` kept, and how to go on from there."""
    where = kwargs["checkpoint_dir"] or kwargs["state"]
    if where is not None:
        return (
            f"the training state is saved in {where} after every minibatch: "
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
    # import time: `plait --help` loads none of this, the command does
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
        state=kwargs["state"],
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
    import asyncio  # import time: `plait --help` loads none of this, the command does

    # import time: `plait --help` loads none of this, the command does
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
    return profiler.report(
        program=spec,  # as the user typed it, like `plait run`
        kind="train",
        graph=graph,
        training=asdict(trainer.report),
        learning=learning.steps,
        metrics={"train": str(kwargs["train_path"]), "val": str(kwargs["val_path"])},
    )
