"""``plait eval``: ``run`` with each output scored against its target, under a budget, or
its ``--estimate``."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click

from plait.cli import EXIT_ABORTED, EXIT_BELOW_THRESHOLD, EXIT_OK, EXIT_ROWS_FAILED
from plait.cli.checks import (
    _aliases,
    _check_aliases,
    _check_credentials,
    _check_priced,
    _resources,
)
from plait.cli.exits import _awaited, _handled, _usage_errors
from plait.cli.file_run import _file_run, _profiled_run, _resume_hint
from plait.cli.loading import _pairs, _prepare
from plait.cli.options import (
    _ESTIMATE_STOPPED,
    _RESOURCES_HELP,
    _with,
    budget_options,
    common_run_options,
    estimate_options,
)
from plait.cli.programs import load_metric

__all__ = ["eval_command"]


@click.command("eval", epilog=_RESOURCES_HELP)
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
    elif kwargs.get("state"):
        rerun = (
            "finished rows are checkpointed in the state store (--state): rerun the same "
            "command with a larger budget to run only those left undone"
        )
    else:
        rerun = "nothing was checkpointed (add --checkpoint-dir DIR to make it resumable)"
    return f"{spent}; {undone}; {rerun}"


def _estimate_eval(spec: str, target: str, sample: int, kwargs: dict[str, Any]) -> NoReturn:
    """Prints the estimate of ``plait eval`` (only the sample's calls are made); exits 0."""
    # import time: `plait --help` loads none of this, the command does
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
