"""The graph cache: each module is traced once per input shape.

Tracing calls ``forward`` with symbolic Values, which costs as much as the
Python in it; a batch of same-shaped inputs reuses one graph instead.
"""

from __future__ import annotations

import weakref
from typing import Any

from plait.module import Module
from plait.tracing import InferenceGraph, Tracer, input_signature

__all__ = ["trace_cached"]

# module -> {(tree fingerprint, input signature): graph}; weak so modules can be collected.
_GRAPHS: weakref.WeakKeyDictionary[Module, dict[Any, InferenceGraph]] = weakref.WeakKeyDictionary()


def _tree_fingerprint(module: Module) -> tuple[Any, ...]:
    """Returns what, besides the inputs, decides the shape of ``module``'s graph.

    Module identities and their plain settings (numbers, strings, flags that a
    ``forward`` may loop or branch on); parameter *values* are not included,
    because they are read at run time, not baked into the graph.
    """
    parts: list[Any] = []
    for path, sub in module.named_modules():
        settings = tuple(
            (key, value)
            for key, value in vars(sub).items()
            if not key.startswith("_") and isinstance(value, str | int | float | bool | type(None))
        )
        parts.append((path, id(sub), settings, tuple(id(p) for p in sub._parameters.values())))
    return tuple(parts)


def trace_cached(module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> InferenceGraph:
    """Returns the graph of ``module`` for inputs shaped like ``args``, tracing only once."""
    key = (_tree_fingerprint(module), input_signature(args, kwargs))
    graphs = _GRAPHS.setdefault(module, {})
    graph = graphs.get(key)
    if graph is None:
        graph = Tracer().trace(module, *args, **kwargs)
        if len(graphs) >= 32:  # many input shapes: keep the cache bounded
            graphs.pop(next(iter(graphs)))
        graphs[key] = graph
    return graph
