"""Imports on a background thread: a backend's heavy dependencies, loaded as a program is built.

A cold process spends part of its first call importing what that call needs
(a backend's module and its parser). `import_in_background` starts such
imports on a daemon thread, ``plait-warm-up``, once per process;
`plait.resources.warm_up` calls it when a `ResourceConfig` lists an endpoint
that will need them. A call that comes before they end imports the module
itself, which waits on the module's import lock until the thread is done with
it (the imports are a few tens of milliseconds).

The thread only imports. It never fails the program: an import that raises
is left for the code that needs the module to repeat, which raises it there
with its fix, so a broken install fails at the first call as before, never as
a hang. A fork waits for the imports first, since a child forked in the middle
of an import would find that module's lock held forever; so does the
interpreter's exit, since an import may be inside C code that runs without
the GIL (aiohttp's import, when the http transport was aiohttp, loaded the
system's CA certificates into two TLS contexts) while exiting tears down what
it uses (a script whose program ended
during that load crashed at exit with a segmentation fault in OpenSSL's
cleanup, in about 2 runs of 100 of ``benchmarks/cold_start_bench.py``'s
client).
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import sys
import threading
from collections.abc import Iterable

__all__ = ["BackgroundImport", "current", "import_in_background", "is_imported"]

logger = logging.getLogger("plait.backends")

# How long a fork, or the interpreter's exit, waits for the imports before going ahead anyway.
_FORK_WAIT_SECONDS = 30.0


def is_imported(name: str) -> bool:
    """Whether module ``name`` has finished importing (in any thread).

    A module is in ``sys.modules`` from the moment its import starts; its
    spec's ``_initializing`` is what importlib itself reads to tell one still
    running its body.
    """
    module = sys.modules.get(name)
    if module is None:
        return False
    return not getattr(getattr(module, "__spec__", None), "_initializing", False)


class BackgroundImport:
    """One daemon thread importing ``modules`` in order.

    Args:
        modules: dotted module names; the thread stops at the first that raises.
    """

    def __init__(self, modules: Iterable[str]) -> None:
        self.modules = tuple(modules)
        self.error: BaseException | None = None
        """What the imports raised, if they did (the code needing them raises it again)."""
        self._done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="plait-warm-up", daemon=True)

    @property
    def done(self) -> bool:
        """Whether the thread has finished, whether or not its imports succeeded."""
        return self._done.is_set()

    def _run(self) -> None:
        name = ""
        try:
            for name in self.modules:
                importlib.import_module(name)
        except BaseException as exc:  # a thread's exception would only be printed
            self.error = exc
            logger.debug("importing %s in the background failed: %r", name, exc)
        finally:
            self._done.set()

    def join(self, timeout: float | None = None) -> bool:
        """Blocks until the imports are done; returns whether they are (False on timeout)."""
        return self._done.wait(timeout)


_current: BackgroundImport | None = None
_start_lock = threading.Lock()


def current() -> BackgroundImport | None:
    """Returns the process's background import, running or finished; None if none started."""
    return _current


def import_in_background(modules: Iterable[str]) -> BackgroundImport | None:
    """Starts importing ``modules`` on a thread, unless a background import already started.

    Modules already imported are left out; when none is left, nothing starts.
    One background import runs per process (the first caller's list).

    Returns:
        The background import now running or finished, or None.
    """
    global _current
    if _current is not None:
        return _current
    missing = [name for name in modules if not is_imported(name)]
    if not missing:
        return None
    with _start_lock:
        if _current is None:
            started = BackgroundImport(missing)
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(before=_before_fork)
            atexit.register(_before_fork)
            started.thread.start()
            _current = started
    return _current


def _before_fork() -> None:
    """Waits for the imports (at most `_FORK_WAIT_SECONDS`), before a fork or the exit."""
    running = _current
    if running is None or running.done or threading.current_thread() is running.thread:
        return
    running.join(_FORK_WAIT_SECONDS)
