"""Executor: what one top-level call (or one batch) shares while its graphs run.

Every graph node of every batch item runs through the same `Executor`: one
`ResourceManager` (so endpoint limits hold across the whole batch), one
global limit on LLM calls in flight, one timeout per attempt, and whether
the run records tapes. The scheduler decides *when* a node runs; the
executor is *what it runs on*.

The executor is also what ``async def forward`` leaves see (the context's
running executor): inside them, calling a module returns a coroutine that
runs it on these same resources.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from plait import _context
from plait.backends.types import Request, Response
from plait.execution.graph_cache import trace_cached
from plait.execution.llm_call import USE_CACHE, call_llm
from plait.execution.observe import observed
from plait.execution.scheduler import NODE_SCOPE, execute_graph, scoped
from plait.execution.slots import CallSlots, Rank
from plait.execution.sync_bridge import remember_for_shutdown
from plait.execution.tape import INNER_CALLS, Tape, attach_tape, new_tape_id
from plait.module import LLMInference, Module, call_forward, is_async_module
from plait.tracing import InferenceGraph, is_leaf_module
from plait.values import Value, ValueKind, unwrap, valueify

__all__ = ["RECORD", "Executor"]

_TURNS_TO_SEND = 3
"""Turns of the event loop a call needs from taking its slot to writing its request (the
HTTP client writes the body in a task of its own, one turn later), with one to spare."""

RECORD: contextvars.ContextVar[bool] = contextvars.ContextVar("plait_record", default=False)
"""Set by ``run(..., record=True)``: the call keeps tapes as in training mode."""


class Executor:
    """Shared state of one execution: resources, the LLM-call limit, timeouts.

    Args:
        manager: the ResourceManager every call goes through.
        max_concurrent: most LLM calls in flight at once for this execution.
        timeout: seconds per LLM call, or None for each endpoint's own.
    """

    def __init__(
        self,
        manager: Any,
        max_concurrent: int = 100,
        timeout: float | None = None,
        training: bool = False,
    ):
        self.manager = manager
        self.timeout = timeout
        self.training = training
        """Record tapes: outputs carry ``_tape_ids`` and async leaves note their inner calls."""
        self.max_concurrent = max_concurrent
        self._slots = CallSlots(max_concurrent)
        self._params: dict[int, dict[str, Any]] = {}
        self._leaf_roots: dict[int, bool] = {}

    @classmethod
    def for_call(cls, module: Module, resources: Any, options: dict[str, Any]) -> Executor:
        """Returns the executor of one call or batch of ``module`` with its resolved options.

        The manager is the one shared by equal configurations on this loop; it
        records tapes when the module is in training mode or the call records.
        """
        # import time: `import plait.execution` stays without the resource layer
        from plait.resources import ResourceManager

        manager = ResourceManager.shared(resources)
        remember_for_shutdown(manager)
        training = module.training or RECORD.get()
        return cls(manager, options["max_concurrent"], options["timeout"], training)

    async def run_program(
        self,
        graph: InferenceGraph,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        index: int | None = None,
    ) -> Any:
        """Runs a program's graph as one module call for the callbacks; returns its output.

        The output is in the structure ``forward`` returned; in training mode it
        is a Value carrying the tape of this run (``index`` is the batch item's
        position, None for a single call). A program that is itself a leaf (an
        LLMInference, a Predict) is its graph's only node, which is observed as
        that call already.
        """
        module = graph.root

        def execute() -> Any:
            return execute_graph(graph, self, args, kwargs, index)

        if self._root_is_leaf(graph):
            output, results = await execute()
        else:
            output, results = await observed(
                module, args, kwargs, execute, reported=lambda done: done[0]
            )
        return self._taped(graph, output, results, index)

    def _taped(
        self, graph: InferenceGraph, output: Any, results: dict[str, Any], index: int | None
    ) -> Any:
        """Returns ``output`` as it is, or — in training mode — as a Value carrying its tape."""
        if not self.training:
            return output
        tape = Tape(
            new_tape_id(),
            graph,
            results,
            self.parameter_table(graph),
            index=index,
            manager=self.manager,
        )
        kind = ValueKind.TEXT if isinstance(output, str) else ValueKind.STRUCTURED
        value = output if isinstance(output, Value) else valueify(output, kind=kind)
        attach_tape(value, tape)
        return value

    def _root_is_leaf(self, graph: InferenceGraph) -> bool:
        """Whether the graph's program is itself a leaf, found once per graph: the walk of
        its modules would otherwise run for every item of a batch."""
        leaf = self._leaf_roots.get(id(graph))
        if leaf is None:
            leaf = self._leaf_roots[id(graph)] = is_leaf_module(graph.root)
        return leaf

    def parameter_table(self, graph: InferenceGraph) -> dict[str, Any]:
        """Returns ``param:<name>`` → Parameter for the graph's root module."""
        table = self._params.get(id(graph))
        if table is None:
            table = {f"param:{name}": p for name, p in graph.root.named_parameters()}
            self._params[id(graph)] = table
        return table

    async def call_llm(
        self,
        module: LLMInference,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        path: str = "",
        rank: Rank | None = None,
    ) -> Value:
        """Makes one LLM call within the global limit (endpoint limits apply inside).

        ``path`` names the call in streamed events (the node's module path);
        ``rank`` orders it among calls waiting for a slot (see `CallSlots`; by
        default, its item's, with no work after it).
        """
        if kwargs:
            prompt = kwargs.get("prompt", next(iter(kwargs.values())))
        elif args:
            prompt = args[0]
        else:
            raise TypeError(f"LLMInference (alias {module.alias!r}) was called without a prompt")
        async with self._slot(rank):
            value = await call_llm(module, prompt, self.manager, self.timeout, path)
        calls = INNER_CALLS.get()
        if calls is not None:
            path = scoped(module._name or type(module).__name__)
            calls.append(
                {
                    "module": module,
                    "path": path,
                    "args": (prompt,),
                    "kwargs": {},
                    "output": value.payload,
                }
            )
        return value

    async def complete(
        self,
        alias: str,
        request: Request,
        accept: Callable[[Response], bool] | None = None,
        on_text: Any = None,
    ) -> Response:
        """Makes one raw call within the global limit; used by `generate` in async leaves.

        The executor's timeout and the context's rollout id fill in what the
        request leaves unset; ``accept`` and ``on_text`` go to `ResourceManager.complete`.
        """
        rollout = _context.ROLLOUT.get()
        if request.timeout is None and self.timeout is not None:
            request = replace(request, timeout=self.timeout)
        if request.rollout_id is None and rollout is not None:
            request = replace(request, rollout_id=rollout)
        async with self._slot(None):
            response = await self.manager.complete(
                alias, request, cache=USE_CACHE.get(), accept=accept, on_text=on_text
            )
        calls = INNER_CALLS.get()
        if calls is not None:
            calls.append(
                {"module": None, "path": scoped(alias), "request": request, "output": response.text}
            )
        return response

    async def slots_filled(self) -> None:
        """Returns once every LLM-call slot of this run has been taken, and the calls that
        took them have had their turns of the event loop to send their requests: a batch
        then starts its second set of items, whose setup must not delay the first sends."""
        await self._slots.first_filled()
        for _ in range(_TURNS_TO_SEND):
            await asyncio.sleep(0)

    def last_item_admitted(self) -> None:
        """Tells the LLM-call slots that the batch is near its end: no item left to admit and
        no more unfinished than slots (see `CallSlots`)."""
        self._slots.last_admitted()

    def _slot(self, rank: Rank | None) -> Any:
        """Returns one of the run's LLM-call slots to hold for one call at ``rank`` (None:
        the running item's, with no work after it); timed when profiling: waiting for them is
        waiting for a slot, like waiting for an endpoint's."""
        if rank is None:
            rank = (NODE_SCOPE.get()[1] or 0, 1)
        slot = self._slots.hold(rank)
        profiler = _context.PROFILE.get()
        return slot if profiler is None else profiler.timed_slot(slot)

    async def run_module(
        self, module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Runs any module on real inputs with these resources and returns raw output.

        Called inside an ``async def forward`` leaf: the child is named (for
        profiling and errors) by its path under that leaf, e.g. ``triage.classify``.
        """
        path = scoped(module._name or type(module).__name__)
        return await observed(
            module, args, kwargs, lambda: self._run_child(module, args, kwargs), path
        )

    async def _run_child(
        self, module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        path = scoped(module._name or type(module).__name__)
        if isinstance(module, LLMInference):
            return (await self._llm_value(module, args, kwargs, path)).payload
        scope = NODE_SCOPE.set((path, NODE_SCOPE.get()[1]))
        try:
            if is_async_module(module):
                return unwrap(await call_forward(module, args, kwargs))
            graph = trace_cached(module, args, kwargs)
            output, _ = await execute_graph(graph, self, args, kwargs)
            return output
        finally:
            NODE_SCOPE.reset(scope)

    async def run_llm(
        self, module: LLMInference, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Value:
        """Makes one LLM call inside an ``async def forward`` and returns its whole Value.

        Like `run_module`, but the reply keeps its meta (model, tokens, cost,
        latency): what ``await F.chat_complete(...)`` returns. Callbacks are
        told the reply's payload, as for any module call.
        """
        path = scoped(module._name or type(module).__name__)
        return await observed(
            module,
            args,
            kwargs,
            lambda: self._llm_value(module, args, kwargs, path),
            path,
            reported=lambda value: value.payload,
        )

    async def _llm_value(
        self, module: LLMInference, args: tuple[Any, ...], kwargs: dict[str, Any], path: str
    ) -> Value:
        profiler = _context.PROFILE.get()
        if profiler is None:
            return await self.call_llm(module, args, kwargs, path)
        clock = profiler.start_node()
        try:
            value = await self.call_llm(module, args, kwargs, path)
        finally:
            clock.stop()
        profiler.record(path, path, NODE_SCOPE.get()[1], clock, value.meta)
        return value

    def call_module(self, module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Handles ``child(x)`` inside an ``async def forward``.

        Modules that may call an LLM return a coroutine to await; plain-Python
        modules (no LLM below them) run at once and return their result.
        """
        plain = not isinstance(module, LLMInference) and not is_async_module(module)
        if plain and is_leaf_module(module):
            return module.forward(*args, **kwargs)
        return self.run_module(module, args, kwargs)
