"""Entry points: `run`, ``await module(...)`` when bound, and ``module.run_sync(...)``.

All three resolve the options of the call (call kwargs > bind > the innermost
``ExecutionSettings`` > defaults), get the shared `ResourceManager` of the
resources on the running loop, trace the module once per input shape and run
the graph — once, or once per item of a batch (a list as first argument).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import sys
import threading
import weakref
from collections.abc import Awaitable, Coroutine, Mapping
from typing import Any

from plait import _context
from plait.backends.types import Message
from plait.errors import DeadlineExceededError, ExecutionError, PlaitError
from plait.execution.batch import BatchResult, BatchStream, run_items
from plait.execution.checkpoint import Checkpoint, program_identity
from plait.execution.checkpoint_codec import CheckpointError, OutputCodec
from plait.execution.llm_call import USE_CACHE
from plait.execution.observe import observed, resolve_callbacks
from plait.execution.runner import Runner, trace_cached
from plait.execution.scheduler import execute_graph
from plait.execution.settings import OPTION_NAMES, effective_options, find_resources
from plait.execution.tape import Tape, attach_tape, new_tape_id
from plait.media import Media
from plait.module import Module
from plait.tracing import is_leaf_module
from plait.values import Value, ValueKind, valueify

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
        record: also return the forward record (seed 001): the call runs as in
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
        **kwargs: execution options (``timeout`` per attempt, ``deadline`` for
            the whole call or batch, ``progress``, ``on_error``, ``cache=False``
            to skip response caches) or keyword arguments of ``forward``.

    Returns:
        The output (raw data in the structure ``forward`` returned), or a list
        of outputs for a batch; with ``record=True`` or ``report=True``, a pair (see above).

    Raises:
        ExecutionError: a node failed; names the node, module path and input index.
        DeadlineExceededError: the ``deadline`` passed before the work was done.
    """
    call = {"max_concurrent": max_concurrent, "checkpoint_dir": checkpoint_dir}
    if resources is not None:
        call["resources"] = resources
    if record:
        if report or batch_api:
            raise TypeError("run(..., record=True) cannot be combined with report= or batch_api=")
        return await _recorded(module, args, {**kwargs, **call})
    # A coroutine, or a BatchStream (streaming settings), which awaits to its results.
    if not report:
        return await _start(module, args, {**kwargs, **call}, batch_api)
    from plait.profiling import Profiler  # observability, above this layer: loaded on use

    with Profiler() as profiler:
        output = await _start(module, args, {**kwargs, **call}, batch_api)
    graph = None
    if args:
        forward_kwargs, _ = _split_kwargs(kwargs)
        first = args[0][0] if is_batch(args[0]) and args[0] else args[0]
        graph = trace_cached(module, (first, *args[1:]), forward_kwargs)
    return output, profiler.report(program=type(module).__name__, graph=graph)


async def _start(module: Module, args: tuple[Any, ...], kwargs: dict[str, Any], batch_api: bool):
    if not batch_api:
        return await execute_bound(module, args, kwargs)
    from plait.execution.batch_api import BatchJob

    if not args or not is_batch(args[0]):
        raise ValueError("batch_api=True runs a batch: pass a list of inputs as first argument")
    forward_kwargs, call_options = _split_kwargs(kwargs)
    options = effective_options(module._bound_config, call_options)
    job = BatchJob(
        module,
        _resources_of(module, kwargs.get("resources")),
        checkpoint_dir=options["checkpoint_dir"],
    )
    return await job.run(
        args[0],
        *args[1:],
        on_error=options["on_error"],
        deadline=options["deadline"],
        **forward_kwargs,
    )


RECORD: contextvars.ContextVar[bool] = contextvars.ContextVar("plait_record", default=False)
"""Set by ``run(..., record=True)``: the call keeps tapes as in training mode."""


async def _recorded(module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Runs a call that keeps its forward record; returns ``(output, tape)`` (lists for a batch)."""
    from plait.execution.tape import get_tape

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


def _resources_of(module: Module, explicit: Any) -> Any:
    resources = find_resources(explicit, bound=module._bound_resources, module=module)
    if resources is None:
        raise PlaitError(
            f"{type(module).__name__} has no resources: bind them with module.bind(config), "
            "use ExecutionSettings(resources=config), or pass resources= to plait.run"
        )
    return resources


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
    module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Coroutine[Any, Any, Any] | BatchStream:
    """Starts a bound call: returns a coroutine, or a `BatchStream` for a streaming batch.

    Options and resources are read *now*, in the caller's context, so the
    returned coroutine may run on another thread's loop (``run_sync``).
    """
    forward_kwargs, call_options = _split_kwargs(kwargs)
    options = effective_options(module._bound_config, call_options)
    resources = _resources_of(module, kwargs.get("resources"))
    batch = bool(args) and is_batch(args[0])
    resume = kwargs.get("resume_state")
    if resume is not None:
        if batch:
            raise TypeError(
                "resume_state= resumes one paused call; pass it with that call's input, "
                "not with a batch"
            )
        return _resumed(resume, _run_single(module, args, forward_kwargs, resources, options))
    if batch and options["streaming"]:
        items, extra = args[0], args[1:]
        return BatchStream(
            lambda report: _run_batch(
                module, items, extra, forward_kwargs, resources, options, report
            ),
            total=len(items),
            preserve_order=options["preserve_order"],
        )
    if batch:
        return _batch_to_list(module, args[0], args[1:], forward_kwargs, resources, options)
    return _run_single(module, args, forward_kwargs, resources, options)


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
    `run_sync` loop and the result comes back, because nothing could ever
    await a coroutine returned there, and udspy's and dsprrr's snippets
    (``result = predictor(question=...)``) are written that way.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _complete(work)
    return work


def _runner(module: Module, resources: Any, options: dict[str, Any]) -> Runner:
    from plait.resources import ResourceManager  # resource layer; loads aiohttp lazily

    manager = ResourceManager.shared(resources)
    _remember_for_shutdown(manager)
    training = module.training or RECORD.get()
    return Runner(manager, options["max_concurrent"], options["timeout"], training)


def _taped(
    graph: Any, runner: Runner, output: Any, results: dict[str, Any], index: int | None
) -> Any:
    """Returns ``output`` as it is, or — in training mode — as a Value carrying its tape."""
    if not runner.training:
        return output
    tape = Tape(
        new_tape_id(),
        graph,
        results,
        runner.parameter_table(graph),
        index=index,
        manager=runner.manager,
    )
    value = output if isinstance(output, Value) else valueify(output, kind=_kind_of(output))
    attach_tape(value, tape)
    return value


def _kind_of(output: Any) -> ValueKind:
    return ValueKind.TEXT if isinstance(output, str) else ValueKind.STRUCTURED


async def _run_single(
    module: Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    resources: Any,
    options: dict[str, Any],
) -> Any:
    runner = _runner(module, resources, options)
    graph = trace_cached(module, args, kwargs)
    token = USE_CACHE.set(options["cache"])
    callbacks = resolve_callbacks()
    deadline = options["deadline"]
    try:
        async with asyncio.timeout(deadline) as scope:
            output, results = await _observed_graph(graph, runner, args, kwargs, None)
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
    return _taped(graph, runner, output, results, None)


async def _resumed(resume: Any, work: Coroutine[Any, Any, Any]) -> Any:
    """Runs ``work`` with ``resume`` on offer to the module that paused; fails if none took it."""
    from plait.confirmation import offering  # programs layer, loaded only when a call resumes

    with offering(resume):
        return await work


async def _observed_graph(
    graph: Any, runner: Runner, args: tuple[Any, ...], kwargs: dict[str, Any], index: int | None
) -> tuple[Any, dict[str, Any]]:
    """Runs a program's graph as one module call for the callbacks.

    A program that is itself a leaf (an LLMInference, a Predict) is its
    graph's only node, which is observed as that call already.
    """
    module = graph.root

    def execute() -> Awaitable[tuple[Any, dict[str, Any]]]:
        return execute_graph(graph, runner, args, kwargs, index)

    if is_leaf_module(module):
        return await execute()
    return await observed(module, args, kwargs, execute, reported=lambda done: done[0])


async def _run_batch(
    module: Module,
    items: list[Any],
    extra: tuple[Any, ...],
    kwargs: dict[str, Any],
    resources: Any,
    options: dict[str, Any],
    report: Any,
) -> None:
    """Runs every item, calling ``report(BatchResult)`` as each finishes."""
    from plait.execution.progress import BatchProgress
    from plait.resources.usage import metered

    runner = _runner(module, resources, options)
    usage_by_index: dict[int, dict[str, Any]] = {}
    profiler = _context.PROFILE.get()  # counts items and keeps failures for a run report

    async def run_item(index: int, item: Any) -> Any:
        item_args = (item, *extra)
        graph = trace_cached(module, item_args, kwargs)
        with metered() as meter:  # every call of this item, inner and re-asked ones too
            try:
                output, results = await _observed_graph(graph, runner, item_args, kwargs, index)
            finally:
                usage_by_index[index] = meter.as_dict()
        return _taped(graph, runner, output, results, index)

    checkpoint = _open_checkpoint(module, items, extra, kwargs, options["checkpoint_dir"], runner)
    cache_token = USE_CACHE.set(options["cache"])
    callbacks = resolve_callbacks()
    reported: set[int] = set()
    try:
        with BatchProgress(len(items), options["progress"], runner.manager) as progress:

            def on_result(result: BatchResult) -> Any:
                reported.add(result.index)
                usage = usage_by_index.pop(result.index, None)
                result.usage = usage
                if checkpoint is not None and result.ok:
                    checkpoint.write(result.index, result.output, usage)
                if profiler is not None:
                    profiler.record_item(result.index, result.error)
                progress.advance(result.ok)
                return report(result)

            if checkpoint is not None:
                for index, output in sorted(checkpoint.done.items()):
                    reported.add(index)
                    if profiler is not None:
                        profiler.record_item(index, None, restored=True)
                    progress.advance(True)
                    waiting = report(BatchResult(index, items[index], output))
                    if waiting is not None:
                        await waiting
            skip = checkpoint.is_done if checkpoint is not None else (lambda index: False)
            deadline = options["deadline"]
            try:
                async with asyncio.timeout(deadline) as scope:
                    await run_items(items, run_item, runner.max_concurrent, on_result, skip)
            except TimeoutError:
                if not scope.expired():
                    raise
                await _fail_unfinished(items, reported, deadline, on_result)
    finally:
        USE_CACHE.reset(cache_token)
        _context.CALLBACKS.reset(callbacks)
        if checkpoint is not None:
            checkpoint.close()


async def _fail_unfinished(
    items: list[Any],
    reported: set[int],
    deadline: float,
    on_result: Any,
) -> None:
    """Reports every item that had not finished when the batch's deadline passed."""
    unfinished = len(items) - len(reported)
    for index, item in enumerate(items):
        if index in reported:
            continue
        error = unfinished_error(index, deadline, unfinished, len(items))
        waiting = on_result(BatchResult(index, item, error=error))
        if waiting is not None:
            await waiting


def unfinished_error(
    index: int, deadline: float, unfinished: int, total: int, detail: str = ""
) -> DeadlineExceededError:
    """Returns the error of batch item ``index``, still running when the batch's deadline passed."""
    return DeadlineExceededError(
        f"input {index} did not finish within the batch's deadline of {deadline:g} s "
        f"({unfinished} of {total} items unfinished); its work was cancelled{detail}",
        deadline=deadline,
        input_index=index,
    )


def _open_checkpoint(
    module: Module,
    items: list[Any],
    extra: tuple[Any, ...],
    kwargs: dict[str, Any],
    directory: Any,
    runner: Runner,
) -> Checkpoint | None:
    if not directory or not items:
        return None
    if runner.training:
        raise CheckpointError(
            f"checkpoint_dir={directory!s} with {type(module).__name__} in training mode: a "
            "training-mode output carries a tape that cannot be saved. Checkpoint eval-mode "
            "runs (module.eval()); the Trainer has its own checkpoint_dir for training"
        )
    graph = trace_cached(module, (items[0], *extra), kwargs)
    identity = program_identity(module, graph.structural_hash(), runner.manager.config)
    declared = (t for sub in module.modules() for t in sub.declared_output_types())
    codec = OutputCodec(declared, output_type=module.declared_return_type())
    return Checkpoint(directory, identity, items, codec)


async def _batch_to_list(
    module: Module,
    items: list[Any],
    extra: tuple[Any, ...],
    kwargs: dict[str, Any],
    resources: Any,
    options: dict[str, Any],
) -> list[Any]:
    outputs: list[Any] = [None] * len(items)
    collect = options["on_error"] == "collect"

    def report(result: BatchResult) -> None:
        if result.error is not None and not collect:
            raise _item_error(result)
        outputs[result.index] = result.output if result.ok else result.error

    await _run_batch(module, items, extra, kwargs, resources, options, report)
    return outputs


def _item_error(result: BatchResult) -> BaseException:
    if isinstance(result.error, PlaitError):
        return result.error
    return ExecutionError(
        f"input {result.index} failed: {type(result.error).__name__}: {result.error}",
        input_index=result.index,
        cause=result.error,
    )


# ---------------------------------------------------------------- run_sync
class _LoopThread:
    """One background event loop shared by every ``run_sync`` call.

    A persistent loop keeps connection pools and loaded models alive between
    calls, and works whether or not the caller already runs a loop (Jupyter).
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="plait-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Runs ``coro`` on the background loop in the caller's context; blocks for the result.

        The caller's context variables (an active profiler, settings) are
        copied into the task, as if the coroutine ran in the calling thread.
        """
        context = contextvars.copy_context()
        result: concurrent.futures.Future[Any] = concurrent.futures.Future()
        tasks: list[asyncio.Task[Any]] = []

        def start() -> None:
            task = self.loop.create_task(coro, context=context)
            tasks.append(task)
            task.add_done_callback(lambda done: _transfer(done, result))

        self.loop.call_soon_threadsafe(start)
        try:
            return result.result()
        except KeyboardInterrupt:
            self._stop(tasks, result)
            raise

    def _stop(self, tasks: list[asyncio.Task[Any]], result: concurrent.futures.Future[Any]) -> None:
        """Cancels the call on Ctrl-C and waits until it has stopped.

        The caller's KeyboardInterrupt then comes after the requests in flight
        were cancelled and the checkpoint closed, as with ``asyncio.run``. A
        second Ctrl-C interrupts this wait, so it leaves at once.
        """

        def cancel() -> None:  # on the loop, after `start` has made the task
            for task in tasks:
                task.cancel()

        self.loop.call_soon_threadsafe(cancel)
        with contextlib.suppress(concurrent.futures.CancelledError):
            result.exception()  # waits for the end, however it ends


def _transfer(task: asyncio.Task[Any], result: concurrent.futures.Future[Any]) -> None:
    if task.cancelled():
        result.cancel()
    elif task.exception() is not None:
        result.set_exception(task.exception())  # type: ignore[arg-type]
    else:
        result.set_result(task.result())


_loop_thread: _LoopThread | None = None
_loop_lock = threading.Lock()
_managers: weakref.WeakSet[Any] = weakref.WeakSet()


def _background() -> _LoopThread:
    global _loop_thread
    with _loop_lock:
        if _loop_thread is None:
            _loop_thread = _LoopThread()
            atexit.register(_shutdown)
        return _loop_thread


def _remember_for_shutdown(manager: Any) -> None:
    if _loop_thread is not None and asyncio.get_running_loop() is _loop_thread.loop:
        _managers.add(manager)


def _shutdown() -> None:
    """Closes the managers the background loop used, so connections close cleanly."""
    if _loop_thread is None or not _loop_thread.loop.is_running():
        return
    managers = list(_managers)

    async def close_all() -> None:
        await asyncio.gather(*(m.aclose() for m in managers), return_exceptions=True)

    try:
        asyncio.run_coroutine_threadsafe(close_all(), _loop_thread.loop).result(timeout=5)
    except Exception as exc:  # interpreter shutdown: report, never hang
        print(f"plait: closing connections failed: {exc}", file=sys.stderr)


def run_sync(module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Runs a bound call to completion and returns its result, blocking the caller.

    Ctrl-C cancels the call (its requests in flight, the rest of a batch) and
    the caller gets the KeyboardInterrupt once it has stopped, with every
    finished item in the checkpoint; a second Ctrl-C leaves at once.
    """
    return _complete(execute_bound(module, args, kwargs))


def _complete(work: Coroutine[Any, Any, Any] | BatchStream) -> Any:
    """Runs ``work`` on the background loop and returns its result (a stream's as a list).

    Ctrl-C cancels the work and re-raises once it has stopped (see `run_sync`).
    """
    if isinstance(work, BatchStream):
        stream = work

        async def collect() -> list[BatchResult]:
            return await stream

        return _background().run(collect())
    return _background().run(work)
