"""The commands run on uvloop where it is installed; ``import plait`` never loads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SRC

PROGRAM = """
import asyncio
from plait import Module

class LoopName(Module):
    async def forward(self, text: str) -> str:
        return type(asyncio.get_running_loop()).__module__
"""


def loop_of_plait_run(tmp_path: Path, **env: str) -> list[str]:
    """Runs ``plait run`` over two rows with a program that answers its loop's module."""
    (tmp_path / "loop_program.py").write_text(PROGRAM)
    (tmp_path / "res.toml").write_text('["*"]\nprovider = "test"\n')
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    environment = {**os.environ, "PYTHONPATH": str(SRC), **env}
    subprocess.run(
        [sys.executable, "-m", "plait", "run", "loop_program.py:LoopName", "-i", "in.jsonl",
         "-o", "out.jsonl", "-r", "res.toml", "--no-progress"],
        cwd=tmp_path, env=environment, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    return [json.loads(line)["output"] for line in lines]


def test_plait_run_runs_on_uvloop_where_it_is_installed(tmp_path):
    pytest.importorskip("uvloop")

    assert loop_of_plait_run(tmp_path) == ["uvloop", "uvloop"]


def test_plait_event_loop_asyncio_keeps_asyncios_loop(tmp_path):
    assert loop_of_plait_run(tmp_path, PLAIT_EVENT_LOOP="asyncio") == ["asyncio.unix_events"] * 2


def test_import_plait_does_not_load_uvloop():
    code = "import sys, plait; print('uvloop' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(SRC)}, check=True)  # fmt: skip
    assert out.stdout.strip() == "False"


GC_PROGRAM = """
import gc
from plait import Module

class YoungThreshold(Module):
    async def forward(self, text: str) -> str:
        return str(gc.get_threshold()[0])
"""


def test_plait_run_collects_young_objects_far_apart(tmp_path):
    """The collector's young collections come every `YOUNG_OBJECTS` new objects while the
    rows run (they walked the items in flight every few rows at Python's default 700)."""
    from plait.cli.collection import YOUNG_OBJECTS

    (tmp_path / "gc_program.py").write_text(GC_PROGRAM)
    (tmp_path / "res.toml").write_text('["*"]\nprovider = "test"\n')
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n')
    subprocess.run(
        [sys.executable, "-m", "plait", "run", "gc_program.py:YoungThreshold", "-i", "in.jsonl",
         "-o", "out.jsonl", "-r", "res.toml", "--no-progress"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(SRC)}, check=True,
        capture_output=True, timeout=120,
    )  # fmt: skip
    row = json.loads((tmp_path / "out.jsonl").read_text())
    assert int(row["output"]) == YOUNG_OBJECTS


def test_the_collectors_pace_is_restored_after_a_command():
    import gc

    from plait.cli.collection import fewer_collections

    before = gc.get_threshold()
    with fewer_collections():
        inside = gc.get_threshold()
    assert inside[0] > before[0] and inside[1:] == before[1:]
    assert gc.get_threshold() == before
