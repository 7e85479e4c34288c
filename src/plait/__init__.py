"""plait: build, run and train programs made of LLM calls, PyTorch style.

The core (modules, parameters, values) is imported eagerly and is pure
Python; everything else loads on first use so ``import plait`` stays fast:
the learning records (`Feedback`), tracing, and the resource and execution
layers, which pull in asyncio, the HTTP client and provider SDKs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait import _lazy
from plait.containers import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from plait.errors import ExecutionError, PlaitError, TracingError
from plait.module import LLMInference, Module
from plait.parameter import Parameter
from plait.values import Value, ValueKind, ValueRef, collect_refs, unwrap, valueify

if TYPE_CHECKING:
    from plait import settings
    from plait.callbacks import BaseCallback
    from plait.confirmation import (
        ConfirmationRejected,
        ConfirmationRequired,
        ResumeState,
        confirm_first,
    )
    from plait.execution import BatchResult, ExecutionSettings
    from plait.execution.run import run
    from plait.feedback import BackwardContext, BackwardResult, Feedback
    from plait.history import History
    from plait.media import Audio, File, Image
    from plait.modules import (
        BestOfN,
        ChainOfThought,
        MultiChainComparison,
        Predict,
        Prediction,
        ReAct,
        Refine,
        Requirement,
        ValidateAndRepair,
    )
    from plait.modules.traces import get_traces
    from plait.optimization import (
        CompositeLoss,
        HumanFeedbackLoss,
        LLMJudge,
        LLMPreferenceLoss,
        LLMRankingLoss,
        LLMRubricLoss,
        Loss,
        SFAOptimizer,
        TextGradOptimizer,
        Trainer,
        TrainingStep,
        VerifierLoss,
    )
    from plait.optimization.costs import CostEstimate, estimate
    from plait.optimization.evaluation import EvaluationResult, evaluate, run_dataset
    from plait.optimization.metrics import (
        metric_contains,
        metric_exact_match,
        metric_f1,
        metric_field_match,
    )
    from plait.porting import signature
    from plait.resources import ResourceConfig, ResourceManager, register_provider
    from plait.signatures import InputField, OutputField, Signature, make_signature
    from plait.streaming import (
        OutputStreamChunk,
        StreamEvent,
        StreamRestart,
        ThoughtStreamChunk,
        ToolCallEvent,
        ToolResultEvent,
        emit_event,
    )
    from plait.tools import Tool, tool

__version__ = "0.1.0"

# name -> module that defines it; imported when first asked for.
_LAZY = {
    "BackwardContext": "plait.feedback",
    "BackwardResult": "plait.feedback",
    "Feedback": "plait.feedback",
    "BatchResult": "plait.execution",
    "ExecutionSettings": "plait.execution",
    "run": "plait.execution",
    "ResourceConfig": "plait.resources",
    "ResourceManager": "plait.resources",
    "History": "plait.history",
    "Audio": "plait.media",
    "File": "plait.media",
    "Image": "plait.media",
    "Tool": "plait.tools",
    "tool": "plait.tools",
    "BestOfN": "plait.modules",
    "ChainOfThought": "plait.modules",
    "Predict": "plait.modules",
    "Prediction": "plait.modules",
    "InputField": "plait.signatures",
    "OutputField": "plait.signatures",
    "Signature": "plait.signatures",
    "CompositeLoss": "plait.optimization",
    "HumanFeedbackLoss": "plait.optimization",
    "LLMJudge": "plait.optimization",
    "LLMPreferenceLoss": "plait.optimization",
    "LLMRankingLoss": "plait.optimization",
    "LLMRubricLoss": "plait.optimization",
    "Loss": "plait.optimization",
    "TrainingStep": "plait.optimization",
    "VerifierLoss": "plait.optimization",
    "SFAOptimizer": "plait.optimization",
    "TextGradOptimizer": "plait.optimization",
    "Trainer": "plait.optimization",
    "evaluate": "plait.optimization.evaluation",
    "estimate": "plait.optimization.costs",
    "CostEstimate": "plait.optimization.costs",
    "EvaluationResult": "plait.optimization.evaluation",
    "run_dataset": "plait.optimization.evaluation",
    "ReAct": "plait.modules",
    "MultiChainComparison": "plait.modules",
    "Refine": "plait.modules",
    "Requirement": "plait.modules",
    "ValidateAndRepair": "plait.modules",
    "BaseCallback": "plait.callbacks",
    "ConfirmationRejected": "plait.confirmation",
    "ConfirmationRequired": "plait.confirmation",
    "ResumeState": "plait.confirmation",
    "confirm_first": "plait.confirmation",
    "OutputStreamChunk": "plait.streaming",
    "StreamEvent": "plait.streaming",
    "StreamRestart": "plait.streaming",
    "ThoughtStreamChunk": "plait.streaming",
    "ToolCallEvent": "plait.streaming",
    "ToolResultEvent": "plait.streaming",
    "emit_event": "plait.streaming",
    "register_provider": "plait.resources",
    "make_signature": "plait.signatures",
    "signature": "plait.porting",
    "get_traces": "plait.modules.traces",
    "metric_contains": "plait.optimization.metrics",
    "metric_exact_match": "plait.optimization.metrics",
    "metric_f1": "plait.optimization.metrics",
    "metric_field_match": "plait.optimization.metrics",
}

__all__ = [
    "Audio",
    "BackwardContext",
    "BackwardResult",
    "BaseCallback",
    "BatchResult",
    "BestOfN",
    "ChainOfThought",
    "CompositeLoss",
    "ConfirmationRejected",
    "ConfirmationRequired",
    "CostEstimate",
    "EvaluationResult",
    "ExecutionError",
    "ExecutionSettings",
    "Feedback",
    "File",
    "History",
    "HumanFeedbackLoss",
    "Image",
    "InputField",
    "LLMInference",
    "LLMJudge",
    "LLMPreferenceLoss",
    "LLMRankingLoss",
    "LLMRubricLoss",
    "Loss",
    "Module",
    "ModuleDict",
    "ModuleList",
    "MultiChainComparison",
    "OutputField",
    "OutputStreamChunk",
    "Parameter",
    "ParameterDict",
    "ParameterList",
    "PlaitError",
    "Predict",
    "Prediction",
    "ReAct",
    "Refine",
    "Requirement",
    "ResourceConfig",
    "ResourceManager",
    "ResumeState",
    "SFAOptimizer",
    "Sequential",
    "Signature",
    "StreamEvent",
    "StreamRestart",
    "TextGradOptimizer",
    "ThoughtStreamChunk",
    "Tool",
    "ToolCallEvent",
    "ToolResultEvent",
    "TracingError",
    "Trainer",
    "TrainingStep",
    "ValidateAndRepair",
    "Value",
    "ValueKind",
    "ValueRef",
    "VerifierLoss",
    "collect_refs",
    "confirm_first",
    "emit_event",
    "estimate",
    "evaluate",
    "get_traces",
    "make_signature",
    "metric_contains",
    "metric_exact_match",
    "metric_f1",
    "metric_field_match",
    "register_provider",
    "run",
    "run_dataset",
    "settings",
    "signature",
    "tool",
    "unwrap",
    "valueify",
]


__getattr__, __dir__ = _lazy.exports(
    "plait", _LAZY, globals(), __all__, modules={"settings": "plait.settings"}
)
