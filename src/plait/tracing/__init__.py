"""The graph layer: trace a module's forward into one flat InferenceGraph."""

from plait.tracing.graph import InferenceGraph, Node, Slot, Template, substitute
from plait.tracing.tracer import Tracer, input_signature, is_leaf_module

__all__ = [
    "InferenceGraph",
    "Node",
    "Slot",
    "Template",
    "Tracer",
    "input_signature",
    "is_leaf_module",
    "substitute",
]
