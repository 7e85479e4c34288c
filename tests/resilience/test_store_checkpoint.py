"""Run checkpoints in a state store (SQLite and PostgreSQL): a ``plait run`` killed with
SIGKILL resumes in another working folder and home directory sending only the rows not done;
a database restarted mid-run loses no row and does none twice."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from killed_runs import assert_each_row_answered_once, kill_once_kept, rows_kept
from plait import LLMInference, run
from plait.resources import ResourceConfig
from plait.resources.state import StateOversized, StateWarning
from plait.testing import ScriptedServer, fetch_stats, start_server_process
from postgres_server import PostgresServer

SRC = str(Path(__file__).resolve().parents[2] / "src")
ROWS = 24
IN_FLIGHT = 4

PROGRAM = """
import plait

class Echo(plait.Module):
    def __init__(self):
        super().__init__()
        self.llm = plait.LLMInference("fast", temperature=0.0)

    def forward(self, text):
        return self.llm(text)
"""


def _machine(base: Path, name: str, base_url: str) -> tuple[Path, dict[str, str]]:
    """A working folder with its own copy of the program, rows and resources, and an
    environment whose HOME is a folder of its own."""
    folder = base / name / "work"
    home = base / name / "home"
    folder.mkdir(parents=True)
    home.mkdir(parents=True)
    (folder / "prog.py").write_text(PROGRAM)
    rows = "".join(json.dumps({"text": f"row {n}"}) + "\n" for n in range(ROWS))
    (folder / "rows.jsonl").write_text(rows)
    (folder / "res.toml").write_text(
        f'[fast]\nprovider = "openai"\nmodel = "scripted"\nbase_url = "{base_url}"\n'
        f'api_key = "test-key"\nmax_concurrent = {IN_FLIGHT}\n'
    )
    env = {**os.environ, "PYTHONPATH": SRC, "HOME": str(home)}
    env.pop("PLAIT_CACHE_DIR", None)
    env.pop("XDG_CACHE_HOME", None)
    return folder, env


def _command(url: str) -> list[str]:
    return [sys.executable, "-m", "plait", "run", "prog.py:Echo", "-i", "rows.jsonl", "-o",
            "out.jsonl", "-r", "res.toml", "--state", url, "--no-progress"]  # fmt: skip


@pytest.mark.timeout(180)
def test_a_run_killed_on_one_machine_resumes_on_another_sending_each_row_once(
    tmp_path: Path, url: str
) -> None:
    # Replies come in waves of IN_FLIGHT every 1.5 s: the kill lands right after a wave's
    # rows are kept, so the rows in flight then are sent again, and answered twice only if
    # the kill came late (a loaded machine) and caught their replies answered, not yet kept.
    with start_server_process(latency=1.5, keep_log=True) as (_server, base_url):
        first_dir, first_env = _machine(tmp_path, "first", base_url)
        job = subprocess.Popen(_command(url), cwd=first_dir, env=first_env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        kill_once_kept(job, url, 2 * IN_FLIGHT)
        assert job.returncode == -signal.SIGKILL
        kept = rows_kept(url)
        assert 2 * IN_FLIGHT <= kept < ROWS

        second_dir, second_env = _machine(tmp_path, "second", base_url)
        done = subprocess.run(_command(url), cwd=second_dir, env=second_env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        log = fetch_stats(base_url, include_log=True)["log"]

    assert_each_row_answered_once(log, ROWS, IN_FLIGHT)
    assert len(log) <= ROWS + IN_FLIGHT  # only rows in flight at the kill were sent again
    outputs = [json.loads(line) for line in (second_dir / "out.jsonl").read_text().splitlines()]
    assert [o["row"] for o in outputs] == list(range(ROWS))  # every output row written once
    assert [o["output"] for o in outputs] == [f"echo: row {n}" for n in range(ROWS)]
    assert rows_kept(url) == ROWS
    shutil.rmtree(tmp_path / "first")  # nothing of the first machine was needed


def _config(server: ScriptedServer, url: str) -> ResourceConfig:
    endpoint = {"provider": "openai", "model": "scripted", "base_url": server.base_url,
                "api_key": "test-key", "max_concurrent": 8}  # fmt: skip
    return ResourceConfig({"fast": endpoint}, state=url)


@pytest.fixture
async def server() -> Any:
    async with ScriptedServer() as running:
        yield running


async def test_a_rerun_in_python_is_answered_from_the_store(
    server: ScriptedServer, url: str
) -> None:
    program = LLMInference("fast", temperature=0.0)
    items = [f"q{n}" for n in range(30)]
    first = await run(program, items, resources=_config(server, url), progress=False)
    assert server.stats.requests == 30
    again = await run(program, items[::-1], resources=_config(server, url), progress=False)
    assert again == first[::-1] and server.stats.requests == 30  # found by input, not place
    other = LLMInference("fast", temperature=0.5)  # another program: its own rows
    await run(other, items[:3], resources=_config(server, url), progress=False)
    assert server.stats.requests == 33
    await run(program, items[:3], resources=_config(server, url), progress=False, cache=False)
    assert server.stats.requests == 36  # cache=False: nothing stored answers the run


async def _restart_after(server: PostgresServer, url: str, rows: int) -> None:
    """Restarts the database once ``rows`` rows are kept."""
    for _ in range(1000):
        if rows_kept(url) >= rows:
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail(f"the run never kept {rows} rows in the store")
    await asyncio.to_thread(server.restart)


async def test_the_database_restarted_mid_run_loses_no_row_and_does_none_twice(
    postgres_server: PostgresServer,
    state_url: str,
    server: ScriptedServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server.latency = 0.05
    program = LLMInference("fast", temperature=0.0)
    items = [f"r{n}" for n in range(200)]
    config = _config(server, state_url)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StateWarning)  # no row may be given up
        batch = run(program, items, resources=config, progress=False, max_concurrent=8)
        outputs, _ = await asyncio.gather(batch, _restart_after(postgres_server, state_url, 40))
    assert "the store did not take" in caplog.text  # the restart cut writes mid-run
    assert outputs == [f"echo: {item}" for item in items]
    assert rows_kept(state_url) == len(items)  # every row written, after the restart too
    sent = server.stats.requests
    assert sent == len(items)
    again = await run(program, items, resources=config, progress=False)
    assert again == outputs and server.stats.requests == sent  # none done twice


async def test_a_row_over_the_cap_stops_the_rerun_by_name_rather_than_run_it_again(
    server: ScriptedServer, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = LLMInference("fast", temperature=0.0)
    items = ["short", "long " * 200]
    await run(program, items, resources=_config(server, url), progress=False)
    assert server.stats.requests == 2
    # The cap falls between the two rows: the long one is now a row plait does not read
    # (written by another program, or by a plait of a larger cap).
    for name in ("plait.resources.state.sqlite", "plait.resources.state.postgres"):
        if name in sys.modules:
            monkeypatch.setattr(sys.modules[name], "MAX_VALUE_BYTES", 600)
    with pytest.raises(StateOversized, match=r"row 'run/\w+/\w+' of table checkpoints is 1,"):
        await run(program, items, resources=_config(server, url), progress=False)
    assert server.stats.requests == 2  # neither row was sent again
