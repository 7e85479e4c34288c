"""Paused runs in the state store: any ``plait serve`` process resumes any pause, exactly once.

The processes are real ``plait serve`` subprocesses (uvicorn) sharing the session's real
PostgreSQL server (tests/postgres_server.py); the store's own rules run on SQLite too.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from plait.resources.state import open_store, release_store
from plait.serve.pending import PendingRun, PendingStoreFull
from plait.serve.pending_state import StatePendingStore
from plait.testing import ScriptedServer
from postgres_server import PostgresServer
from serve.support import free_port
from serve.test_cli_serve import (
    AGENT,
    _listening_url,
    call_then_answer,
    environment,
    files,
    plait_command,
)

ANSWERS = {"answers": {"call_1": "yes"}}


def run(run_id: str, owner: str | None = "alice", created: float | None = None) -> PendingRun:
    pause = {"confirmation_id": "call_1", "approval_id": f"approval-{run_id}"}
    if created is None:
        return PendingRun(run_id, "agent", {"request": "clean"}, pause, owner=owner)
    return PendingRun(run_id, "agent", {"request": "clean"}, pause, created, owner)


async def test_a_pause_is_taken_once_and_then_known_as_resumed(url: str) -> None:
    first, second = StatePendingStore(url), StatePendingStore(url)
    try:
        await first.put(run("r1"))
        assert await second.get("r1") == run("r1", created=(await first.get("r1")).created)  # type: ignore[union-attr]

        async def resume(store: StatePendingStore) -> object:
            taken = await store.take("r1")  # a loser finds it gone, never merely unknown
            return taken if taken is not None else await store.gone("r1")

        outcomes = await asyncio.gather(*(resume(store) for store in (first, second) * 4))
        assert sum(isinstance(o, PendingRun) for o in outcomes) == 1
        assert outcomes.count(("resumed", "alice")) == 7
        assert (await second.gone("r1")) == ("resumed", "alice")
        assert await first.get("r1") is None
    finally:
        await first.aclose()
        await second.aclose()


async def test_the_bounds_are_counted_in_the_store_not_in_a_process(url: str) -> None:
    first = StatePendingStore(url, max_runs=3, max_per_owner=2)
    await first.put(run("a1"))
    await first.put(run("a2"))
    await first.aclose()  # another process, later, sees the runs the first kept
    second = StatePendingStore(url, max_runs=3, max_per_owner=2)
    try:
        with pytest.raises(PendingStoreFull) as full:
            await second.put(run("a3"))
        assert full.value.per_owner
        await second.put(run("b1", owner="bob"))
        with pytest.raises(PendingStoreFull) as full:
            await second.put(run("b2", owner="bob"))
        assert not full.value.per_owner  # three wait: the store is full
        await second.take("a1")
        await second.put(run("b2", owner="bob"))  # a resumed run gave its place back
    finally:
        await second.aclose()


async def test_an_expired_pause_frees_its_place_and_is_known_as_expired(url: str) -> None:
    store = StatePendingStore(url, ttl=60, max_runs=1)
    try:
        await store.put(run("old", created=0.0))  # paused long ago
        await store.put(run("new"))  # the expired one's place is free
        assert (await store.gone("old")) == ("expired", "alice")
        assert await store.get("old") is None and await store.get("new") is not None
    finally:
        await store.aclose()


async def test_a_stored_run_that_is_not_plaits_is_refused_not_parsed(url: str) -> None:
    state = open_store(url)
    store = StatePendingStore(url)
    try:
        state.put("pauses", "run/bad", b'{"program": "agent"}\n[1, 2]\n{}')
        with pytest.raises(Exception, match="the run bad holds no JSON object"):
            await store.get("bad")
        state.put("pauses", "run/big", b'{"program": "agent"}\n"' + b"x" * 64 + b'"\n{}')
        small = StatePendingStore(url, max_state_bytes=32)
        with pytest.raises(Exception, match="the run big holds 68 bytes, over"):
            await small.get("big")
        await small.aclose()
    finally:
        await store.aclose()
        release_store(state)


def test_an_approval_is_used_once_across_stores(url: str) -> None:
    first, second = StatePendingStore(url), StatePendingStore(url)
    assert first.use("approval-1") and not second.use("approval-1")
    assert second.is_used("approval-1") and not second.is_used("approval-2")
    asyncio.run(first.aclose())
    asyncio.run(second.aclose())


async def _serve(command: list[str], env: dict[str, str]) -> tuple[asyncio.subprocess.Process, str]:
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stderr=asyncio.subprocess.PIPE
    )
    return process, await _listening_url(process)


async def _stop(process: asyncio.subprocess.Process) -> int:
    process.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(process.wait(), 60)


async def test_two_servers_share_pauses_and_a_run_is_resumed_once(
    state_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "ran.txt"
    program = tmp_path / "agent.py"
    program.write_text(AGENT.format(log=str(log)))
    env = {**environment(), "PLAIT_APPROVAL_KEY": "k" * 40}
    async with ScriptedServer(responder=call_then_answer) as server:
        _, resources = files(tmp_path, server.base_url)
        command = plait_command(
            "serve", f"agent={program}:make", "-r", str(resources), "--port", "0",
            "--state", state_url,
        )  # fmt: skip
        first, first_url = await _serve(command, env)
        second, second_url = await _serve(command, env)
        try:
            async with httpx.AsyncClient(timeout=60) as client:
                paused = await client.post(
                    f"{first_url}/programs/agent/run", json={"request": "clean"}
                )
                run_id = paused.json()["run_id"]
                shown = await client.get(f"{second_url}/programs/agent/runs/{run_id}")
                resumes = await asyncio.gather(
                    *(
                        client.post(f"{url}/programs/agent/runs/{run_id}/resume", json=ANSWERS)
                        for url in (second_url, first_url)
                    )
                )
        finally:
            codes = [await _stop(first), await _stop(second)]
    assert paused.status_code == 202, paused.text
    assert shown.status_code == 200 and shown.json()["status"] == "paused"
    assert sorted(r.status_code for r in resumes) == [200, 409], [r.text for r in resumes]
    done = next(r for r in resumes if r.status_code == 200)
    assert done.json()["output"] == {"reply": "deleted /tmp/x"}
    assert log.read_text().splitlines() == ["/tmp/x"]  # the approved call ran once
    assert codes == [0, 0]


def test_serve_refuses_an_unreachable_store_in_one_line(tmp_path: Path) -> None:
    program, resources = files(tmp_path, "http://127.0.0.1:9/v1")
    port = free_port()
    url = f"postgresql://plait:s3cret-word@127.0.0.1:{port}/plait?schema=shop"
    for workers in ("1", "2"):
        done = subprocess.run(
            plait_command(
                "serve", f"{program}:make", "-r", str(resources), "--state", url,
                "--workers", workers, "--max-active", "2",
            ),
            capture_output=True, text=True, env=environment(), timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("plait: error: "), lines
        assert f"127.0.0.1:{port}" in lines[0] and "unreachable" in lines[0]
        assert "s3cret" not in lines[0]


def clean_each(body: dict) -> object:
    """Asks to delete a file named after the run's request, then answers with the result."""
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if not results:
        asked = re.findall(r"clean-\d+", json.dumps(body["messages"]))[-1]
        call = {"id": "call_1", "name": "delete_file", "arguments": {"path": asked}}
        return {"tool_calls": [call]}
    return json.dumps({"reply": " / ".join(results)})


async def test_a_database_restart_under_resumes_loses_no_pause_and_runs_none_twice(
    postgres_server: PostgresServer, state_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "ran.txt"
    program = tmp_path / "agent.py"
    program.write_text(AGENT.format(log=str(log)))
    env = {**environment(), "PLAIT_APPROVAL_KEY": "k" * 40}
    runs = 16
    async with ScriptedServer(responder=clean_each) as server:
        _, resources = files(tmp_path, server.base_url)
        command = plait_command(
            "serve", f"agent={program}:make", "-r", str(resources), "--port", "0",
            "--state", state_url,
        )  # fmt: skip
        process, url = await _serve(command, env)
        assert process.stderr is not None
        told = asyncio.ensure_future(process.stderr.read())
        answers: dict[str, list[int]] = {}
        spans: list[tuple[float, float]] = []
        try:
            async with httpx.AsyncClient(timeout=60) as client:
                ids = []
                for n in range(runs):
                    paused = await client.post(
                        f"{url}/programs/agent/run", json={"request": f"clean-{n}"}
                    )
                    assert paused.status_code == 202, paused.text
                    ids.append(paused.json()["run_id"])

                async def resume(run_id: str, start: float) -> None:
                    await asyncio.sleep(start)  # spread over the restart
                    seen = answers.setdefault(run_id, [])
                    for _ in range(600):  # until it ran (200) or another resume did (409)
                        sent = time.monotonic()
                        reply = await client.post(
                            f"{url}/programs/agent/runs/{run_id}/resume", json=ANSWERS
                        )
                        seen.append(reply.status_code)
                        spans.append((sent, time.monotonic()))
                        if reply.status_code in (200, 409):
                            return
                        await asyncio.sleep(0.05)

                def restart_server() -> tuple[float, float]:
                    began = time.monotonic()
                    postgres_server.restart()
                    return began, time.monotonic()

                restart = asyncio.ensure_future(asyncio.to_thread(restart_server))
                resumes = [resume(run_id, n * 0.1) for n, run_id in enumerate(ids)]
                resumes += [resume(run_id, n * 0.1) for n, run_id in enumerate(ids)]
                await asyncio.gather(*resumes, restart)
                down = restart.result()
        finally:
            code = await _stop(process)
            await told
    finals = {run_id: [s for s in seen if s in (200, 409)] for run_id, seen in answers.items()}
    assert all(sorted(f) == [200, 409] for f in finals.values()), answers
    ran = log.read_text().splitlines()
    assert sorted(ran) == sorted(f"clean-{n}" for n in range(runs))  # each once, none lost
    others = {s for seen in answers.values() for s in seen} - {200, 409}
    assert others <= {503}, answers  # in the outage: "retry", never "unknown"
    # resumes were in flight while the server restarted (not all before, nor all after)
    assert any(sent < down[1] and done > down[0] for sent, done in spans), (down, spans)
    assert code == 0
