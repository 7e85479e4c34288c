"""The public home of `plait.optimization.evaluation`, where the learning layer keeps it.

``from plait.evaluation import evaluate`` (and the rest of its `__all__`)
keeps working for programs written before evaluation joined the learning
layer's folder.
"""

from plait.optimization.evaluation import (
    EvaluationResult,
    ExampleRow,
    RunResult,
    as_metric,
    evaluate,
    exact_match,
    examples_of,
    run_dataset,
    score_of,
)

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
