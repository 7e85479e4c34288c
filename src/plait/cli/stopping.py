"""Stopping a command cleanly on Ctrl-C or SIGTERM.

The first signal says so at once on stderr and cancels the running work the
way asyncio cancels anything: requests in flight are cancelled (each frees
its endpoint slot as it ends, and no new request goes out), every finished
row stays in the checkpoint, and the output file is closed with the rows
written so far. The command then exits 130 (Ctrl-C) or 143 (SIGTERM, 128 plus
the signal number, as shells and process supervisors expect), saying how to
resume. Stopping takes milliseconds unless the program's own code is slow to
give up, so a second signal during it quits at once: finished rows are safe
already, since the checkpoint is flushed item by item.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from plait.cli import EXIT_INTERRUPTED, EXIT_TERMINATED
from plait.cli.collection import fewer_collections

__all__ = ["Stopped", "run_stoppable"]

_EXIT_CODES = {signal.SIGINT: EXIT_INTERRUPTED, signal.SIGTERM: EXIT_TERMINATED}


class Stopped(Exception):
    """The command's work was stopped by a signal (its clean-up is done)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        """How the user knows the signal: ``Ctrl-C`` or ``SIGTERM``."""
        return _name(self.signum)

    @property
    def exit_code(self) -> int:
        """130 for Ctrl-C, 143 for SIGTERM."""
        return _EXIT_CODES[signal.Signals(self.signum)]


def _name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def _say(text: str) -> None:
    print(f"plait: {text}", file=sys.stderr, flush=True)


def run_stoppable(work: Coroutine[Any, Any, Any]) -> Any:
    """Runs ``work`` in a new event loop until it ends or a signal stops it.

    The loop is uvloop's where it is installed (the ``fast`` extra, and ``serve``, for
    which uvicorn picks it up the same way): a command's CPU goes mostly to the event
    loop and its sockets, and uvloop's take a fraction of asyncio's
    (``benchmarks/cli_bench.py``). ``PLAIT_EVENT_LOOP=asyncio`` keeps asyncio's. The
    garbage collector's young collections come far apart meanwhile (`fewer_collections`).

    Raises:
        Stopped: Ctrl-C or SIGTERM cancelled the work; it has finished stopping.
    """
    try:
        with fewer_collections(), asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(_until_signalled(work))
    except KeyboardInterrupt:  # Ctrl-C before the loop's handlers were in place
        work.close()  # it may never have started
        raise Stopped(signal.SIGINT) from None


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed and not declined; None: asyncio's."""
    if os.environ.get("PLAIT_EVENT_LOOP", "").strip().lower() == "asyncio":
        return None
    try:
        import uvloop  # optional extra (plait[fast]): loaded only when a command runs
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


async def _until_signalled(work: Coroutine[Any, Any, Any]) -> Any:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None  # asyncio.run runs this as its main task
    received: list[int] = []

    def on_signal(signum: int) -> None:
        if received:
            _say(f"{_name(signum)} again: quitting at once")
            os._exit(_EXIT_CODES[signal.Signals(signum)])
        received.append(signum)
        again = "Ctrl-C again" if signum == signal.SIGINT else "a second signal"
        _say(
            f"stopping on {_name(signum)}: cancelling the requests in flight "
            f"({again} quits at once)"
        )
        task.cancel()

    for signum in _EXIT_CODES:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await work
    except asyncio.CancelledError:
        if not received:
            raise
        raise Stopped(received[0]) from None
