"""Evaluation: a program's mean score on a dataset, every example run concurrently.

    accuracy = await evaluate(program, examples, exact_match, resources=config)

A dataset is a sequence of ``(input, target)`` pairs, or of mappings with
``"input"`` and ``"target"`` keys (the BIG-Bench-Hard layout). Each input is
passed as the one argument of ``forward``; the examples run as one batch, so
they share one resource manager and its limits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from plait.feedback import Feedback
from plait.module import Module

__all__ = ["evaluate", "exact_match", "examples_of", "score_of"]

logger = logging.getLogger("plait.evaluation")

Metric = Callable[[Any, Any], Any]


def exact_match(output: Any, target: Any) -> bool:
    """Whether ``output`` and ``target`` are the same text, ignoring case and outer spaces."""
    return str(output).strip().lower() == str(target).strip().lower()


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

    Raises:
        TypeError: the metric returned something that is not a score.
    """
    result = metric(output, target)
    if isinstance(result, Feedback):
        return 0.0 if result.score is None else float(result.score)
    if isinstance(result, bool | int | float):
        return float(result)
    name = getattr(metric, "__name__", type(metric).__name__)
    raise TypeError(
        f"metric {name} returned {type(result).__name__} {result!r:.80}; "
        "a metric returns a bool, a number or a Feedback with a score"
    )


async def evaluate(
    module: Module,
    dataset: Iterable[Any],
    metric: Metric | None = None,
    *,
    resources: Any = None,
    max_concurrent: int | None = None,
    progress: bool | None = False,
) -> float:
    """Runs ``module`` on every input (eval mode, concurrently) and returns the mean metric.

    Args:
        module: the program.
        dataset: ``(input, target)`` pairs or mappings with ``input``/``target``.
        metric: ``metric(output, target)`` → bool, number or `Feedback`;
            default `exact_match`.
        resources: ResourceConfig / ResourceManager / mapping (default: the
            module's bound resources, or those of ``ExecutionSettings``).
        max_concurrent: most LLM calls in flight at once.
        progress: show a progress bar (None: when stderr is a terminal).

    Returns:
        The mean score; an example whose run failed scores 0 (and is logged).

    Raises:
        ValueError: the dataset is empty or malformed.
    """
    from plait.execution import run

    pairs = examples_of(dataset)
    if not pairs:
        raise ValueError("evaluate() got an empty dataset")
    metric = metric or exact_match
    was_training = module.training
    module.eval()
    try:
        outputs = await run(
            module,
            [inputs for inputs, _ in pairs],
            resources=resources,
            max_concurrent=max_concurrent,
            on_error="collect",
            progress=progress,
        )
    finally:
        module.train(was_training)
    total, failed = 0.0, 0
    for output, (_, target) in zip(outputs, pairs, strict=True):
        if isinstance(output, BaseException):
            failed += 1
            continue
        total += score_of(metric, output, target)
    if failed:
        logger.warning("evaluate: %d of %d examples failed and scored 0", failed, len(pairs))
    return total / len(pairs)
