"""Children that a test interrupts start with SIGINT at its default, wherever the suite runs.

A suite started in the background (``cmd &`` in a script, ``nohup``) runs with SIGINT
ignored, and children inherit that: Python then installs no KeyboardInterrupt handler, so the
Ctrl-C a test sends does nothing. `interruptible` puts a small launcher in front of the
command that sets SIGINT back to its default and execs the command (a default disposition
survives the exec; an ignored one would too). The launcher, rather than ``preexec_fn``: the
tests that interrupt children run threads (stderr readers, scripted servers), and
``preexec_fn`` is not safe in a process with threads.
"""

from __future__ import annotations

import sys

__all__ = ["interruptible"]

_LAUNCHER = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def interruptible(command: list[str]) -> list[str]:
    """Returns ``command`` (its first item an executable's path) started with SIGINT at its
    default, so a SIGINT sent to the child reaches it as Ctrl-C."""
    return [sys.executable, "-c", _LAUNCHER, *command]
