"""Human approval over HTTP: a paused run is resumed once with the person's answers.

The scripted model asks for a tool call first and answers with the tool's result after it;
the tool is real and writes each call that ran to a file, so each test checks what ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from plait import History, ReAct, Signature, tool
from plait.confirmation import set_approval_key, set_approval_ledger
from plait.errors import FileError
from plait.serve import PendingRun, SQLitePendingStore, app
from plait.testing import ScriptedServer
from serve.support import serving, sse_events, upstream


@pytest.fixture(autouse=True)
def _default_approvals():
    """Each test starts and ends with the process's own key and in-memory ledger."""
    set_approval_key(None)
    set_approval_ledger(None)
    yield
    set_approval_key(None)
    set_approval_ledger(None)


def call_then_answer(body: dict[str, Any]) -> Any:
    """The model: a call of ``delete_file`` first; then a reply made of the tool results."""
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if not results:
        call = {"id": "call_1", "name": "delete_file", "arguments": {"path": "/tmp/x"}}
        return {"content": "On it.", "tool_calls": [call]}
    return json.dumps({"reply": " / ".join(results)})


def agent(log: Path, signature: Any = "request -> reply", **options: Any) -> ReAct:
    @tool(require_confirmation=True)
    def delete_file(path: str) -> str:
        """Deletes a file."""
        with log.open("a") as file:
            file.write(f"{path}\n")
        return f"deleted {path}"

    return ReAct(signature, tools=[delete_file], max_iters=3, **options)


YES = {"answers": {"call_1": "yes"}}


@contextlib.asynccontextmanager
async def session(
    programs: dict[str, Any], **options: Any
) -> AsyncIterator[tuple[str, httpx.AsyncClient, Any]]:
    """Serves ``programs`` with the scripted model upstream; yields the URL, a client, the app."""
    async with ScriptedServer(responder=call_then_answer) as server:
        served = app(programs, upstream(server), **options)
        async with serving(served) as url, httpx.AsyncClient(timeout=60) as client:
            yield url, client, served


def ran(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


async def pause(client: httpx.AsyncClient, url: str, program: str = "agent") -> dict[str, Any]:
    paused = await client.post(f"{url}/programs/{program}/run", json={"request": "clean up"})
    assert paused.status_code == 202, paused.text
    return paused.json()


def resume_url(url: str, run_id: str, program: str = "agent") -> str:
    return f"{url}/programs/{program}/runs/{run_id}/resume"


async def test_a_yes_runs_the_call_once_and_a_second_resume_is_409(tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    async with session({"agent": agent(log)}) as (url, client, _):
        paused = await pause(client, url)
        run_id = paused["run_id"]
        resumed = await client.post(resume_url(url, run_id), json=YES)
        again = await client.post(resume_url(url, run_id), json=YES)
        unknown = await client.post(resume_url(url, "nope"), json=YES)
        shown = await client.get(f"{url}/programs/agent/runs/{run_id}")
    assert paused["pending"][0]["call_id"] == "call_1"
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["status"] == "completed"
    assert resumed.json()["output"] == {"reply": "deleted /tmp/x"}
    assert resumed.json()["usage"]["calls"] == 1  # the model was not asked again for the call
    assert again.status_code == 409 and again.json()["error"]["type"] == "already_resumed"
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found"
    assert shown.status_code == 404
    assert ran(log) == ["/tmp/x"]


async def test_a_resume_streams_the_rest_of_the_run(tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    async with session({"agent": agent(log)}) as (url, client, _):
        run_id = (await pause(client, url))["run_id"]
        streamed = await client.post(resume_url(url, run_id) + "?stream=true", json=YES)
    events = sse_events(streamed.text)
    results = [data for name, data in events if name == "tool_result"]
    assert results and results[0]["content"] == "deleted /tmp/x" and results[0]["ok"]
    assert events[-1][0] == "output"
    assert events[-1][1]["output"] == {"reply": "deleted /tmp/x"}
    assert ran(log) == ["/tmp/x"]


async def test_edited_arguments_run_instead_and_a_no_does_not_run(tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    programs = {"agent": agent(log), "strict": agent(log, on_decline="raise")}
    async with session(programs) as (url, client, _):
        edited = await client.post(
            resume_url(url, (await pause(client, url))["run_id"]),
            json={"answers": {"call_1": {"path": "/tmp/y"}}},
        )
        declined = await client.post(
            resume_url(url, (await pause(client, url))["run_id"]),
            json={"answers": {"call_1": "not that one"}},
        )
        strict_id = (await pause(client, url, "strict"))["run_id"]
        rejected = await client.post(
            resume_url(url, strict_id, "strict") + "?stream=true",
            json={"answers": {"call_1": "no"}},
        )
    assert edited.json()["output"]["reply"].endswith("deleted /tmp/y")
    assert declined.status_code == 200 and "declined" in declined.json()["output"]["reply"]
    name, body = sse_events(rejected.text)[-1]
    assert name == "rejected" and body["status"] == "rejected" and body["call_id"] == "call_1"
    assert "declined" in body["message"]
    assert ran(log) == ["/tmp/y"]


async def test_answers_for_calls_not_pending_are_a_422_and_the_run_keeps_waiting(
    tmp_path: Path,
) -> None:
    log = tmp_path / "ran.txt"
    async with session({"agent": agent(log)}) as (url, client, _):
        run_id = (await pause(client, url))["run_id"]
        stranger = await client.post(
            resume_url(url, run_id), json={"answers": {"call_1": "yes", "call_9": "yes"}}
        )
        missing = await client.post(resume_url(url, run_id), json={"answers": {}})
        bad_shape = await client.post(resume_url(url, run_id), json={"answer": "yes"})
        assert ran(log) == []
        resumed = await client.post(resume_url(url, run_id), json={"answers": {"call_1": "y"}})
    assert stranger.status_code == 422
    assert stranger.json()["error"]["message"].startswith("answers.call_9: not a pending call")
    assert missing.status_code == 422 and "call_1" in missing.json()["error"]["message"]
    assert bad_shape.status_code == 422
    assert resumed.status_code == 200 and ran(log) == ["/tmp/x"]


async def test_two_resumes_at_once_run_it_once_and_the_other_is_409(tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    store = SQLitePendingStore(tmp_path / "pending.sqlite")
    async with session({"agent": agent(log)}, pending_store=store) as (url, client, _):
        run_id = (await pause(client, url))["run_id"]
        both = await asyncio.gather(
            *(client.post(resume_url(url, run_id), json=YES) for _ in range(2))
        )
    assert sorted(r.status_code for r in both) == [200, 409]
    assert ran(log) == ["/tmp/x"]


async def test_a_tampered_stored_state_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    async with session({"agent": agent(log)}) as (url, client, served):
        run_id = (await pause(client, url))["run_id"]
        store = served.state.runs.pending
        stored = await store.get(run_id)
        changed = {**stored.pause, "arguments": {"path": "/etc"}}
        await store.put(dataclasses.replace(stored, pause=changed))
        refused = await client.post(resume_url(url, run_id), json=YES)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["type"] == "resume_refused"
    assert "was changed after it was made" in refused.json()["error"]["message"]
    assert ran(log) == []


async def test_a_replayed_state_is_refused_by_the_ledger_in_the_store(tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    store = SQLitePendingStore(tmp_path / "pending.sqlite")
    async with session({"agent": agent(log)}, pending_store=store) as (url, client, _):
        run_id = (await pause(client, url))["run_id"]
        copy = await store.get(run_id)
        first = await client.post(resume_url(url, run_id), json=YES)
        await store.put(dataclasses.replace(copy, run_id="replayed"))  # a restored backup
        replay = await client.post(resume_url(url, "replayed"), json=YES)
    assert first.status_code == 200
    assert replay.status_code == 409 and "already used" in replay.json()["error"]["message"]
    assert ran(log) == ["/tmp/x"]


async def test_an_expired_run_is_410(tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    async with session({"agent": agent(log)}, pending_ttl=0.2) as (url, client, _):
        run_id = (await pause(client, url))["run_id"]
        await asyncio.sleep(0.5)  # well past the 0.2 s a paused run is kept
        expired = await client.post(resume_url(url, run_id), json=YES)
    assert expired.status_code == 410 and expired.json()["error"]["type"] == "expired"
    assert ran(log) == []


async def test_a_pause_over_the_size_limit_is_507(tmp_path: Path) -> None:
    async with session({"agent": agent(tmp_path / "ran.txt")}, max_pending_bytes=100) as (
        url,
        client,
        _,
    ):
        too_large = await client.post(f"{url}/programs/agent/run", json={"request": "x"})
    assert too_large.status_code == 507
    assert "limit of 100" in too_large.json()["error"]["message"]


async def test_a_conversation_program_resumes_with_the_conversation_it_paused_on(
    tmp_path: Path,
) -> None:
    log = tmp_path / "ran.txt"
    chat = agent(log, Signature.from_string("turns: History -> reply", types={"History": History}))
    async with session({"chat": chat}) as (url, client, _):
        paused = await client.post(
            f"{url}/programs/chat/run",
            json={"turns": [{"role": "user", "content": "delete /tmp/x"}]},
        )
        resumed = await client.post(resume_url(url, paused.json()["run_id"], "chat"), json=YES)
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["output"] == {"reply": "deleted /tmp/x"}


def test_the_store_refuses_planted_links_and_hands_a_run_out_once(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.sqlite"
    for planted in ("linked.sqlite", "linked2.sqlite-wal"):
        os.symlink(target, tmp_path / planted)
    with pytest.raises(FileError, match="symbolic link"):
        SQLitePendingStore(tmp_path / "linked.sqlite")
    with pytest.raises(FileError, match="symbolic link"):
        SQLitePendingStore(tmp_path / "linked2.sqlite")
    assert not target.exists()

    path = tmp_path / "pending.sqlite"
    run = PendingRun("r1", "agent", {"request": "x"}, {"confirmation_id": "c"})
    asyncio.run(SQLitePendingStore(path).put(run))
    stores = [SQLitePendingStore(path) for _ in range(8)]  # one connection each, as processes
    got: list[Any] = []
    start = threading.Barrier(len(stores))

    def take(store: SQLitePendingStore) -> None:
        start.wait()
        got.append(asyncio.run(store.take("r1")))

    threads = [threading.Thread(target=take, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [found.inputs for found in got if found is not None] == [{"request": "x"}]
    assert asyncio.run(stores[0].gone("r1")) == ("resumed", None)


async def test_a_durable_store_without_an_approval_key_is_told_at_start_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PLAIT_APPROVAL_KEY", raising=False)
    db = str(tmp_path / "pending.sqlite")
    async with session({"agent": agent(tmp_path / "ran.txt")}, pending_db=db):
        pass
    assert any(
        "cannot be resumed after a restart" in record.getMessage() for record in caplog.records
    )
