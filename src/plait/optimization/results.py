"""What an evaluation returns: a row per example, and the results over them.

`ExampleRow` (input, output, target, score, error, usage), `RunResult` (`run_dataset`'s:
outputs alone) and `EvaluationResult` (`evaluate`'s: a float, the mean score, with its
rows, a bootstrap confidence interval, usage, and ``save``/``to_frame``). See
`plait.optimization.evaluation`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from plait import _files
from plait._jsondata import as_json_data
from plait.backends.types import HoldsUsage, Usage

__all__ = ["EvaluationResult", "ExampleRow", "RunResult"]


@dataclass
class ExampleRow(HoldsUsage):
    """One example of a dataset run: what went in, what came out, what it cost.

    Its tokens, cost and cache hits are its ``usage`` (``row.input_tokens``,
    ``row.cost``, ``row.cached`` read it); a row as data (`as_record`, a saved
    file, `to_frame`) has them as columns of their own, as a table wants them.
    """

    index: int
    """Position in the dataset."""
    input: Any
    output: Any = None
    """The program's output (None when it failed)."""
    target: Any = None
    score: float | None = None
    """The metric's score (0 for a failed example; None without a metric)."""
    feedback: str | None = None
    """The metric's words, when it returned a `Feedback`."""
    error: str | None = None
    """Why the example failed (type and message), or None."""
    calls: int = 0
    """Model calls the example made (re-asks and inner calls included; cache hits not)."""
    refused: int = 0
    """Calls the run's budget refused: the example was left undone (and scored 0)."""
    usage: Usage = field(default_factory=Usage)
    """Tokens and cost of its calls; ``usage.cached``: calls answered from a response cache."""

    def as_dict(self) -> dict[str, Any]:
        """Returns the row as a plain dict, its usage as the columns ``cached``,
        ``input_tokens``, ``output_tokens`` and ``cost`` (the columns of a saved row)."""
        row = asdict(self)
        usage, refused = row.pop("usage"), row.pop("refused")
        return {
            **row,
            "cached": usage["cached"],
            "refused": refused,
            "input_tokens": usage["input_tokens"],
            "output_tokens": usage["output_tokens"],
            "cost": usage["cost"],
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "usage" not in state:  # pickled by a plait before `usage`: its fields one by one
            state = dict(state)
            state["usage"] = Usage(
                state.pop("input_tokens", 0),
                state.pop("output_tokens", 0),
                state.pop("cost", 0.0),
                state.pop("cached", 0),
            )
        self.__dict__.update(state)

    def as_record(self) -> dict[str, Any]:
        """Returns the row as JSON-compatible data (models as dicts, other objects as text)."""
        return as_json_data(self.as_dict())


_COLUMNS = tuple(ExampleRow(0, None).as_dict())
"""A row's columns, in order (a saved file's and `to_frame`'s)."""


class _Rows:
    """Totals, tables and files over `ExampleRow`s (shared by both result types)."""

    rows: list[ExampleRow]

    @property
    def failed(self) -> int:
        """Examples whose run failed."""
        return sum(row.error is not None for row in self.rows)

    @property
    def unevaluated(self) -> int:
        """Examples the run's budget left undone (`stopped_by_budget`)."""
        return sum(row.refused > 0 for row in self.rows)

    @property
    def stopped_by_budget(self) -> bool:
        """Whether the budget (``max_calls``, ``max_tokens``, ``max_cost``) cut the run short."""
        return any(row.refused for row in self.rows)

    @property
    def calls(self) -> int:
        """Model calls made by all examples together."""
        return sum(row.calls for row in self.rows)

    @property
    def input_tokens(self) -> int:
        return sum(row.input_tokens for row in self.rows)

    @property
    def output_tokens(self) -> int:
        return sum(row.output_tokens for row in self.rows)

    @property
    def cost(self) -> float:
        """Dollars spent (0 for the local model and unpriced models)."""
        return sum(row.cost for row in self.rows)

    def __iter__(self) -> Iterator[ExampleRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def to_frame(self) -> Any:
        """Returns the rows as a pandas DataFrame, one row per example.

        Raises:
            ImportError: pandas is not installed.
        """
        try:
            import pandas  # optional extra (plait[pandas])
        except ImportError:
            raise ImportError(
                "to_frame() needs pandas, which is not installed: `pip install pandas`, "
                "or read .rows (a list of ExampleRow)"
            ) from None
        return pandas.DataFrame([row.as_dict() for row in self.rows])

    def save(self, path: str | Path) -> Path:
        """Writes the rows to ``path``: JSON Lines (``.jsonl``) or Parquet (``.parquet``).

        The file is replaced whole (atomically); a symbolic link at ``path`` is
        refused, never written through.

        Raises:
            ValueError: another file suffix.
            ImportError: Parquet without pyarrow installed.
            FileError: ``path`` is a symbolic link or not a regular file, or
                cannot be written.
        """
        path = Path(path)
        if path.suffix == ".jsonl":
            return self.save_jsonl(path)
        if path.suffix == ".parquet":
            return self.save_parquet(path)
        raise ValueError(f"save({str(path)!r}): use a .jsonl or .parquet file name")

    def save_jsonl(self, path: str | Path) -> Path:
        """Writes one JSON object per example; returns the path."""
        path = Path(path)
        with _files.replacing(path) as file:
            for row in self.rows:
                file.write(json.dumps(row.as_record(), ensure_ascii=False) + "\n")
        return path

    def save_parquet(self, path: str | Path) -> Path:
        """Writes the rows as a Parquet table (inputs and outputs as JSON text); returns the path.

        Raises:
            ImportError: pyarrow is not installed.
        """
        try:
            # optional extra (plait[parquet])
            import pyarrow
            import pyarrow.parquet
        except ImportError:
            raise ImportError(
                "save_parquet() needs pyarrow, which is not installed: `pip install pyarrow`, "
                "or save as .jsonl"
            ) from None
        path = Path(path)
        records = [row.as_record() for row in self.rows]
        columns: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
        for record in records:
            for name, values in columns.items():
                value = record[name]
                if name in ("input", "output", "target") and value is not None:
                    value = value if isinstance(value, str) else json.dumps(value)
                values.append(value)
        with _files.replacing(path, binary=True) as file:
            pyarrow.parquet.write_table(pyarrow.table(columns), file)
        return path


class RunResult(_Rows):
    """What `run_dataset` returns: one row per input, no scores."""

    def __init__(self, rows: list[ExampleRow]) -> None:
        self.rows = rows

    @property
    def outputs(self) -> list[Any]:
        """The outputs in input order (None where an example failed)."""
        return [row.output for row in self.rows]

    def __repr__(self) -> str:
        return f"RunResult(n={len(self.rows)}, failed={self.failed}, calls={self.calls})"


class EvaluationResult(_Rows, float):
    """What `evaluate` returns: the mean score, which it *is*, and every example's row.

    It is a float, so code that used the mean keeps working: it compares,
    formats, adds and serialises to JSON as the mean. Everything else is on
    it: ``rows``, ``ci`` (a 95 % percentile-bootstrap confidence interval of
    the mean), totals of calls, tokens and cost, and `save` / `to_frame`.

    Example::

        result = await evaluate(program, dev, exact_match, resources=config)
        print(f"{result:.2f}", result.ci, result.calls)
        best = max(results)          # compares by mean
    """

    rows: list[ExampleRow]

    def __new__(cls, mean: float = 0.0) -> EvaluationResult:
        return super().__new__(cls, mean)

    @classmethod
    def from_rows(cls, rows: list[ExampleRow]) -> EvaluationResult:
        """Returns the result of scored rows (a failed example counts with its score 0)."""
        scores = [row.score or 0.0 for row in rows]
        result = cls(sum(scores) / len(scores) if scores else 0.0)
        result.rows = rows
        return result

    @property
    def mean(self) -> float:
        """The mean score, as a plain float."""
        return float(self)

    @property
    def scores(self) -> list[float]:
        """Each example's score, in dataset order."""
        return [row.score or 0.0 for row in self.rows]

    @property
    def ci(self) -> tuple[float, float]:
        """The 95 % bootstrap confidence interval of the mean (see `confidence_interval`)."""
        cached = self.__dict__.get("_ci")
        if cached is None:
            cached = self.__dict__["_ci"] = self.confidence_interval()
        return cached

    def confidence_interval(
        self, level: float = 0.95, resamples: int = 2000, seed: int = 0
    ) -> tuple[float, float]:
        """Returns a percentile-bootstrap interval of the mean score.

        The examples are resampled with replacement ``resamples`` times
        (reproducibly, from ``seed``); the interval holds the middle ``level``
        share of the resampled means. It says how much the mean could move on
        another dataset of this size drawn the same way, not how good a model is.
        """
        scores = self.scores
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level}")
        if len(scores) < 2:
            return (float(self), float(self))
        rng = random.Random(seed)
        n = len(scores)
        means = sorted(sum(rng.choices(scores, k=n)) / n for _ in range(resamples))
        low = means[int((1 - level) / 2 * (resamples - 1))]
        high = means[int((1 + level) / 2 * (resamples - 1))]
        return (low, high)

    def __repr__(self) -> str:
        low, high = self.ci
        return (
            f"EvaluationResult(mean={float(self):.4g}, ci95=({low:.3g}, {high:.3g}), "
            f"n={len(self.rows)}, failed={self.failed}, calls={self.calls})"
        )

    def __str__(self) -> str:
        return float.__repr__(self)

    def __reduce__(self) -> Any:
        # Rebuilt as the float plus its rows (pickle, copy.deepcopy).
        return (_rebuild, (float(self), self.rows))


def _rebuild(mean: float, rows: list[ExampleRow]) -> EvaluationResult:
    result = EvaluationResult(mean)
    result.rows = rows
    return result
