"""plait: build, run and train programs made of LLM calls, PyTorch style.

The core (modules, parameters, values, tracing) is imported eagerly and is
pure Python; the resource and execution layers, which pull in aiohttp and
provider SDKs, load on first use so ``import plait`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from plait.containers import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from plait.errors import ExecutionError, PlaitError, TracingError
from plait.feedback import BackwardContext, BackwardResult, Feedback
from plait.module import LLMInference, Module
from plait.parameter import Parameter
from plait.values import Value, ValueKind, ValueRef, collect_refs, unwrap, valueify

if TYPE_CHECKING:
    from plait.evaluation import EvaluationResult, evaluate, run_dataset
    from plait.execution import BatchResult, ExecutionSettings, run
    from plait.history import History
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
    from plait.resources import ResourceConfig, ResourceManager
    from plait.signatures import InputField, OutputField, Signature
    from plait.tools import Tool, tool

__version__ = "0.1.0"

# name -> module that defines it; imported when first asked for.
_LAZY = {
    "BatchResult": "plait.execution",
    "ExecutionSettings": "plait.execution",
    "run": "plait.execution",
    "ResourceConfig": "plait.resources",
    "ResourceManager": "plait.resources",
    "History": "plait.history",
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
    "evaluate": "plait.evaluation",
    "EvaluationResult": "plait.evaluation",
    "run_dataset": "plait.evaluation",
    "ReAct": "plait.modules",
    "MultiChainComparison": "plait.modules",
    "Refine": "plait.modules",
    "Requirement": "plait.modules",
    "ValidateAndRepair": "plait.modules",
}

__all__ = [
    "BackwardContext",
    "BackwardResult",
    "BatchResult",
    "BestOfN",
    "ChainOfThought",
    "CompositeLoss",
    "EvaluationResult",
    "ExecutionError",
    "ExecutionSettings",
    "Feedback",
    "History",
    "HumanFeedbackLoss",
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
    "SFAOptimizer",
    "Sequential",
    "Signature",
    "TextGradOptimizer",
    "Tool",
    "TracingError",
    "Trainer",
    "TrainingStep",
    "ValidateAndRepair",
    "Value",
    "ValueKind",
    "ValueRef",
    "VerifierLoss",
    "collect_refs",
    "evaluate",
    "run",
    "run_dataset",
    "tool",
    "unwrap",
    "valueify",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'plait' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
