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
from plait.module import LLMInference, Module
from plait.parameter import Parameter
from plait.values import Value, ValueKind, ValueRef, collect_refs, unwrap, valueify

if TYPE_CHECKING:
    from plait.execution import BatchResult, ExecutionSettings, run
    from plait.resources import ResourceConfig, ResourceManager

__version__ = "0.1.0"

# name -> module that defines it; imported when first asked for.
_LAZY = {
    "BatchResult": "plait.execution",
    "ExecutionSettings": "plait.execution",
    "run": "plait.execution",
    "ResourceConfig": "plait.resources",
    "ResourceManager": "plait.resources",
}

__all__ = [
    "BatchResult",
    "ExecutionError",
    "ExecutionSettings",
    "LLMInference",
    "Module",
    "ModuleDict",
    "ModuleList",
    "Parameter",
    "ParameterDict",
    "ParameterList",
    "PlaitError",
    "ResourceConfig",
    "ResourceManager",
    "Sequential",
    "TracingError",
    "Value",
    "ValueKind",
    "ValueRef",
    "collect_refs",
    "run",
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
