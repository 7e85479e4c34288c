"""Test helpers that ship with plait: the test provider and a scripted OpenAI-compatible server.

`TestBackend` is the ``test`` provider's backend: a user's tests run their
program against it, with replies made from each request's schema or given,
and read the requests it received in ``calls`` (docs/how-to/testing.md).
`ScriptedServer` runs inside a test's event loop; `start_server_process`
runs the same server in a child process for benchmarks; `start_llama_server`
serves the embedded model with ``python -m llama_cpp.server``;
`server_in_thread` runs a `ScriptedServer` on a loop of its own, for callers
that block their thread. See
`plait.testing.scripted_server` for the full story. `plait.testing.lease_sim` runs
simulated Ray workers sharing one lease ledger on virtual time (tests and
``benchmarks/ray_lease_sim.py``).

Names are loaded on first use, so ``python -m plait.testing.scripted_server``
does not import its own module twice and ``import plait.testing`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait import _lazy

if TYPE_CHECKING:
    from plait.backends.test.backend import TestBackend
    from plait.testing._faults import Fault
    from plait.testing._llama_server import start_llama_server
    from plait.testing._process import fetch_stats, start_server_process
    from plait.testing._replies import Flood, RawReply
    from plait.testing._thread import server_in_thread
    from plait.testing.scripted_server import RequestRecord, ScriptedServer, ServerStats

__all__ = [
    "Fault",
    "Flood",
    "RawReply",
    "RequestRecord",
    "ScriptedServer",
    "ServerStats",
    "TestBackend",
    "fetch_stats",
    "server_in_thread",
    "start_llama_server",
    "start_server_process",
]

_HOMES = {
    "Fault": "plait.testing._faults",
    "Flood": "plait.testing._replies",
    "RawReply": "plait.testing._replies",
    "RequestRecord": "plait.testing.scripted_server",
    "ScriptedServer": "plait.testing.scripted_server",
    "ServerStats": "plait.testing.scripted_server",
    "TestBackend": "plait.backends.test.backend",
    "fetch_stats": "plait.testing._process",
    "server_in_thread": "plait.testing._thread",
    "start_llama_server": "plait.testing._llama_server",
    "start_server_process": "plait.testing._process",
}


__getattr__, __dir__ = _lazy.exports("plait.testing", _HOMES, globals(), __all__)
