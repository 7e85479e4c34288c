"""Program modules built on signatures: Predict, ChainOfThought, and the modules that wrap them.

Every module here is a `plait.Module` whose ``forward`` is ``async def``: it
runs as one node with real values and sends its LLM calls through the run's
resources, so it composes with traced programs, shares their limits, and
records a trace of every call (`Module.traces`).
"""

from plait.modules.chain_of_thought import ChainOfThought
from plait.modules.predict import Predict, history_messages
from plait.modules.prediction import Prediction
from plait.modules.traces import TraceRecord, record_trace

__all__ = [
    "BestOfN",
    "ChainOfThought",
    "MultiChainComparison",
    "Predict",
    "Prediction",
    "ReAct",
    "Refine",
    "Requirement",
    "Requirements",
    "TraceRecord",
    "ValidateAndRepair",
    "Validated",
    "history_messages",
    "record_trace",
]

# --- modules added by the tools/agents work (ReAct, BestOfN, Refine, MultiChainComparison,
# --- Requirements): import them here and add their names to __all__ (kept sorted).
from plait.modules.best_of_n import BestOfN
from plait.modules.multi_chain import MultiChainComparison
from plait.modules.react import ReAct
from plait.modules.refine import Refine
from plait.modules.requirements import Requirement, Requirements, ValidateAndRepair, Validated
