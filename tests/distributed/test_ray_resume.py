"""A Ray Data job with a state store, its driver killed with SIGKILL mid-way and started
again: it sends only the rows not done (the scripted server answers every row once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plait.testing import server_in_thread

pytest.importorskip("ray")
pytest.importorskip("ray.data")

from tests.distributed.resume_job import IN_FLIGHT, ROWS

from killed_runs import assert_each_row_answered_once, kill_once_kept, rows_kept

ROOT = Path(__file__).resolve().parents[2]


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
        kill_once_kept(job, url, 2 * IN_FLIGHT)  # the driver: its local cluster ends with it
        assert rows_kept(url) < ROWS and not output.exists()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=240)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        log = server.stats.as_dict(include_log=True)["log"]

    assert_each_row_answered_once(log, ROWS, IN_FLIGHT)
    assert json.loads(output.read_text()) == [[n, f"echo: row {n}", None] for n in range(ROWS)]
