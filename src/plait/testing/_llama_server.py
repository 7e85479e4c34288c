"""Running ``python -m llama_cpp.server`` with the embedded model, for tests and benchmarks.

A real OpenAI-compatible model server on loopback lets tests and peer
benchmarks exercise the HTTP backend (and other frameworks) against the
same SmolLM2 model the local backend embeds. Needs the ``server`` extra.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from plait import _files
from plait.backends.local import default_model_path

__all__ = ["start_llama_server"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def start_llama_server(
    log_path: Path,
    *,
    model_path: Path | None = None,
    n_ctx: int = 2048,
    startup_timeout: float = 120.0,
) -> Iterator[str]:
    """Runs llama_cpp.server on a free loopback port; yields its base URL (``.../v1``).

    The server's output goes to ``log_path``, and the last lines of it are in
    the error when the server does not come up, since that is where the reason
    (a missing extra, a bad model file) is written.

    Args:
        log_path: file for the server's stdout and stderr.
        model_path: a GGUF file; None serves the embedded model.
        n_ctx: the server's context window in tokens.
        startup_timeout: seconds to wait for ``GET /v1/models`` to answer.

    Raises:
        RuntimeError: the server exited or did not answer in time.
    """
    if model_path is None:
        model_path = default_model_path()
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model_path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
    ]
    with _files.open_for_writing(log_path, binary=True) as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_until_serving(process, base_url, log_path, startup_timeout)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_serving(
    process: subprocess.Popen[bytes], base_url: str, log_path: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"llama_cpp.server exited with code {process.returncode} before serving; "
                f"is the server extra installed (pip install 'plait[server]')? Its output:\n"
                f"{_tail(log_path)}"
            )
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=2):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"llama_cpp.server did not answer {base_url}/models within {timeout:g} s. "
                    f"Its output:\n{_tail(log_path)}"
                ) from None
            time.sleep(0.25)
