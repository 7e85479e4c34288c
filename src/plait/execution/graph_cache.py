"""The graph cache: each module is traced once per input shape.

Tracing calls ``forward`` with symbolic Values, which costs as much as the
Python in it; a batch of same-shaped inputs reuses one graph instead.
"""

from __future__ import annotations

import weakref
from typing import Any

from plait.module import Module
from plait.tracing import InferenceGraph, Tracer, input_signature

__all__ = ["RunGraphs", "trace_cached"]

_MAX_SHAPES = 32
"""Graphs kept per module, and per call or batch: inputs of many shapes stay bounded."""

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
        _make_room(graphs)
        graphs[key] = graph
    return graph


class RunGraphs:
    """The graphs of one call or batch: each input shape looked up in the cache once.

    The key of the module-wide cache holds the module's plain settings, which a
    ``forward`` may change while it is traced; a call or batch therefore keeps
    the graph it started with for each input shape, and its checkpoint, its
    items and its run report all use that same graph.
    """

    def __init__(self, module: Module) -> None:
        self.module = module
        self.first: InferenceGraph | None = None
        """The first graph looked up (the first input's), which a run report draws."""
        self._graphs: dict[Any, InferenceGraph] = {}

    def graph_for(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> InferenceGraph:
        """Returns the graph for inputs shaped like ``args`` and ``kwargs``."""
        shape = input_signature(args, kwargs)
        graph = self._graphs.get(shape)
        if graph is None:
            graph = trace_cached(self.module, args, kwargs)
            _make_room(self._graphs)
            self._graphs[shape] = graph
            if self.first is None:
                self.first = graph
        return graph


def _make_room(graphs: dict[Any, InferenceGraph]) -> None:
    """Drops the oldest graph when ``graphs`` is full."""
    if len(graphs) >= _MAX_SHAPES:
        graphs.pop(next(iter(graphs)))
