"""What the tests of a run killed with SIGKILL and resumed from a state store share.

A `plait run` (tests/resilience/test_store_checkpoint.py) and a Ray Data job
(tests/distributed/test_ray_resume.py) each keep their finished rows ``row 0``,
``row 1``, ... in the store's table ``checkpoints``; the test kills the process once
some rows are kept, runs it again, and reads the scripted server's log to see that the
rerun sent only the rows not done.
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

from plait.resources.state import open_store, release_store


def rows_kept(url: str) -> int:
    """Returns how many rows the store of ``url`` keeps in its table ``checkpoints``."""
    store = open_store(url)
    try:
        return store.count("checkpoints")
    finally:
        release_store(store)


def kill_once_kept(job: subprocess.Popen[Any], url: str, rows: int) -> None:
    """Sends SIGKILL to ``job`` once the store of ``url`` keeps ``rows`` rows.

    The store is polled on one connection (cheap on a loaded machine). The test fails,
    showing the job's standard error, if the job ends first; the job is ended and waited
    for whatever happens.
    """
    store = open_store(url)
    try:
        while store.count("checkpoints") < rows:
            assert job.poll() is None, job.stderr.read() if job.stderr else ""
            time.sleep(0.02)
        job.send_signal(signal.SIGKILL)
    finally:
        release_store(store)
        job.kill()
        job.wait()


def assert_each_row_answered_once(log: list[dict[str, Any]], rows: int, in_flight: int) -> None:
    """Checks the scripted server's request log (`ServerStats.as_dict` records) of a killed
    and resumed run: every row ``row N`` was answered, and answered again only if its reply
    was on its way when the process was killed (answered, not yet kept: at most the
    ``in_flight`` requests in flight then, each answered twice at most); none twice else.
    """
    answered: dict[str, int] = {}
    for record in log:
        if record["status"] == 200:
            text = record["body"]["messages"][-1]["content"]
            answered[text] = answered.get(text, 0) + 1
    assert set(answered) == {f"row {n}" for n in range(rows)}
    again = [text for text, count in answered.items() if count > 1]
    assert len(again) <= in_flight and all(answered[text] == 2 for text in again), answered
