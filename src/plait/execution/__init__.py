"""The execution layer: run traced programs on real resources.

`run` and bound calls (``await module(x)``, ``module.run_sync(x)``) trace a
module once per input shape and hand the graph to the scheduler, which runs
each node as soon as its inputs are ready within the global and per-endpoint
limits. Batches share one ResourceManager and stream results if asked.
"""

from plait.execution.batch import BatchResult, BatchStream
from plait.execution.batch_api import BatchJob
from plait.execution.llm_call import generate
from plait.execution.run import run, run_sync
from plait.execution.settings import ExecutionSettings

__all__ = [
    "BatchJob",
    "BatchResult",
    "BatchStream",
    "ExecutionSettings",
    "generate",
    "run",
    "run_sync",
]
