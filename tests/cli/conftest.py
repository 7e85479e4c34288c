"""A scripted server on its own thread (the CLI runs in a child process) and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from plait.testing import ScriptedServer, server_in_thread

SRC = Path(__file__).resolve().parents[2] / "src"
PROGRAMS = Path(__file__).with_name("sample_programs.py")


@dataclass
class Finished:
    code: int
    stdout: str
    stderr: str


def plait_cli(*args: str, cwd: Path | None = None) -> Finished:
    """Runs ``python -m plait ARGS`` in a child process with this checkout's plait."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "plait", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )
    return Finished(done.returncode, done.stdout, done.stderr)


def program(name: str) -> str:
    return f"{PROGRAMS}:{name}"


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A scripted server on a background loop, reachable from child processes."""
    with server_in_thread() as running:
        yield running


@pytest.fixture
def resources(server: ScriptedServer, tmp_path: Path) -> Path:
    """A resources file whose every alias is the scripted server."""
    path = tmp_path / "res.toml"
    path.write_text(
        '["*"]\nprovider = "openai"\nmodel = "m"\n'
        f'base_url = "{server.base_url}"\napi_key = "k"\nmax_retries = 0\n'
    )
    return path
