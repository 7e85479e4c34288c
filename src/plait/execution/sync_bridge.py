"""The sync bridge: synchronous code runs plait's coroutines on one background loop.

``module.run_sync(x)``, and any public entry point called from a script with
no event loop running (`plait.execution.run.awaitable_or_result`), hand their
coroutine to `run_to_completion`, which runs it on a loop thread shared by
every such call and blocks until it is done.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import gc
import inspect
import sys
import threading
import weakref
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plait.execution.batch import BatchResult, BatchStream

__all__ = ["remember_for_shutdown", "run_to_completion"]


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
        second Ctrl-C cancels the call again, which ends the clean-ups its
        program runs on cancel (a batch cancels each item once and lets their
        clean-ups finish; cancelled again, it ends them), and waits for that
        end, as ``asyncio.run`` does: without it the clean-ups would run on in
        this thread, beside the caller's handler of the interrupt, or in a
        notebook for as long as they last. A third Ctrl-C leaves at once.
        """

        def cancel() -> None:  # on the loop, after `start` has made the task
            for task in tasks:
                task.cancel()

        self.loop.call_soon_threadsafe(cancel)
        try:
            _wait_for(result)
        except KeyboardInterrupt:
            self.loop.call_soon_threadsafe(cancel)
            _wait_for(result)


def _wait_for(result: concurrent.futures.Future[Any]) -> None:
    """Blocks until ``result`` is done, however it ends (a Ctrl-C interrupts the wait)."""
    with contextlib.suppress(concurrent.futures.CancelledError):
        result.exception()


def _transfer(task: asyncio.Task[Any], result: concurrent.futures.Future[Any]) -> None:
    if task.cancelled():
        result.cancel()
    elif task.exception() is not None:
        result.set_exception(task.exception())
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


def remember_for_shutdown(manager: Any) -> None:
    """Notes a manager made on the background loop, so that exiting Python closes it."""
    if _loop_thread is not None and asyncio.get_running_loop() is _loop_thread.loop:
        _managers.add(manager)


def _shutdown() -> None:
    """Closes the managers the background loop used, so connections close cleanly.

    Then it freezes the garbage collector (`gc.freeze`): the interpreter's
    teardown would otherwise walk every object still alive in full collections
    (50 to 70 ms of a script's exit once aiohttp and plait are imported, on
    the machine where benchmarks/cold_start_bench.py was run), and the
    operating system reclaims that memory anyway. Objects are still released by reference
    counting as modules are cleared; only cycles still alive at exit are left
    unfinalized, which Python never promised to finalize.
    """
    if _loop_thread is None or not _loop_thread.loop.is_running():
        return
    managers = list(_managers)

    async def close_all() -> None:
        await asyncio.gather(*(m.aclose() for m in managers), return_exceptions=True)

    try:
        asyncio.run_coroutine_threadsafe(close_all(), _loop_thread.loop).result(timeout=5)
    except Exception as exc:  # interpreter shutdown: report, never hang
        print(f"plait: closing connections failed: {exc}", file=sys.stderr)
    gc.freeze()


def run_to_completion(work: Coroutine[Any, Any, Any] | BatchStream) -> Any:
    """Runs ``work`` on the background loop and returns its result (a stream's as a list).

    Blocks the caller. Ctrl-C cancels the work (its requests in flight, the
    rest of a batch) and the caller gets the KeyboardInterrupt once it has
    stopped, with every finished item in the checkpoint; a second Ctrl-C
    ends the program's clean-ups on cancel too, and a third leaves at once.
    """
    if inspect.iscoroutine(work):
        return _background().run(work)
    stream = work

    async def collect() -> list[BatchResult]:
        return await stream

    return _background().run(collect())
