"""Starting the tests' MCP servers, and telling whether a process still runs."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).parent
TOOLS_SERVER = [sys.executable, str(HERE / "tools_server.py"), "stdio"]
NONSENSE_SERVER = [sys.executable, str(HERE / "nonsense_server.py")]
AWKWARD_SERVER = [sys.executable, str(HERE / "awkward_server.py")]
SRC = str(Path(__file__).parents[2] / "src")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen[bytes], limit: float = 60.0) -> None:
    """Waits until something listens on ``port`` (generous limit: a slow machine is fine)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listened on port {port} within {limit} s")


@contextlib.contextmanager
def http_process(command: list[str], port: int, **env: str) -> Iterator[str]:
    """Runs an HTTP MCP server process; yields its URL; stops it after."""
    environment = {**os.environ, "PYTHONPATH": SRC, **env}
    process = subprocess.Popen(command, env=environment, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(30)


def is_running(pid: int) -> bool:
    """Whether a process with this id exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status
