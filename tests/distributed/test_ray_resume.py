"""A Ray Data job with a state store, its driver killed with SIGKILL mid-way and started
again: it sends only the rows not done (the scripted server answers every row once)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plait.resources.state import open_store, release_store
from plait.testing import server_in_thread

pytest.importorskip("ray")
pytest.importorskip("ray.data")

from tests.distributed.resume_job import IN_FLIGHT, ROWS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "state.sqlite")
    return str(request.getfixturevalue("state_url"))


def _rows_kept(url: str) -> int:
    store = open_store(url)
    try:
        return store.count("checkpoints")
    finally:
        release_store(store)


@pytest.mark.timeout(300)
def test_a_ray_data_job_killed_mid_way_sends_only_the_rows_not_done(
    tmp_path: Path, url: str
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    output = tmp_path / "out.json"
    # Waves of IN_FLIGHT replies every 1.5 s: the kill lands just after a wave is kept.
    with server_in_thread(latency=1.5) as server:
        command = [sys.executable, "-m", "tests.distributed.resume_job", url,
                   server.base_url, str(output)]  # fmt: skip
        job = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE)
        store = open_store(url)  # one connection for the polling: cheap on a loaded machine
        try:
            while store.count("checkpoints") < 2 * IN_FLIGHT:
                assert job.poll() is None, job.stderr.read() if job.stderr else ""
                time.sleep(0.02)
            job.send_signal(signal.SIGKILL)  # the driver: its local cluster ends with it
        finally:
            release_store(store)
            job.kill()
            job.wait()
        assert _rows_kept(url) < ROWS and not output.exists()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=240)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        log = list(server.stats.log)

    answered: dict[str, int] = {}
    for record in log:
        if record.status == 200:
            text = record.body["messages"][-1]["content"]
            answered[text] = answered.get(text, 0) + 1
    # Every row answered, and again only if its reply was on its way when the driver was
    # killed (answered, not yet kept: at most the requests in flight then); none twice else.
    assert set(answered) == {f"row {n}" for n in range(ROWS)}
    again = [text for text, count in answered.items() if count > 1]
    assert len(again) <= IN_FLIGHT and all(answered[text] == 2 for text in again), answered
    assert json.loads(output.read_text()) == [[n, f"echo: row {n}", None] for n in range(ROWS)]
