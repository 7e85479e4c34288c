"""ModuleState: what optimizers record on a module (``module.state``).

Its own small module so that ``import plait`` does not define a dataclass
(which loads `dataclasses` and, with it, `inspect`): it loads when a module's
``state`` is first read, which an optimizer does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from plait.module import _pandas

__all__ = ["ModuleState"]


@dataclasses.dataclass
class ModuleState:
    """What optimizers record on a module (its ``state``): trials and the best found.

    Plain JSON-compatible data, so it can be saved and inspected; the
    trials table is `trials_table` (a pandas DataFrame when pandas is installed).
    """

    trials: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """One record per candidate tried: number, params, score, selection score, calls,
    cost, seconds, and the optimizer that tried it."""
    best_score: float | None = None
    """Validation score of what was applied."""
    best_params: dict[str, Any] | None = None
    """What distinguishes the applied candidate (settings, or parameter values)."""
    best_trial: int | None = None
    """Number of the applied trial (0: the module as it was)."""
    compiled: bool = False
    """Whether an optimizer has changed the module (a search that kept it leaves this)."""
    optimizer: str | None = None
    """Name of the last optimizer that ran."""

    def trials_table(self) -> Any:
        """Returns the trials as a pandas DataFrame, or as a list of dicts without pandas."""
        rows = [{k: v for k, v in trial.items() if not k.startswith("_")} for trial in self.trials]
        pandas = _pandas()
        return rows if pandas is None else pandas.DataFrame(rows)
