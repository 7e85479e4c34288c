"""The execution layer: run traced programs on real resources.

`run` and bound calls (``await module(x)``, ``module.run_sync(x)``) trace a
module once per input shape and hand the graph to the scheduler, which runs
each node as soon as its inputs are ready within the global and per-endpoint
limits. Batches share one ResourceManager and stream results if asked.

`BatchJob` (provider Batch APIs) loads on first use: a program's first call
does not need it.
"""

from typing import TYPE_CHECKING

from plait import _lazy
from plait.execution.batch import BatchResult, BatchStream
from plait.execution.llm_call import generate
from plait.execution.run import run, run_sync
from plait.execution.settings import ExecutionSettings

if TYPE_CHECKING:
    from plait.execution.batch_api import BatchJob

_HOMES = {"BatchJob": "plait.execution.batch_api"}

__all__ = [
    "BatchJob",
    "BatchResult",
    "BatchStream",
    "ExecutionSettings",
    "generate",
    "run",
    "run_sync",
]

__getattr__, __dir__ = _lazy.exports("plait.execution", _HOMES, globals(), __all__)
