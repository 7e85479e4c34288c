"""The scheduler: runs one traced graph for one input, each node as soon as it can.

A node starts the moment its last dependency finishes. Cheap nodes
(functional ops and plain-Python leaves) run inline; LLM calls and
``async def forward`` leaves run as tasks, except when a node is the only
runnable one, which is then awaited directly: a chain of calls creates no
tasks at all. Completions arrive through a queue, so each one costs O(1)
however wide the graph is.

A retried call is retried *inside* its node by the resource layer, so the
bookkeeping of dependents never changes and fan-in graphs cannot deadlock.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from typing import TYPE_CHECKING, Any

from plait import _context
from plait.errors import (
    ConfirmationRejected,
    ExecutionInterrupt,
    ResumeRefusedError,
    locate,
)
from plait.execution.binding import bind_method
from plait.execution.observe import observed, observed_sync
from plait.execution.tape import INNER_CALLS
from plait.module import LLMInference, call_forward, is_async_module
from plait.tracing.graph import InferenceGraph, Node, substitute
from plait.values import Value, ValueKind, _infer_kind, first_error, unwrap

if TYPE_CHECKING:
    from plait.execution.executor import Executor

__all__ = ["NODE_SCOPE", "execute_graph", "scoped"]

NODE_SCOPE = _context.NODE_SCOPE

CALLERS_OWN = (ExecutionInterrupt, ResumeRefusedError, ConfirmationRejected)
"""Exceptions that reach the caller as they are, not located in a node: a pause, its
``resume_state=`` refused, a call the person declined. None is a node failing."""


def scoped(path: str) -> str:
    """Returns ``path`` under the current async leaf's path (unchanged at the top level)."""
    prefix = NODE_SCOPE.get()[0]
    if not prefix:
        return path
    return f"{prefix}.{path}" if path else prefix


async def execute_graph(
    graph: InferenceGraph,
    executor: Executor,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    index: int | None = None,
) -> tuple[Any, dict[str, Value]]:
    """Runs ``graph`` on one input.

    Returns:
        The output in the structure ``forward`` returned (raw payloads), and
        every node's result Value by id (for training and inspection).

    Raises:
        Exception: what a node failed with, of its own class, located (`errors.locate`)
            at the node, its module path and ``index``.
    """
    results = _bind_inputs(graph, args, kwargs)
    params = executor.parameter_table(graph)
    if index is None:  # a graph run inside an async leaf belongs to that leaf's item
        index = NODE_SCOPE.get()[1]
    run = _GraphRun(graph, executor, results, params, index)
    await run.run()
    output_errors = [r for r in graph.output_ids if r in results and results[r].is_error]
    if output_errors:
        failed = results[output_errors[0]]
        raise run.failure(graph.nodes[output_errors[0]], _error_cause(failed))
    try:
        return substitute(graph.output, run.payload), results
    except Exception as exc:
        where = "" if index is None else f" on input {index}"
        locate(
            exc,
            f"the output of {type(graph.root).__name__} could not be rendered{where}",
            input_index=index,
        )
        raise


def _bind_inputs(
    graph: InferenceGraph, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Value]:
    if not graph.input_ids:
        return {}
    forward = graph.root.forward
    function = getattr(forward, "__func__", None)
    if function is not None:  # a method: its signature is read once per function, not per call
        arguments = bind_method(function, graph.root, args, kwargs)
    else:
        arguments = inspect.signature(forward).bind(*args, **kwargs).arguments
    results: dict[str, Value] = {}
    for node_id in graph.input_ids:
        path = graph.nodes[node_id].input_path
        value = arguments[path[0]]
        for key in path[1:]:
            value = value[key]
        if isinstance(value, Value):
            results[node_id] = Value(value.kind, value.payload, ref=node_id, meta=value.meta)
        else:
            results[node_id] = Value(_infer_kind(value), value, ref=node_id)
    return results


def _error_cause(value: Value) -> BaseException:
    payload = value.payload
    return payload if isinstance(payload, BaseException) else RuntimeError(str(payload))


class _GraphRun:
    """Mutable state of one graph execution."""

    def __init__(
        self,
        graph: InferenceGraph,
        executor: Executor,
        results: dict[str, Value],
        params: dict[str, Any],
        index: int | None,
    ) -> None:
        self.graph = graph
        self.executor = executor
        self.results = results
        self.params = params
        self.index = index
        self.heights = graph.heights
        self.waiting = dict(graph.unbound_dependencies)  # the inputs are bound in ``results``

    def payload(self, ref: str) -> Any:
        """Returns the raw data of a node result or parameter (lookup for `substitute`)."""
        value = self.results.get(ref)
        if value is not None:
            return value.payload
        return self.params[ref].value

    def value(self, ref: str) -> Any:
        value = self.results.get(ref)
        return value if value is not None else self.params[ref].value

    async def run(self) -> None:
        ready: deque[Node] = deque(
            self.graph.nodes[node_id] for node_id, count in self.waiting.items() if count == 0
        )
        running: set[asyncio.Task[Value]] = set()
        finished: asyncio.Queue[asyncio.Task[Value]] | None = None  # made for the first task
        try:
            while ready or running:
                while ready:
                    node = ready.popleft()
                    if self._is_inline(node):
                        self._complete(node, self._run_inline(node), ready)
                    elif not ready and not running:
                        self._complete(node, await self._run_awaited(node), ready)
                    else:
                        if finished is None:
                            finished = asyncio.Queue()
                        task = asyncio.create_task(self._run_awaited(node))
                        task.plait_node = node  # type: ignore[attr-defined]
                        task.add_done_callback(finished.put_nowait)
                        running.add(task)
                if running:
                    assert finished is not None  # made with the first task
                    task = await finished.get()
                    running.discard(task)
                    self._complete(task.plait_node, task.result(), ready)  # type: ignore[attr-defined]
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    def _complete(self, node: Node, value: Value, ready: deque[Node]) -> None:
        self.results[node.id] = value
        for dependent in self.graph.dependents[node.id]:
            self.waiting[dependent] -= 1
            if self.waiting[dependent] == 0:
                ready.append(self.graph.nodes[dependent])

    # ------------------------------------------------------------- one node
    def _is_inline(self, node: Node) -> bool:
        if node.kind == "op":
            return True
        module = node.module
        return not isinstance(module, LLMInference) and not is_async_module(module)

    def _run_inline(self, node: Node) -> Value:
        if node.kind == "op":
            return self._run_op(node)
        self._check_inputs(node)
        call_args, call_kwargs = self._resolve(node)
        token = _context.RUN.set(None)  # plain-Python leaves call children directly
        module = node.module
        try:
            output = observed_sync(
                module,
                call_args,
                call_kwargs,
                lambda: module.forward(*call_args, **call_kwargs),
                scoped(node.module_path or node.id),
            )
        except CALLERS_OWN:
            raise
        except Exception as exc:
            self.failure(node, exc)
            raise
        finally:
            _context.RUN.reset(token)
        return _as_value(output, node.id)

    def _run_op(self, node: Node) -> Value:
        if getattr(node.op, "handles_errors", False):
            call_args = substitute(node.args, self.value)
            call_kwargs = substitute(node.kwargs, self.value)
        else:
            failed = next((d for d in node.dependencies if self.results[d].is_error), None)
            if failed is not None:
                upstream = self.results[failed]
                meta = {**upstream.meta, "skipped": [*upstream.meta.get("skipped", []), node.id]}
                return Value(ValueKind.ERROR, upstream.payload, ref=node.id, meta=meta)
            call_args, call_kwargs = self._resolve(node)
        result: Value = node.op(*call_args, **call_kwargs)  # type: ignore[misc]
        meta = result.meta
        if result.is_error:
            meta = {**meta, "node_id": node.id, "sources": list(node.dependencies)}
        return Value(result.kind, result.payload, ref=node.id, meta=meta)

    async def _run_awaited(self, node: Node) -> Value:
        self._check_inputs(node)
        call_args, call_kwargs = self._resolve(node)
        profiler = _context.PROFILE.get()
        clock = profiler.start_node() if profiler is not None else None
        try:
            if isinstance(node.module, LLMInference):
                value = await observed(
                    node.module,
                    call_args,
                    call_kwargs,
                    lambda: self.executor.call_llm(
                        node.module,
                        call_args,
                        call_kwargs,
                        scoped(node.module_path or node.id),
                        (self.index or 0, self.heights[node.id]),
                    ),
                    scoped(node.module_path or node.id),
                )
            else:
                token = _context.RUN.set(self.executor)
                # The root module's path is "": its children keep their own paths.
                scope = NODE_SCOPE.set((scoped(node.module_path), self.index))
                enclosing = INNER_CALLS.get()
                calls: list[dict[str, Any]] | None = [] if self.executor.training else None
                noting = INNER_CALLS.set(calls)
                try:
                    output = await observed(
                        node.module,
                        call_args,
                        call_kwargs,
                        lambda: call_forward(node.module, call_args, call_kwargs),
                        scoped(node.module_path or node.id),
                    )
                    value = _as_value(output, None)
                finally:
                    INNER_CALLS.reset(noting)
                    NODE_SCOPE.reset(scope)
                    _context.RUN.reset(token)
                if calls:
                    value.meta["_inner_calls"] = calls
                    if enclosing is not None:
                        # This graph runs inside another async leaf, which discards
                        # its results: that leaf's backward must replay these calls.
                        enclosing.extend(calls)
        except (asyncio.CancelledError, *CALLERS_OWN):
            raise
        except Exception as exc:
            self.failure(node, exc)
            raise
        finally:
            if clock is not None:
                clock.stop()
        value.ref = node.id
        if profiler is not None:
            path = node.module_path or node.id
            profiler.record(scoped(node.id), scoped(path), self.index, clock, value.meta)
        return value

    def _resolve(self, node: Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Returns the node's arguments with results filled in (f-strings, JSON rendered).

        Raises:
            Exception: rendering failed (e.g. ``json.dumps`` of a reply that is not JSON
                data, as eager code would fail), located at the node.
        """
        try:
            return substitute(node.args, self.payload), substitute(node.kwargs, self.payload)
        except Exception as exc:
            self.failure(node, exc, note=" while its inputs were rendered")
            raise

    def _check_inputs(self, node: Node) -> None:
        for dep in node.dependencies:
            upstream = self.results[dep]
            if upstream.is_error:
                origin = upstream.meta.get("node_id", dep)
                raise self.failure(
                    node,
                    _error_cause(upstream),
                    note=f" (its input from {origin} is an error Value)",
                )

    def failure(self, node: Node, cause: BaseException, note: str = "") -> BaseException:
        """Returns ``cause`` located at ``node`` (`errors.locate`), to raise as it is."""
        where = "" if self.index is None else f" on input {self.index}"
        path = scoped(node.module_path or (type(node.module).__name__ if node.module else node.id))
        node_id = scoped(node.id)
        label = node_id if node_id == path else f"{node_id} ({path})"
        return locate(
            cause,
            f"{label} failed{where}{note}",
            node_id=node_id,
            module_path=path,
            input_index=self.index,
        )


def _as_value(output: Any, ref: str | None) -> Value:
    """Returns a leaf's output as one Value; an error Value anywhere inside makes it an error.

    Unwrapping a structure that holds an error Value (say ``{"topic": F.select(...)}``
    in a plain-Python leaf) would otherwise put the exception object into the
    output as if it were data.
    """
    if isinstance(output, Value) and output.is_error:
        return Value(output.kind, output.payload, ref=ref, meta=output.meta)
    failed = first_error(output)
    if failed is not None:
        return Value(ValueKind.ERROR, failed.payload, ref=ref, meta=failed.meta)
    if isinstance(output, Value):
        return Value(output.kind, output.payload, ref=ref, meta=output.meta)
    payload = unwrap(output)
    return Value(_infer_kind(payload), payload, ref=ref)
