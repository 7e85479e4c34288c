"""examples/port_from_dspy.py run as a user runs it: a subprocess, its printout, its saved file.

On the scripted server the model is known: it answers every review "positive"
unless the request shows worked examples, so the program as written scores half
and BootstrapFewShot's demos are what fix it. On the embedded SmolLM2 (slow)
what the model answers is not fixed, but the port must run to the end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plait import Predict
from plait.testing import server_in_thread

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "port_from_dspy.py"
SOURCE = ROOT / "src"
NEGATIVE_WORDS = ("broke", "tore", "scratched", "small", "stopped", "leaks", "waste")


def needs_examples(body: dict[str, Any]) -> str:
    """A model that is right only when the request carries demos (turns before the question)."""
    messages = body["messages"]
    review = messages[-1]["content"].lower()
    shown_demos = len(messages) > 2
    negative = shown_demos and any(word in review for word in NEGATIVE_WORDS)
    return json.dumps({"sentiment": "negative" if negative else "positive"})


def run_port(tmp_path: Path, *extra: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--save", str(tmp_path / "sentiment.json"), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,  # the user's own folder
        env={**os.environ, "PYTHONPATH": str(SOURCE)},  # this checkout's plait
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_port_learns_demos_that_fix_the_program_and_saves_them(tmp_path: Path) -> None:
    with server_in_thread(responder=needs_examples) as server:
        out = run_port(tmp_path, "--base-url", server.base_url, "--model", "scripted")
    assert "trial 0: score 0.50 {} as it was" in out
    assert "kept trial 1:" in out  # the bootstrapped demos won
    assert "dev score: 1.00 (8 examples" in out
    assert "saved 2 demos to" in out
    # the saved file brings the demos back into a fresh program, as the example says
    fresh = Predict(example_module().Sentiment)
    fresh.load(tmp_path / "sentiment.json")
    assert len(fresh.demos.value) == 2


def example_module() -> Any:
    spec = importlib.util.spec_from_file_location("port_from_dspy", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its signature's annotations resolve in it
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_port_runs_on_the_embedded_model(tmp_path: Path) -> None:
    out = run_port(tmp_path, timeout=600)
    assert "trial 0: score" in out and "kept trial" in out
    assert "dev score:" in out and (tmp_path / "sentiment.json").exists()
