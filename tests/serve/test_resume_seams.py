"""The seams of a resume (issue 34, items 3, 4 and 9), over real HTTP.

A refused or failed resume loses no approval and runs no call twice; a paused run keeps the
bytes of its media inputs and resumes on them; a paused run is another key's to see only when
it is its own; the paused runs a server keeps are bounded, per key and in all. The scripted
model asks for ``delete_file`` first and answers with the tool's results after; the tool is
real and writes each call that ran to a file, so each test checks what ran.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from media.samples import PDF, png, wav
from plait import Audio, File, Image, InputField, LLMInference, Module, OutputField, Signature
from plait.confirmation import set_approval_key, set_approval_ledger
from plait.errors import FileError
from plait.serve import PendingRun, SQLitePendingStore, app
from plait.testing import ScriptedServer
from plait.testing._faults import Fault
from serve.support import serving, sse_events, until, upstream
from serve.test_approvals import YES, agent, call_then_answer, ran, resume_url


@pytest.fixture(autouse=True)
def _default_approvals():
    """Each test starts and ends with the process's own key and in-memory ledger."""
    set_approval_key(None)
    set_approval_ledger(None)
    yield
    set_approval_key(None)
    set_approval_ledger(None)


class Hold:
    """The model, but a request whose messages say "hold" waits until the test opens it."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    async def __call__(self, body: dict[str, Any]) -> Any:
        if "hold" in json.dumps(body["messages"]):
            await self.opened.wait()
        return call_then_answer(body)


@contextlib.asynccontextmanager
async def serving_with(
    programs: dict[str, Any], responder: Any = call_then_answer, **options: Any
) -> AsyncIterator[tuple[str, httpx.AsyncClient, Any, ScriptedServer]]:
    """Serves ``programs`` with the scripted model; yields the URL, a client, the app and the
    scripted server."""
    async with ScriptedServer(responder=responder) as server:
        served = app(programs, upstream(server), **options)
        async with serving(served) as url, httpx.AsyncClient(timeout=60) as client:
            yield url, client, served, server


async def paused_run(
    client: httpx.AsyncClient, url: str, body: dict[str, Any] | None = None, **headers: str
) -> str:
    answer = await client.post(
        f"{url}/programs/agent/run", json=body or {"request": "clean up"}, headers=headers
    )
    assert answer.status_code == 202, answer.text
    return str(answer.json()["run_id"])


# -- item 3: a refused resume keeps the run waiting ---------------------------------------


async def test_a_resume_refused_for_want_of_a_place_leaves_the_run_waiting(
    tmp_path: Path,
) -> None:
    log = tmp_path / "ran.txt"
    hold = Hold()
    options = {"max_active": 1, "max_queued": 0}
    async with serving_with({"agent": agent(log)}, hold, **options) as (url, client, served, _):
        run_id = await paused_run(client, url)
        held = asyncio.ensure_future(
            client.post(f"{url}/programs/agent/run", json={"request": "hold the place"})
        )
        await until(lambda: served.state.runs.admission.active == 1, "the held run")
        refused = await client.post(resume_url(url, run_id), json=YES)
        refused_stream = await client.post(resume_url(url, run_id) + "?stream=true", json=YES)
        shown = await client.get(f"{url}/programs/agent/runs/{run_id}")
        hold.opened.set()
        assert (await held).status_code == 202
        retried = await client.post(resume_url(url, run_id), json=YES)
        again = await client.post(resume_url(url, run_id), json=YES)
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "overloaded"
    assert refused_stream.status_code == 429
    assert shown.status_code == 200 and shown.json()["pending"][0]["call_id"] == "call_1"
    assert retried.status_code == 200, retried.text
    assert retried.json()["output"] == {"reply": "deleted /tmp/x"}
    assert again.status_code == 409 and again.json()["error"]["type"] == "already_resumed"
    assert ran(log) == ["/tmp/x"]


async def test_a_resume_refused_by_a_draining_server_runs_on_another_sharing_the_file(
    tmp_path: Path,
) -> None:
    """Two servers share one pending file (as two deployments of one service do); the one
    stopping answers 503 and the run still waits, so the retry on the other runs it."""
    log = tmp_path / "ran.txt"
    db = str(tmp_path / "pending.sqlite")
    async with serving_with({"agent": agent(log)}, pending_db=db) as (url, client, stopping, _):
        other = app({"agent": agent(log)}, stopping.state.runs.resources, pending_db=db)
        async with serving(other) as other_url:
            run_id = await paused_run(client, url)
            stopping.state.runs.draining = True  # what SIGTERM does (`DrainingServer`)
            refused = await client.post(resume_url(url, run_id), json=YES)
            refused_stream = await client.post(resume_url(url, run_id) + "?stream=1", json=YES)
            retried = await client.post(resume_url(other_url, run_id), json=YES)
            again = await client.post(resume_url(other_url, run_id), json=YES)
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "draining"
    assert refused_stream.status_code == 503
    assert retried.status_code == 200, retried.text
    assert again.status_code == 409
    assert ran(log) == ["/tmp/x"]


class Planned(Module):
    """Plans with one model call, then hands the plan to the agent: a resume makes the plan
    call again before the agent takes its approval."""

    def __init__(self, log: Path) -> None:
        super().__init__()
        self.plan = LLMInference("llm", "Say what to do.")
        self.act = agent(log)

    def forward(self, request: str) -> Any:
        return self.act(request=self.plan(request))


def plan_then_act(body: dict[str, Any]) -> Any:
    if body["messages"][0]["content"] == "Say what to do.":
        return "clean up"
    return call_then_answer(body)


async def test_a_resume_that_fails_before_the_call_runs_waits_again_and_after_it_does_not(
    tmp_path: Path,
) -> None:
    log = tmp_path / "ran.txt"
    programs = {"planned": Planned(log), "agent": agent(log)}
    async with serving_with(programs, plan_then_act) as (url, client, _, server):
        planned = await client.post(f"{url}/programs/planned/run", json={"request": "tidy"})
        assert planned.status_code == 202, planned.text
        run_id = planned.json()["run_id"]
        server.inject(Fault(status=500, times=2))  # the plan call of the next two resumes
        failed_stream = await client.post(
            resume_url(url, run_id, "planned") + "?stream=true", json=YES
        )
        failed = await client.post(resume_url(url, run_id, "planned"), json=YES)
        assert ran(log) == []
        retried = await client.post(resume_url(url, run_id, "planned"), json=YES)

        after_id = await paused_run(client, url)
        server.inject(Fault(status=500, times=1))  # the call after the tool's result
        failed_after = await client.post(resume_url(url, after_id), json=YES)
        not_again = await client.post(resume_url(url, after_id), json=YES)
    assert sse_events(failed_stream.text)[-1][0] == "error"
    assert failed.status_code >= 500, failed.text
    assert retried.status_code == 200, retried.text
    assert retried.json()["output"] == {"reply": "deleted /tmp/x"}
    assert failed_after.status_code >= 500
    assert not_again.status_code == 409 and not_again.json()["error"]["type"] == "already_resumed"
    assert ran(log) == ["/tmp/x", "/tmp/x"]  # once each: the planned run's, the agent's


class HeldPlan:
    """`plan_then_act`, but once armed the plan call waits until the test opens it."""

    def __init__(self) -> None:
        self.armed = False
        self.held = 0
        self.opened = asyncio.Event()

    async def __call__(self, body: dict[str, Any]) -> Any:
        if self.armed and body["messages"][0]["content"] == "Say what to do.":
            self.held += 1
            await self.opened.wait()
        return plan_then_act(body)


async def test_a_resume_whose_client_leaves_before_the_call_runs_waits_again(
    tmp_path: Path,
) -> None:
    log = tmp_path / "ran.txt"
    plan = HeldPlan()
    async with serving_with({"planned": Planned(log)}, plan) as (url, client, served, _):
        planned = await client.post(f"{url}/programs/planned/run", json={"request": "tidy"})
        run_id = planned.json()["run_id"]
        store = served.state.runs.pending
        plan.armed = True
        for held, query in enumerate(("", "?stream=true"), start=1):
            leaving = asyncio.ensure_future(
                client.post(resume_url(url, run_id, "planned") + query, json=YES)
            )
            await until(lambda held=held: plan.held == held, "the resume's plan call")
            assert len(store) == 0  # taken while it runs
            leaving.cancel()  # the client hangs up
            await until(lambda: len(store) == 1, "the run to wait again")
        plan.opened.set()
        retried = await client.post(resume_url(url, run_id, "planned"), json=YES)
    assert retried.status_code == 200, retried.text
    assert ran(log) == ["/tmp/x"]


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_of_eight_resumes_at_once_one_runs_and_seven_are_409(
    tmp_path: Path, store: str
) -> None:
    log = tmp_path / "ran.txt"
    options = {"pending_db": str(tmp_path / "pending.sqlite")} if store == "sqlite" else {}
    async with serving_with({"agent": agent(log)}, **options) as (url, client, _, _):
        run_id = await paused_run(client, url)
        answers = await asyncio.gather(
            *(
                client.post(resume_url(url, run_id) + ("?stream=true" if i % 2 else ""), json=YES)
                for i in range(8)
            )
        )
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [200] + [409] * 7, [answer.text for answer in answers]
    assert ran(log) == ["/tmp/x"]


# -- item 4: media in a paused run ----------------------------------------------------------


class Inspect(Signature):
    """Look at the scan, then clean up."""

    scan: Image = InputField()
    reply: str = OutputField()


def image_parts(body: dict[str, Any]) -> list[str]:
    return [
        part["image_url"]["url"]
        for message in body["messages"]
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image_url"
    ]


MEDIA = {
    "image": (Image, "image/png", png(shade=7)),
    "audio": (Audio, "audio/wav", wav()),
    "file": (File, "application/pdf", PDF),
}


def user_turns(body: dict[str, Any]) -> list[Any]:
    return [message for message in body["messages"] if message["role"] == "user"]


@pytest.mark.parametrize("kind", sorted(MEDIA))
@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_a_paused_run_with_media_resumes_on_the_same_bytes(
    tmp_path: Path, store: str, kind: str
) -> None:
    log = tmp_path / "ran.txt"
    kind_type, media_type, content = MEDIA[kind]
    uri = f"data:{media_type};base64," + base64.b64encode(content).decode()
    signature = Signature.from_string("scan: Scan -> reply", types={"Scan": kind_type})
    options = {"pending_db": str(tmp_path / "pending.sqlite")} if store == "sqlite" else {}
    programs = {"agent": agent(log, signature)}
    async with serving_with(programs, **options) as (url, client, _, server):
        run_id = await paused_run(client, url, {"scan": uri})
        resumed = await client.post(resume_url(url, run_id), json=YES)
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["output"] == {"reply": "deleted /tmp/x"}
    assert ran(log) == ["/tmp/x"]
    first, after = server.stats.log[0].body, server.stats.log[-1].body
    assert user_turns(first) == user_turns(after)  # the model saw the same bytes again
    assert base64.b64encode(content).decode() in json.dumps(user_turns(after))
    if kind == "image":
        assert image_parts(after) == [uri]


async def test_a_paused_run_whose_stored_image_was_changed_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    uri = "data:image/png;base64," + base64.b64encode(png(shade=7)).decode()
    other = "data:image/png;base64," + base64.b64encode(png(shade=8)).decode()
    async with serving_with({"agent": agent(log, Inspect)}) as (url, client, served, server):
        run_id = await paused_run(client, url, {"scan": uri})
        store = served.state.runs.pending
        stored = await store.get(run_id)
        assert stored.inputs == {"scan": uri}  # its bytes, not their summary
        await store.put(dataclasses.replace(stored, inputs={"scan": other}))
        refused = await client.post(resume_url(url, run_id), json=YES)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["type"] == "resume_refused"
    assert "paused on other inputs" in refused.json()["error"]["message"]
    assert ran(log) == [] and server.stats.requests == 1


async def test_a_pause_whose_image_is_over_the_bound_is_refused_saying_so(
    tmp_path: Path,
) -> None:
    uri = "data:image/png;base64," + base64.b64encode(png(64, 64)).decode()
    programs = {"agent": agent(tmp_path / "ran.txt", Inspect)}
    async with serving_with(programs, max_pending_bytes=len(uri)) as (url, client, _, _):
        too_large = await client.post(f"{url}/programs/agent/run", json={"scan": uri})
    assert too_large.status_code == 507
    assert "media included" in too_large.json()["error"]["message"]


# -- item 9: whose run it is, and how many wait ---------------------------------------------

ALICE, BOB = "alice-key-0001", "bob-key-000002"


def key(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def test_a_paused_run_is_seen_and_resumed_only_with_the_key_that_started_it(
    tmp_path: Path,
) -> None:
    log = tmp_path / "ran.txt"
    async with serving_with({"agent": agent(log)}, api_keys=(ALICE, BOB)) as (url, client, *_):
        run_id = await paused_run(client, url, **key(ALICE))
        streamed = await client.post(
            f"{url}/programs/agent/run?stream=true", json={"request": "x"}, headers=key(ALICE)
        )
        streamed_id = sse_events(streamed.text)[-1][1]["run_id"]
        bob_sees = await client.get(f"{url}/programs/agent/runs/{run_id}", headers=key(BOB))
        bob_resumes = await client.post(resume_url(url, run_id), json=YES, headers=key(BOB))
        bob_streamed = await client.post(resume_url(url, streamed_id), json=YES, headers=key(BOB))
        unknown = await client.post(resume_url(url, "nope"), json=YES, headers=key(BOB))
        assert ran(log) == []
        alice_sees = await client.get(f"{url}/programs/agent/runs/{run_id}", headers=key(ALICE))
        alice_resumes = await client.post(resume_url(url, run_id), json=YES, headers=key(ALICE))
        bob_after = await client.post(resume_url(url, run_id), json=YES, headers=key(BOB))
        alice_again = await client.post(resume_url(url, run_id), json=YES, headers=key(ALICE))
    for answer in (bob_sees, bob_resumes, bob_streamed, bob_after):
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["message"].endswith("waits for approval")
    assert unknown.status_code == 404
    assert alice_sees.status_code == 200
    assert alice_resumes.status_code == 200, alice_resumes.text
    assert alice_again.status_code == 409
    assert ran(log) == ["/tmp/x"]


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_paused_runs_are_bounded_per_key_and_in_all(tmp_path: Path, store: str) -> None:
    log = tmp_path / "ran.txt"
    options: dict[str, Any] = {"max_pending_per_key": 2, "max_pending_runs": 3}
    if store == "sqlite":
        options["pending_db"] = str(tmp_path / "pending.sqlite")
    programs = {"agent": agent(log)}
    async with serving_with(programs, api_keys=(ALICE, BOB), **options) as (url, client, *_):
        first = await paused_run(client, url, **key(ALICE))
        await paused_run(client, url, **key(ALICE))
        alice_full = await client.post(
            f"{url}/programs/agent/run", json={"request": "x"}, headers=key(ALICE)
        )
        await paused_run(client, url, **key(BOB))
        all_full = await client.post(
            f"{url}/programs/agent/run?stream=true", json={"request": "x"}, headers=key(BOB)
        )
        resumed = await client.post(resume_url(url, first), json=YES, headers=key(ALICE))
        await paused_run(client, url, **key(ALICE))  # room again
    assert alice_full.status_code == 429
    error = alice_full.json()["error"]
    assert error["type"] == "too_many_paused"
    assert "the most this server keeps per key" in error["message"]
    name, streamed_error = sse_events(all_full.text)[-1]
    assert name == "error" and streamed_error["error"]["status"] == 503
    assert streamed_error["error"]["type"] == "pending_store_full"
    assert resumed.status_code == 200
    assert ran(log) == ["/tmp/x"]


# -- the pending file: older formats are read, later ones refused ---------------------------


async def test_a_pending_file_of_the_previous_format_is_read_and_its_runs_resume(
    tmp_path: Path,
) -> None:
    """A run paused by a server, in a file brought back to format 1 (plait before owners:
    no owner columns), resumes on a server of this version; a later format is refused."""
    log = tmp_path / "ran.txt"
    db = tmp_path / "pending.sqlite"
    async with serving_with({"agent": agent(log)}, pending_db=str(db)) as (url, client, *_):
        run_id = await paused_run(client, url)
    with contextlib.closing(sqlite3.connect(db)) as old:
        old.execute("DROP INDEX pending_runs_owner")
        old.execute("ALTER TABLE pending_runs DROP COLUMN owner")
        old.execute("ALTER TABLE gone_runs DROP COLUMN owner")
        old.execute("PRAGMA user_version=1")
        old.commit()
    async with serving_with({"agent": agent(log)}, pending_db=str(db)) as (url, client, *_):
        resumed = await client.post(resume_url(url, run_id), json=YES)
    assert resumed.status_code == 200, resumed.text
    assert ran(log) == ["/tmp/x"]
    with contextlib.closing(sqlite3.connect(db)) as now:
        assert now.execute("PRAGMA user_version").fetchone()[0] == 2
        now.execute("PRAGMA user_version=9")
        now.commit()
    with pytest.raises(FileError, match="format 9, written by a later plait"):
        SQLitePendingStore(db)


def test_a_store_reads_no_state_over_its_bound_and_puts_a_taken_run_back(tmp_path: Path) -> None:
    path = tmp_path / "pending.sqlite"
    run = PendingRun("r1", "agent", {"request": "x" * 500}, {"confirmation_id": "c"}, owner="o")
    asyncio.run(SQLitePendingStore(path).put(run))
    with pytest.raises(FileError, match="over this server's limit of 100"):
        asyncio.run(SQLitePendingStore(path, max_state_bytes=100).get("r1"))
    store = SQLitePendingStore(path)
    taken = asyncio.run(store.take("r1"))
    assert taken == run and asyncio.run(store.gone("r1")) == ("resumed", "o")
    asyncio.run(store.restore(run))
    assert asyncio.run(store.get("r1")) == run and asyncio.run(store.gone("r1")) is None
