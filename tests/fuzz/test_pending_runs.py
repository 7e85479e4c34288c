"""Paused runs kept in the pending file (``plait serve --pending-db``), edited in the file.

Claiming a stored run for a resume (`RunService.claim`: `SQLitePendingStore` reads the row,
the server validates its inputs, media included, and reads its sealed pause) gives the resume,
or the refusal a client is answered with (`NotResumable`, or a plait error: `FileError`,
`ResumeRefusedError`), never another exception, whatever a hostile or broken writer left in
the row's inputs and pause.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from media.samples import png
from plait import Image, InputField, OutputField, ReAct, Signature, tool
from plait.errors import PlaitError
from plait.serve import SQLitePendingStore, app
from plait.serve.options import ServeOptions
from plait.serve.programs import served_programs
from plait.serve.runs import NotResumable, Resume, RunService
from plait.testing import ScriptedServer
from serve.support import serving, upstream

from .support import documents, fuzz, json_text, outcome_async


class Inspect(Signature):
    """Look at the scan, then clean up."""

    scan: Image = InputField()
    reply: str = OutputField()


def agent() -> ReAct:
    @tool(require_confirmation=True)
    def delete_file(path: str) -> str:
        """Deletes a file."""
        return f"deleted {path}"

    return ReAct(Inspect, tools=[delete_file], max_iters=3)


def call_first(body: dict[str, Any]) -> Any:
    call = {"id": "call_1", "name": "delete_file", "arguments": {"path": "/tmp/x"}}
    return {"content": "On it.", "tool_calls": [call]}


async def paused_row(db: Path) -> tuple[str, str]:
    """Pauses a served agent on an image; returns its stored inputs and pause (JSON text)."""
    uri = "data:image/png;base64," + base64.b64encode(png()).decode()
    async with ScriptedServer(responder=call_first) as server:
        served = app({"agent": agent()}, upstream(server), pending_db=str(db))
        async with serving(served) as url, httpx.AsyncClient(timeout=60) as client:
            paused = await client.post(f"{url}/programs/agent/run", json={"scan": uri})
    assert paused.status_code == 202, paused.text
    with sqlite3.connect(db) as kept:
        inputs, pause = kept.execute("SELECT inputs, pause FROM pending_runs").fetchone()
    return inputs, pause


@dataclass
class Claimer:
    db: Path
    service: RunService
    inputs: Any
    pause: Any


@pytest.fixture(scope="module")
def claimer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Claimer]:
    db = tmp_path_factory.mktemp("pending") / "pending.sqlite"
    inputs, pause = asyncio.run(paused_row(db))
    store = SQLitePendingStore(db)
    service = RunService(
        {p.name: p for p in served_programs({"agent": agent()})},
        {},
        ServeOptions(pending_store=store),
    )
    yield Claimer(db, service, json.loads(inputs), json.loads(pause))
    asyncio.run(store.aclose())


ALLOWED = (PlaitError, NotResumable)


@fuzz(150)
@given(data=st.data())
@example(data=None)
async def test_a_stored_run_edited_in_the_file_is_resumed_or_refused(
    claimer: Claimer, data: st.DataObject | None
) -> None:
    if data is None:  # the valid row, as it was kept
        inputs, pause = json_text(claimer.inputs), json_text(claimer.pause)
    else:
        inputs = data.draw(documents(claimer.inputs), label="inputs")
        pause = data.draw(documents(claimer.pause), label="pause")
    with sqlite3.connect(claimer.db) as file:  # bytes as they are: a writer other than plait
        file.execute(
            "INSERT OR REPLACE INTO pending_runs (run_id, program, inputs, pause, created) "
            "VALUES ('r', 'agent', ?, ?, ?)",
            (inputs, pause, time.time()),
        )
    served = claimer.service.programs["agent"]
    claimed = await outcome_async(
        "pending run",
        lambda: claimer.service.claim(served, "r", {"call_1": "yes"}, None),
        allowed=ALLOWED,
    )
    if data is None:  # the row as plait kept it resumes, on the image it paused on
        assert isinstance(claimed, Resume), claimed
        assert (
            claimed.arguments["scan"].sha256 == claimer.pause["context"]["inputs"]["scan"]["sha256"]
        )
