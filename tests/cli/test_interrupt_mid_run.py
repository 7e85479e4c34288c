"""One Ctrl-C in the middle of a long `plait run`, while its output queue is full, stops it:
one line and exit 130 (the batch's producer waited for room in that queue for ever)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from interruptible import interruptible

SRC = Path(__file__).resolve().parents[2] / "src"

PROGRAM = """
from plait import LLMInference

def make():
    return LLMInference("llm", "Summarize in one line.")
"""


def test_one_ctrl_c_mid_run_stops_a_long_run_with_its_output_queue_full(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    (tmp_path / "res.json").write_text(json.dumps({"llm": {"provider": "test"}}))
    rows = "".join(json.dumps({"prompt": f"row {i}"}) + "\n" for i in range(200_000))
    (tmp_path / "in.jsonl").write_text(rows)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, "-m", "plait", "run", "prog.py:make", "-r", "res.json"]
    child = subprocess.Popen(
        interruptible([*command, "-i", "in.jsonl", "-o", "out.jsonl"]),
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    output = tmp_path / "out.jsonl"
    try:
        give_up = time.monotonic() + 120
        while not (output.exists() and output.stat().st_size > 100_000):
            assert child.poll() is None and time.monotonic() < give_up, "no rows written"
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130, stderr
    assert stderr.splitlines()[-1].startswith("plait: stopped by Ctrl-C;"), stderr
