"""Search checkpoints edited by a crash or a hand: the rerun resumes, or refuses before a call.

A search runs once with ``checkpoint=`` and a budget that stops it part-way,
so its file holds every part a checkpoint has: whole and cut-short trials, a
bootstrap pass (BootstrapFewShot), ReflectiveSearch's pool, pending children
and random generator. Each input writes an edited copy of that file and
reruns the same search from it. The rerun ends with a report, or with a
plait error, or with the ``ValueError`` a checkpoint of other work gets
(its message names the file and says it holds another search); never
another exception, never a hang.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plait import Predict, ResourceConfig
from plait.errors import PlaitError
from plait.optimization import BootstrapFewShot, ReflectiveSearch
from plait.signatures import PlainAdapter
from plait.testing import ScriptedServer

from .support import documents, fuzz, outcome_async

PARITY = "number -> parity: Literal['even', 'odd']"
BETTER = "Answer even when the last digit is 0, 2, 4, 6 or 8, else odd."
TRAIN = [(str(n), "even" if n % 2 == 0 else "odd") for n in (2, 4, 6, 8, 3, 5)]
VAL = [(str(n), "even" if n % 2 == 0 else "odd") for n in range(20, 26)]

SEARCHES: dict[str, Callable[..., Any]] = {
    "BootstrapFewShot": lambda **options: BootstrapFewShot(max_demos=2, **options),
    "ReflectiveSearch": lambda **options: ReflectiveSearch(minibatch=2, **options),
}
CUT = {"BootstrapFewShot": 15, "ReflectiveSearch": 30}
"""Budgets that stop each search part-way; a rerun gets a larger one."""


def respond(body: dict[str, Any]) -> str:
    """Right under BETTER; a rewrite proposes BETTER; a feedback summary says so."""
    schema = json.dumps(body.get("response_format") or {})
    if "ParameterUpdate" in schema:
        return json.dumps({"new_value": BETTER, "rationale": "feedback"})
    if "FeedbackSummary" in schema:
        return json.dumps({"summary": "Wrong on odd numbers.", "changes": ["Say odd."]})
    user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
    if BETTER in body["messages"][0]["content"] and user.isdigit():
        return "even" if int(user) % 2 == 0 else "odd"
    return "even"


def program() -> Predict:
    return Predict(PARITY, adapter=PlainAdapter())


async def _stopped_checkpoint(name: str) -> Any:
    async with ScriptedServer(responder=respond) as server:
        config = ResourceConfig({"*": server.endpoint(max_retries=0, max_concurrent=8)})
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "search.json"
            search = SEARCHES[name](max_calls=CUT[name], checkpoint=path)
            await search.compile(program(), trainset=TRAIN, valset=VAL, resources=config)
            return json.loads(path.read_text())


@pytest.fixture(scope="module")
def valid() -> dict[str, Any]:
    """Per search, the checkpoint of a run its budget stopped."""
    return {name: asyncio.run(_stopped_checkpoint(name)) for name in SEARCHES}


@pytest.fixture
async def config() -> AsyncIterator[ResourceConfig]:
    async with ScriptedServer(responder=respond, keep_log=False) as server:
        yield ResourceConfig({"*": server.endpoint(max_retries=0, max_concurrent=8)})


async def rerun(name: str, path: Path, config: ResourceConfig) -> Any:
    """Reruns the search from ``path``; a refusal of other work is its documented answer."""
    search = SEARCHES[name](max_calls=2 * CUT[name], checkpoint=path)
    try:
        return await search.compile(program(), trainset=TRAIN, valset=VAL, resources=config)
    except ValueError as exc:
        if f"{path} holds a" not in str(exc):
            raise  # another ValueError is a bug, not a refusal
        return exc


@pytest.mark.parametrize("name", list(SEARCHES))
@fuzz(60)
@given(data=st.data())
async def test_any_edited_search_checkpoint_resumes_or_is_refused(
    valid: dict[str, Any], config: ResourceConfig, tmp_path: Path, name: str, data: st.DataObject
) -> None:
    text = data.draw(documents(valid[name]), label="checkpoint")
    path = tmp_path / "search.json"
    path.write_bytes(text)
    await outcome_async(
        f"search checkpoint ({name})", lambda: rerun(name, path, config), allowed=(PlaitError,)
    )
