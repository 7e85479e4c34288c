"""Running a scripted server in its own process, for benchmarks.

A benchmark's server must not share the client's event loop and CPU time,
or the client's cost per call is mismeasured. `start_server_process` starts
``python -m plait.testing.scripted_server`` as a child and yields its URL;
`fetch_stats` reads the child's counters over HTTP.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import orjson

from plait.testing._faults import Fault

__all__ = ["fetch_stats", "start_server_process"]

ServerDialect = Literal["openai", "llama_cpp"]


def _root_url(base_url: str) -> str:
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def fetch_stats(
    base_url: str, *, include_log: bool = False, timeout: float = 10.0
) -> dict[str, Any]:
    """Returns ``GET /stats`` of a scripted server (blocking; for benchmarks and scripts).

    Args:
        base_url: the server's API root as `start_server_process` gave it.
        include_log: also fetch the per-request log.
        timeout: seconds to wait for the answer.
    """
    url = _root_url(base_url) + "/stats" + ("?log=1" if include_log else "")
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return orjson.loads(answer.read())


@contextlib.contextmanager
def start_server_process(
    latency: float = 0.0,
    *,
    faults: Sequence[Fault] = (),
    responder: str | None = None,
    host: str = "127.0.0.1",
    model: str = "scripted",
    dialect: ServerDialect = "openai",
    api_key: str | None = None,
    keep_log: bool = False,
    stream_pieces: int = 3,
    startup_timeout: float = 30.0,
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Runs a scripted server in a child process; yields ``(process, base_url)``.

    A benchmark's server must not share the client's event loop and CPU
    time, or the client's cost is mismeasured. The child exits when the
    block ends (and on its own if this process dies).

    Args:
        latency: as for `ScriptedServer`.
        faults: as for `ScriptedServer` (sent to the child as JSON).
        responder: ``"package.module:function"``, importable in the child;
            None answers with the echo responder.
        host, model, dialect, api_key: as for `ScriptedServer`.
        keep_log: keep the per-request log (off by default: long runs).
        stream_pieces: as for `ScriptedServer`.
        startup_timeout: seconds to wait for the child to listen.

    Raises:
        RuntimeError: the child did not start; the message has its exit code.
    """
    command = [
        sys.executable,
        "-m",
        "plait.testing.scripted_server",
        "--host",
        host,
        "--port",
        "0",
        "--latency",
        repr(float(latency)),
        "--model",
        model,
        "--dialect",
        dialect,
        "--exit-with-parent",
        "--stream-pieces",
        str(stream_pieces),
    ]
    for fault in faults:
        command += ["--fault", orjson.dumps(fault.as_dict()).decode()]
    if responder:
        command += ["--responder", responder]
    if api_key:
        command += ["--api-key", api_key]
    if not keep_log:
        command.append("--no-log")
    env = dict(os.environ)
    # The child must import this same plait, even from an uninstalled checkout.
    source_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH")) if p)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None  # stdout=PIPE
        ready, _, _ = select.select([process.stdout], [], [], startup_timeout)
        line = process.stdout.readline() if ready else ""
        if not line.startswith("PORT "):
            raise RuntimeError(
                f"scripted server process did not start within {startup_timeout:g} s "
                f"(exit code {process.poll()}, first line {line!r}); command: {' '.join(command)}"
            )
        port = int(line.split()[1])
        display_host = f"[{host}]" if ":" in host else host
        yield process, f"http://{display_host}:{port}/v1"
    finally:
        _stop_process(process)


def _stop_process(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()
