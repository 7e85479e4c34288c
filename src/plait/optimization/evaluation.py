"""Evaluation: run a program over a dataset, every example concurrently, and score it.

    result = await evaluate(program, examples, exact_match, resources=config)
    result                  # 0.64 — the mean; it compares and formats as a float
    result.ci               # (0.55, 0.73): a 95 % bootstrap confidence interval
    result.rows[3]          # input, output, target, score, error, calls, tokens, cost
    result.calls, result.cost
    result.save("eval.jsonl")      # or .parquet (with pyarrow), result.to_frame() (pandas)

    outputs = await run_dataset(program, inputs, resources=config)   # no metric: outputs alone

A dataset is a sequence of ``(input, target)`` pairs, or of mappings with
``"input"`` and ``"target"`` keys (the BIG-Bench-Hard layout). Each input is
passed as the one argument of ``forward``; the examples run as one batch, so
they share one resource manager and its limits, and each example's model
calls (re-asks and calls inside ``async def forward`` included) are counted
in its row.

In a script with no event loop running, ``evaluate`` and ``run_dataset`` run
to completion and return the result, as a module call does (no ``await``).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from plait._together import together
from plait.backends.types import Usage
from plait.callbacks import ReportedCall
from plait.errors import described
from plait.execution.observe import callbacks_for
from plait.execution.run import awaitable_or_result, run
from plait.execution.settings import resources_of
from plait.feedback import Feedback
from plait.module import Module
from plait.optimization.results import EvaluationResult, ExampleRow, RunResult
from plait.optimization.results import _rebuild as _rebuild  # what pickles made before name
from plait.resources.config import resources_with_state
from plait.resources.state import StateURL
from plait.resources.usage import Budget, budgeted

__all__ = [
    "EvaluationResult",
    "ExampleRow",
    "RunResult",
    "as_metric",
    "evaluate",
    "exact_match",
    "examples_of",
    "run_dataset",
    "score_of",
]

logger = logging.getLogger("plait.evaluation")

Metric = Callable[[Any, Any], Any]
"""``metric(output, target)`` → bool, number or `Feedback` (or an awaitable of one)."""

_DSPY_EXAMPLE_NAMES = frozenset({"example", "gold"})
_DSPY_PREDICTION_NAMES = frozenset({"pred", "prediction"})


def as_metric(metric: Metric) -> Metric:
    """Returns ``metric`` as plait calls metrics: ``metric(output, target)``.

    A metric written for DSPy takes the example first, ``metric(example, pred,
    trace=None)``. One whose first two parameters are named so (``example`` or
    ``gold``, then ``pred`` or ``prediction``) is turned around; names are the
    evidence because a plait metric never starts with the example. Its
    ``example`` is the target; a mapping target is given as a `Prediction`,
    so ``example.answer`` reads it as in DSPy (the inputs are not part of
    it). ``trace`` is never passed. Any other metric is returned as it is.
    """
    if isinstance(metric, _ExampleFirst) or not _names_the_example_first(metric):
        return metric
    return _ExampleFirst(metric)


def _names_the_example_first(metric: Metric) -> bool:
    try:
        names = list(inspect.signature(metric).parameters)[:2]
    except (TypeError, ValueError):  # no signature to read (some builtins)
        return False
    return (
        len(names) == 2 and names[0] in _DSPY_EXAMPLE_NAMES and names[1] in _DSPY_PREDICTION_NAMES
    )


class _ExampleFirst:
    """A DSPy-order metric called as ``metric(output, target)`` (see `as_metric`)."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric
        self.__name__ = getattr(metric, "__name__", type(metric).__name__)

    def __call__(self, output: Any, target: Any) -> Any:
        return self.metric(_as_example(target), output)

    def __repr__(self) -> str:
        return f"as_metric({self.metric!r})"


def _as_example(target: Any) -> Any:
    # import time: the module library, only for a Prediction row
    from plait.modules.prediction import Prediction

    if isinstance(target, Mapping) and not isinstance(target, Prediction):
        return Prediction(target)
    return target


def exact_match(output: Any, target: Any) -> bool:
    """Whether ``output`` and ``target`` are the same text, ignoring case and outer spaces.

    An output with exactly one field (a `Prediction` of a one-output
    signature, a one-key dict) is compared by that field's value, unless the
    target is itself a mapping. A mapping target (a dataset row of labels) is
    compared field by field with the output's fields of the same names, so a
    typed output with more fields (``reasoning``, fields left unlabelled)
    matches when every labelled field does.
    """
    if isinstance(output, Mapping) and isinstance(target, Mapping) and target:
        return all(key in output and exact_match(output[key], target[key]) for key in target)
    output, target = _sole_value(output, target), _sole_value(target, output)
    return str(output).strip().lower() == str(target).strip().lower()


def _sole_value(value: Any, other: Any) -> Any:
    if isinstance(value, Mapping) and len(value) == 1 and not isinstance(other, Mapping):
        return next(iter(value.values()))
    return value


def examples_of(dataset: Iterable[Any]) -> list[tuple[Any, Any]]:
    """Returns the dataset as ``(input, target)`` pairs.

    Raises:
        ValueError: an example is neither a pair nor a mapping with
            ``"input"`` and ``"target"``; the message names its position.
    """
    pairs: list[tuple[Any, Any]] = []
    for position, example in enumerate(dataset):
        if isinstance(example, Mapping) and "input" in example and "target" in example:
            pairs.append((example["input"], example["target"]))
        elif isinstance(example, tuple | list) and len(example) == 2:
            pairs.append((example[0], example[1]))
        else:
            raise ValueError(
                f"example {position} is {type(example).__name__} {example!r:.80}; expected an "
                '(input, target) pair or a mapping with "input" and "target" keys'
            )
    return pairs


def score_of(metric: Metric, output: Any, target: Any) -> float:
    """Returns ``metric(output, target)`` as a float: True/False count 1/0, a `Feedback` its score.

    A DSPy-order metric is called in its own order (`as_metric`).

    Raises:
        TypeError: the metric returned something that is not a score.
    """
    metric = as_metric(metric)
    return _as_score(metric, metric(output, target))[0]


def _as_score(metric: Metric, result: Any) -> tuple[float, str | None]:
    """Returns a metric's result as (score, feedback text or None)."""
    if isinstance(result, Feedback):
        return (0.0 if result.score is None else float(result.score)), str(result)
    if isinstance(result, bool | int | float):
        return float(result), None
    name = getattr(metric, "__name__", type(metric).__name__)
    raise TypeError(
        f"metric {name} returned {type(result).__name__} {result!r:.80}; "
        "a metric returns a bool, a number or a Feedback with a score"
    )


# ---------------------------------------------------------------------- rows


# ------------------------------------------------------------------ results


# ------------------------------------------------------------------- running
async def _run_rows(
    module: Module,
    inputs: Sequence[Any],
    *,
    resources: Any,
    max_concurrent: int | None,
    progress: bool | None,
) -> list[ExampleRow]:
    """Runs ``module`` (eval mode) on every input as one batch; returns a row per input."""
    was_training = module.training
    module.eval()
    try:
        results = await run(
            module,
            list(inputs),
            resources=resources,
            max_concurrent=max_concurrent,
            streaming=True,
            preserve_order=True,
            progress=progress,
        )
    finally:
        module.train(was_training)
    rows = []
    for result in results:
        usage = result.usage or {}
        error = None if result.error is None else described(result.error)
        rows.append(
            ExampleRow(
                index=result.index,
                input=result.input,
                output=result.output if result.ok else None,
                error=error,
                calls=usage.get("calls", 0),
                refused=usage.get("refused", 0),
                usage=Usage(
                    usage.get("input_tokens", 0),
                    usage.get("output_tokens", 0),
                    usage.get("cost", 0.0),
                    usage.get("cached", 0),
                ),
            )
        )
    return rows


def run_dataset(
    module: Module,
    dataset: Iterable[Any],
    *,
    resources: Any = None,
    max_concurrent: int | None = None,
    progress: bool | None = None,
) -> Any:
    """Runs ``module`` on every input of a dataset (eval mode, concurrently); no scoring.

    Like a module call: ``await run_dataset(...)`` inside a running event
    loop; in a script with no loop running it runs to completion and returns
    the `RunResult` (`plait.execution.run.awaitable_or_result`).

    Args:
        module: the program.
        dataset: inputs; a mapping with an ``"input"`` key counts as an
            example (its ``"target"``, if any, is kept in the row).
        resources: ResourceConfig / ResourceManager / mapping (default: the
            module's bound resources, or those of ``ExecutionSettings``).
        max_concurrent: most LLM calls in flight at once.
        progress: show a progress bar (None: when stderr is a terminal).

    Returns:
        A `RunResult`: ``outputs``, ``rows`` (with each example's error and
        usage), totals, `RunResult.save` and `RunResult.to_frame`. A failed
        example does not stop the others.
    """
    work = _run_dataset(module, dataset, resources, max_concurrent, progress)
    return awaitable_or_result(work)


async def _run_dataset(
    module: Module,
    dataset: Iterable[Any],
    resources: Any,
    max_concurrent: int | None,
    progress: bool | None,
) -> RunResult:
    """The body of `run_dataset`."""
    items = list(dataset)
    inputs = [_input_of(item) for item in items]
    rows = await _run_rows(
        module, inputs, resources=resources, max_concurrent=max_concurrent, progress=progress
    )
    for row, item in zip(rows, items, strict=True):
        if isinstance(item, Mapping) and "input" in item:
            row.target = item.get("target")
    return RunResult(rows)


def _input_of(item: Any) -> Any:
    return item["input"] if isinstance(item, Mapping) and "input" in item else item


def evaluate(
    module: Module,
    dataset: Iterable[Any],
    metric: Metric | None = None,
    *,
    resources: Any = None,
    max_concurrent: int | None = None,
    progress: bool | None = None,
    max_calls: int | None = None,
    max_tokens: int | None = None,
    max_cost: float | None = None,
    state: str | os.PathLike[str] | StateURL | None = None,
) -> Any:
    """Runs ``module`` on every input (eval mode, concurrently) and scores each output.

    Like a module call: ``await evaluate(...)`` inside a running event loop;
    in a script with no loop running it runs to completion and returns the
    `EvaluationResult` (`plait.execution.run.awaitable_or_result`).

    Args:
        module: the program.
        dataset: ``(input, target)`` pairs or mappings with ``input``/``target``.
        metric: ``metric(output, target)`` → bool, number or `Feedback`, or an
            awaitable of one; default `exact_match`. A DSPy metric,
            ``metric(example, pred, trace=None)``, is recognised by its
            parameter names and called in its own order (`as_metric`).
        resources: ResourceConfig / ResourceManager / mapping (default: the
            module's bound resources, or those of ``ExecutionSettings``).
        max_concurrent: most LLM calls in flight at once.
        progress: show a progress bar (None: when stderr is a terminal).
        max_calls, max_tokens, max_cost: a hard budget for the whole
            evaluation (`plait.resources.budget.Budget`): requests are held
            against it before they are sent, wait while calls in flight may
            give room back, and those it could never have room for are not sent.
        state: a state store URL (``"postgresql://…"`` or an SQLite path), as
            for `plait.run`: endpoints with ``cache = true`` keep their replies
            there, and the evaluation's finished examples are checkpointed
            there, so a rerun anywhere with the same store runs only the rest.

    Returns:
        An `EvaluationResult`: the mean score (it is a float) with every
        example's row. An example whose run failed scores 0, keeps its error
        in its row, and is logged; one the budget left undone also counts in
        ``unevaluated`` (and ``stopped_by_budget`` is true).

    Raises:
        ValueError: the dataset is empty or malformed.
        TypeError: the metric returned something that is not a score.

    Callbacks (``ExecutionSettings(callbacks=...)`` or the module's own) hear
    ``on_evaluate_start`` with the program, the dataset and the metric, and
    ``on_evaluate_end`` with the result, or the exception that stopped it.
    """
    budget = Budget.of(max_calls, max_tokens, max_cost)
    if state is not None:
        found = resources_of(module, resources, who="evaluate", takes="evaluate()")
        resources = resources_with_state(found, state)
    return awaitable_or_result(
        _evaluate(module, dataset, metric, resources, max_concurrent, progress, budget)
    )


async def _evaluate(
    module: Module,
    dataset: Iterable[Any],
    metric: Metric | None,
    resources: Any,
    max_concurrent: int | None,
    progress: bool | None,
    budget: Any = None,
) -> EvaluationResult:
    """The body of `evaluate`: reports the call to callbacks around `_scored`."""
    pairs = examples_of(dataset)
    if not pairs:
        raise ValueError("evaluate() got an empty dataset")
    metric = metric or exact_match
    inputs = {"devset": pairs, "metric": metric}
    scorer = as_metric(metric)
    with (
        ReportedCall("evaluate", module, inputs, callbacks_for(module)) as call,
        budgeted(budget),
    ):
        call.outputs = await _scored(module, pairs, scorer, resources, max_concurrent, progress)
    if call.outputs.stopped_by_budget:
        # The budget of a search or a Trainer around this evaluation is theirs to report
        # (once, in their report); a warning per candidate would only repeat it.
        logger.log(
            logging.WARNING if budget is not None else logging.DEBUG,
            "evaluate: the budget left %d of %d examples undone (%s)",
            call.outputs.unevaluated,
            len(pairs),
            budget.refusal if budget is not None else "an outer budget",
        )
    return call.outputs


async def _scored(
    module: Module,
    pairs: list[tuple[Any, Any]],
    metric: Metric,
    resources: Any,
    max_concurrent: int | None,
    progress: bool | None,
) -> EvaluationResult:
    """Runs the examples and scores them."""
    rows = await _run_rows(
        module,
        [inputs for inputs, _ in pairs],
        resources=resources,
        max_concurrent=max_concurrent,
        progress=progress,
    )
    judged: list[tuple[ExampleRow, Any]] = []
    for row, (_, target) in zip(rows, pairs, strict=True):
        row.target = target
        if row.error is not None:
            row.score = 0.0
        else:
            judged.append((row, metric(row.output, target)))
    waiting = [result for _, result in judged if inspect.isawaitable(result)]
    if waiting:  # an LLM judge: every example's judgement concurrently
        done = iter(await together(*waiting))
        judged = [(row, next(done) if inspect.isawaitable(r) else r) for row, r in judged]
    for row, result in judged:
        row.score, row.feedback = _as_score(metric, result)
    failed = sum(row.error is not None and not row.refused for row in rows)
    if failed:  # the examples a budget left undone are told apart, by `_evaluate`
        logger.warning("evaluate: %d of %d examples failed and scored 0", failed, len(pairs))
    return EvaluationResult.from_rows(rows)
