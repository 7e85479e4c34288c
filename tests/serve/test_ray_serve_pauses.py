"""Two Ray Serve replicas sharing paused runs through the state store (a real PostgreSQL).

A run paused on one replica is resumed on the other, and a run resumed through both at
once runs once: one client gets 200, the other 409. Each run notes, in a file, the process
that paused it and the one that resumed it (`serve.ray_programs.ApprovedAgent`).
"""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from plait.testing import server_in_thread
from serve.test_cli_serve import call_then_answer

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")

from ray import serve  # noqa: E402

from plait.serve.ray_serve import run  # noqa: E402
from serve.ray_programs import approved_agents  # noqa: E402
from serve.support import free_port, start_ray, upstream  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]
RUNS = 12


def test_two_replicas_resume_each_others_pauses_once(state_url: str, tmp_path: Path) -> None:
    log = tmp_path / "runs.log"
    path = os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)])
    env = {"PYTHONPATH": path, "PLAIT_APPROVAL_KEY": "k" * 40, "PLAIT_TEST_RUNS_LOG": str(log)}
    with server_in_thread(responder=call_then_answer) as upstream_server:
        start_ray(env)
        port = free_port()
        try:
            run(
                approved_agents,
                upstream(upstream_server),
                replicas=2,
                port=port,
                state=state_url,
                ray_options={"ray_actor_options": {"num_cpus": 0}},
            )
            paused, resumed = asyncio.run(_pause_and_resume(f"http://127.0.0.1:{port}"))
        finally:
            serve.shutdown()
            ray.shutdown()
    assert [p.status_code for p in paused] == [202] * RUNS, paused[0].text
    for pair in resumed:
        assert sorted(r.status_code for r in pair) == [200, 409], [r.text for r in pair]
    where: dict[str, list[str]] = defaultdict(list)
    for line in log.read_text().splitlines():
        request, pid = line.split()
        where[request].append(pid)
    assert all(len(pids) == 2 for pids in where.values())  # paused once, resumed once
    assert len(where) == RUNS
    assert len({pids[0] for pids in where.values()}) == 2  # both replicas paused runs
    assert any(pids[0] != pids[1] for pids in where.values())  # resumed by the other one


async def _pause_and_resume(
    url: str,
) -> tuple[list[httpx.Response], list[list[httpx.Response]]]:
    answers = {"answers": {"call_1": "yes"}}
    paused = []
    for n in range(RUNS):  # a fresh connection each: the proxy chooses a replica each time
        async with httpx.AsyncClient(timeout=120) as client:
            paused.append(
                await client.post(f"{url}/programs/agent/run", json={"request": f"clean-{n}"})
            )
    resumed = []
    limits = httpx.Limits(max_connections=2)
    for answer in paused:
        resume = f"{url}/programs/agent/runs/{answer.json()['run_id']}/resume"
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            pair = await asyncio.gather(*(client.post(resume, json=answers) for _ in range(2)))
        resumed.append(list(pair))
    return paused, resumed
