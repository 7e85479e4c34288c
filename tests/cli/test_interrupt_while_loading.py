"""One Ctrl-C while a command still loads the program (before its own signal handling is in
place) stops it as a Ctrl-C does later: one line and exit 130, not click's "Aborted!" and 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from interruptible import interruptible

SRC = Path(__file__).resolve().parents[2] / "src"

SLOW_PROGRAM = """
import pathlib, time
pathlib.Path(__file__).with_name("loading").write_text("")
time.sleep(60)  # a program whose import takes its time (a big model, a slow disk)
from plait import LLMInference
def make():
    return LLMInference("llm")
"""


@pytest.mark.parametrize("command", ["run", "serve"])
def test_ctrl_c_while_the_program_loads_is_one_line_and_exit_130(
    tmp_path: Path, command: str
) -> None:
    program = tmp_path / "prog.py"
    program.write_text(SLOW_PROGRAM)
    (tmp_path / "res.toml").write_text('llm = "openai:m"\n')
    (tmp_path / "in.jsonl").write_text('{"prompt": "hi"}\n')
    options = ["-i", "in.jsonl", "-o", "out.jsonl"] if command == "run" else ["--port", "0"]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    child = subprocess.Popen(
        interruptible(
            [sys.executable, "-m", "plait", command, "prog.py:make", "-r", "res.toml", *options]
        ),
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        give_up = time.monotonic() + 60
        while not (tmp_path / "loading").exists():
            assert child.poll() is None and time.monotonic() < give_up, "the program never loaded"
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=30)  # well under the import's minute
    finally:
        child.kill()
    assert child.returncode == 130, stderr
    assert stderr.splitlines() == ["plait: stopped by Ctrl-C"]
