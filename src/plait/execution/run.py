"""Entry points and one call: `run`, ``await module(...)`` when bound, ``module.run_sync(...)``.

All three resolve the options of the call (call kwargs > bind > the innermost
``ExecutionSettings`` > defaults) and its resources, then run one call here
(`_run_single`) or hand a batch (a list as first argument) to
`plait.execution.batch`. Synchronous callers go through
`plait.execution.sync_bridge`; `awaitable_or_result` is the rule that decides.

Cold start: a new process's first result waits for little but the replies. The first
call of an OpenAI-compatible endpoint imports the backend's module and httptools itself
(about 8 ms; the http transport is plait's own). No thread imports them beforehand: a
program is bound in well under a millisecond, so the first call came before such a
thread had done anything and only waited on it. What a first call of a text program
does not need loads on use (checkpoints, `BatchJob`, response formats, streamed fields,
hashlib, random, email.utils; a base_url's ASCII host is checked without the IDNA codec;
traceback loads only when an error Value is made): `tests/execution/test_cold_path.py`
holds it so, and `benchmarks/cold_start_bench.py` measures the whole process against
the replies' time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any

from plait import _context
from plait.backends.types import Message
from plait.errors import DeadlineExceededError
from plait.execution.batch import BatchStream, batch_to_list, run_batch
from plait.execution.executor import RECORD, Executor
from plait.execution.graph_cache import RunGraphs
from plait.execution.llm_call import USE_CACHE
from plait.execution.observe import resolve_callbacks
from plait.execution.settings import OPTION_NAMES, effective_options, resources_of
from plait.execution.sync_bridge import run_to_completion
from plait.execution.tape import Tape, get_tape
from plait.media import Media
from plait.module import Module
from plait.values import Value

__all__ = ["awaitable_or_result", "call_bound", "execute_bound", "run", "run_sync"]


async def run(
    module: Module,
    *args: Any,
    resources: Any = None,
    max_concurrent: int | None = None,
    checkpoint_dir: Any = None,
    record: bool = False,
    report: bool = False,
    batch_api: bool = False,
    state: Any = None,
    **kwargs: Any,
) -> Any:
    """Runs ``module`` on one input, or on each item when the first argument is a list.

    Args:
        module: the program.
        *args: arguments of ``forward``; a list as first argument is a batch
            (unless it is one conversation, a list of chat messages: see `is_batch`).
        resources: ResourceConfig / ResourceManager / mapping (default: bound
            or ``ExecutionSettings`` resources).
        max_concurrent: most LLM calls in flight at once.
        checkpoint_dir: directory that makes a batch resumable.
        record: also return the forward record (for a backward pass): the call runs as in
            training mode for this once, whatever ``module.training`` is, and
            returns ``(output, tape)`` — the output a Value carrying its tape id
            (``meta["_tape_ids"]``) for ``await Value.backward(output, grad=...)``,
            and the `plait.execution.tape.Tape` (the graph and every node's
            result). For a batch: ``(outputs, tapes)``, lists in input order.
        report: also return a `plait.report.RunReport` of this run (usage,
            cost, timings, retries, errors): the result is ``(output, report)``.
            It profiles the run; an enclosing ``profile()`` sees nothing of it.
        batch_api: send the batch's LLM calls through the provider's Batch API,
            level by level, at the batch price (`plait.execution.batch_api.BatchJob`;
            ``checkpoint_dir`` keeps the batch ids, so a rerun resumes).
        state: a state store URL (``"postgresql://…"`` or an SQLite path):
            endpoints with ``cache = true`` keep their replies there, shared
            by every process that names it (`plait.resources.state`).
        **kwargs: execution options (``timeout`` per attempt, ``deadline`` for
            the whole call or batch, ``progress``, ``on_error``, ``cache=False``
            to skip response caches) or keyword arguments of ``forward``.

    Returns:
        The output (raw data in the structure ``forward`` returned), or a list
        of outputs for a batch; with ``record=True`` or ``report=True``, a pair (see above).

    Raises:
        Exception: what a node failed with, of its own class (`BudgetExceededError`,
            `MediaError`, a provider's `BackendError`, your code's own error ...),
            located by `plait.errors.locate`: ``module_path``, ``node_id``,
            ``input_index`` and a note naming them.
        DeadlineExceededError: the ``deadline`` passed before the work was done.
    """
    call = {"max_concurrent": max_concurrent, "checkpoint_dir": checkpoint_dir}
    if state is not None:
        # import time: `import plait.execution` stays without the resource layer
        from plait.resources.config import resources_with_state

        found = resources_of(module, resources, who=type(module).__name__, takes="plait.run")
        resources = resources_with_state(found, state)
    if resources is not None:
        call["resources"] = resources
    if record:
        if report or batch_api:
            raise TypeError("run(..., record=True) cannot be combined with report= or batch_api=")
        return await _recorded(module, args, {**kwargs, **call})
    # A coroutine, or a BatchStream (streaming settings), which awaits to its results.
    graphs = RunGraphs(module)
    if not report:
        return await _start(module, args, {**kwargs, **call}, batch_api, graphs)
    # late-bound upward call (ARCHITECTURE.md): `report=True`
    from plait.report.profiling import Profiler

    with Profiler() as profiler:
        output = await _start(module, args, {**kwargs, **call}, batch_api, graphs)
    return output, profiler.report(program=type(module).__name__, graph=graphs.first)


async def _start(
    module: Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    batch_api: bool,
    graphs: RunGraphs,
) -> Any:
    if not batch_api:
        return await execute_bound(module, args, kwargs, graphs)
    from plait.execution.batch_api import BatchJob  # import time: only a Batch API run

    if not args or not is_batch(args[0]):
        raise ValueError("batch_api=True runs a batch: pass a list of inputs as first argument")
    forward_kwargs, call_options = _split_kwargs(kwargs)
    options = effective_options(module._bound_config, call_options)
    job = BatchJob(
        module,
        _resources(module, kwargs),
        checkpoint_dir=options["checkpoint_dir"],
    )
    return await job.run_traced(
        graphs, args[0], args[1:], forward_kwargs, options["on_error"], options["deadline"]
    )


async def _recorded(module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Runs a call that keeps its forward record; returns ``(output, tape)`` (lists for a batch)."""

    def tape_of(output: Any) -> Tape | None:
        ids = output.meta.get("_tape_ids") if isinstance(output, Value) else None
        return get_tape(ids[-1]) if ids else None

    if kwargs.get("streaming"):
        raise TypeError(
            "run(..., record=True) returns a batch's outputs together with their records, "
            "so it cannot stream; drop streaming=True"
        )
    token = RECORD.set(True)
    try:
        # A batch comes back as a list even inside ExecutionSettings(streaming=True).
        output = await execute_bound(module, args, {**kwargs, "streaming": False})
    finally:
        RECORD.reset(token)
    if bool(args) and is_batch(args[0]):
        return output, [tape_of(item) for item in output]
    return output, tape_of(output)


RUN_KEYWORDS = frozenset({"resources", "resume_state"})
"""Keywords of a call that are for the run itself, never passed to ``forward``."""


def _split_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    forward_kwargs = {
        k: v for k, v in kwargs.items() if k not in OPTION_NAMES and k not in RUN_KEYWORDS
    }
    options = {k: v for k, v in kwargs.items() if k in OPTION_NAMES}
    return forward_kwargs, options


def _resources(module: Module, kwargs: dict[str, Any]) -> Any:
    who = type(module).__name__
    return resources_of(module, kwargs.get("resources"), who=who, takes="plait.run")


def is_batch(first: Any) -> bool:
    """Whether a first argument means "run once per item": a list that is not one conversation.

    A list whose every item is a chat message (a `Message`, or a mapping with a
    ``role``) is one conversation, the input of a single call; a batch of
    conversations is a list of such lists. So is a list of text and media
    (``["What is this?", Image(...)]``, one user turn), while a list of media
    alone is a batch of them. Any other list is a batch. An empty list is an
    empty batch.
    """
    if not isinstance(first, list):
        return False
    return not first or not (all(_is_message(item) for item in first) or _is_turn(first))


def _is_turn(items: list[Any]) -> bool:
    """Whether ``items`` are the parts of one turn: text and media, some of each."""
    media = [isinstance(item, Media) for item in items if not isinstance(item, str)]
    return all(media) and 0 < len(media) < len(items)


def _is_message(item: Any) -> bool:
    return isinstance(item, Message) or (isinstance(item, Mapping) and "role" in item)


def execute_bound(
    module: Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    graphs: RunGraphs | None = None,
) -> Coroutine[Any, Any, Any] | BatchStream:
    """Starts a bound call: returns a coroutine, or a `BatchStream` for a streaming batch.

    Options and resources are read *now*, in the caller's context, so the
    returned coroutine may run on another thread's loop (``run_sync``).
    ``graphs`` holds the graphs the call traces, for a caller that needs them
    afterwards (a run report); by default the call keeps its own.
    """
    forward_kwargs, call_options = _split_kwargs(kwargs)
    options = effective_options(module._bound_config, call_options)
    resources = _resources(module, kwargs)
    batch = bool(args) and is_batch(args[0])
    graphs = graphs if graphs is not None else RunGraphs(module)
    resume = kwargs.get("resume_state")
    if resume is not None:
        if batch:
            raise TypeError(
                "resume_state= resumes one paused call; pass it with that call's input, "
                "not with a batch"
            )
        work = _run_single(graphs, args, forward_kwargs, resources, options)
        return _resumed(resume, work)
    if batch and options["streaming"]:
        items, extra = args[0], args[1:]
        return BatchStream(
            lambda report: run_batch(
                graphs, items, extra, forward_kwargs, resources, options, report
            ),
            total=len(items),
            preserve_order=options["preserve_order"],
        )
    if batch:
        return batch_to_list(graphs, args[0], args[1:], forward_kwargs, resources, options)
    return _run_single(graphs, args, forward_kwargs, resources, options)


def call_bound(
    module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Coroutine[Any, Any, Any] | BatchStream | Any:
    """Runs ``module(*args, **kwargs)`` for a module that has resources.

    Inside a running event loop it returns what `execute_bound` returns, to
    be awaited (``await module(x)``, ``async for r in module(batch)``); from
    synchronous code it runs the call to completion (`awaitable_or_result`).
    """
    return awaitable_or_result(execute_bound(module, args, kwargs))


def awaitable_or_result(work: Coroutine[Any, Any, Any] | BatchStream) -> Any:
    """Returns ``work`` to be awaited, or — called with no event loop running — its result.

    The one rule of every public entry point (a module call, ``evaluate``,
    ``run_dataset``, an optimizer's ``compile``, ``optimize_grid``,
    ``Trainer.fit``): inside a running loop the caller awaits what it gets;
    from synchronous code (a script) the work runs to completion on the
    background loop of `plait.execution.sync_bridge` and the result comes
    back, because nothing could ever await a coroutine returned there: a
    script's ``result = predictor(question=...)`` wants the result itself.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_to_completion(work)
    return work


async def _run_single(
    graphs: RunGraphs,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    resources: Any,
    options: dict[str, Any],
) -> Any:
    module = graphs.module
    executor = Executor.for_call(module, resources, options)
    graph = graphs.graph_for(args, kwargs)
    token = USE_CACHE.set(options["cache"])
    callbacks = resolve_callbacks()
    deadline = options["deadline"]
    try:
        async with asyncio.timeout(deadline) as scope:
            return await executor.run_program(graph, args, kwargs)
    except TimeoutError as exc:
        if not scope.expired():
            raise
        raise DeadlineExceededError(
            f"{type(module).__name__} did not finish within its deadline of {deadline:g} s; "
            "the call was cancelled (raise deadline= to allow more time)",
            deadline=deadline,
        ) from exc
    finally:
        USE_CACHE.reset(token)
        _context.CALLBACKS.reset(callbacks)


async def _resumed(resume: Any, work: Coroutine[Any, Any, Any]) -> Any:
    """Runs ``work`` with ``resume`` on offer to the module that paused; fails if none took it."""
    # late-bound upward call (ARCHITECTURE.md): a resumed call
    from plait.confirmation import offering

    with offering(resume):
        return await work


def run_sync(module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Runs a bound call to completion and returns its result, blocking the caller.

    Ctrl-C cancels the call (its requests in flight, the rest of a batch) and
    the caller gets the KeyboardInterrupt once it has stopped, with every
    finished item in the checkpoint; a second Ctrl-C ends the program's
    clean-ups on cancel too, and a third leaves at once.
    """
    return run_to_completion(execute_bound(module, args, kwargs))
