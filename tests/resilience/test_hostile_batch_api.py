"""A Batch API server that is careless or hostile: odd ids, endless batches, bad result files.

Every job runs against the scripted server's Batch API over loopback; what is
asserted is what a user sees (outputs, errors and their messages) and what the
server saw (the paths it was asked for, the polls it answered).
"""

from __future__ import annotations

import asyncio
import math

import pytest

from plait import LLMInference, run
from plait.errors import BackendError, DeadlineExceededError
from plait.execution.batch_api import BatchJob
from plait.testing import ScriptedServer

ITEMS = ["a", "b", "c"]


# -- ids from the server go into URLs as one path segment ---------------------------------


async def test_a_batch_id_with_slashes_and_dots_stays_one_path_segment() -> None:
    async with ScriptedServer() as server:
        server.batch_api.batch_id_format = "../files/batch_{n}"
        job = BatchJob(LLMInference("llm"), {"llm": server.endpoint()}, poll_interval=0.01)
        outputs = await job.run(ITEMS)
        polled = [path for path in server.batch_api.log if path.startswith("GET /v1/batches/")]

    assert outputs == [f"echo: {x}" for x in ITEMS]
    assert polled and all(p.startswith("GET /v1/batches/..%2Ffiles%2Fbatch_") for p in polled)


@pytest.mark.parametrize("batch_id", ["..", "."])
async def test_a_batch_id_that_is_a_dot_segment_is_refused(batch_id: str) -> None:
    async with ScriptedServer() as server:
        server.batch_api.batch_id_format = batch_id
        job = BatchJob(LLMInference("llm"), {"llm": server.endpoint()}, poll_interval=0.01)
        outputs = await job.run(ITEMS, on_error="collect")
        polled = [path for path in server.batch_api.log if path.startswith("GET ")]

    errors = [getattr(out, "cause", out) for out in outputs]
    assert all(isinstance(error, BackendError) for error in errors), outputs
    assert f"batch id {batch_id!r}" in str(errors[0]) and "alias 'llm'" in str(errors[0])
    assert polled == []  # nothing was asked at a path it would have changed


async def test_a_created_batch_without_an_id_fails_naming_the_request() -> None:
    async with ScriptedServer() as server:
        server.batch_api.batch_id_format = ""
        job = BatchJob(LLMInference("llm"), {"llm": server.endpoint()}, poll_interval=0.01)
        outputs = await job.run(ITEMS, on_error="collect")

    error = getattr(outputs[0], "cause", outputs[0])
    assert isinstance(error, BackendError)
    assert "alias 'llm'" in str(error) and "POST /batches" in str(error) and "no id" in str(error)


# -- a batch that never finishes -----------------------------------------------------------


async def test_a_deadline_bounds_a_batch_api_run_whose_batch_never_finishes() -> None:
    async with ScriptedServer() as server:
        server.batch_api.batch_delay = math.inf
        config = {"llm": server.endpoint()}
        work = run(LLMInference("llm"), ITEMS, resources=config, batch_api=True, deadline=1.0)
        with pytest.raises(DeadlineExceededError, match=r"deadline of 1 s") as info:
            await asyncio.wait_for(work, timeout=30)  # far beyond: fails the test, not hangs
    assert info.value.input_index == 0 and info.value.deadline == 1.0


async def test_a_batch_api_deadline_fails_every_unfinished_item_when_collecting(tmp_path) -> None:
    async with ScriptedServer() as server:
        server.batch_api.batch_delay = math.inf
        config = {"llm": server.endpoint()}
        work = run(
            LLMInference("llm"), ITEMS, resources=config, batch_api=True, deadline=1.0,
            on_error="collect", checkpoint_dir=tmp_path,
        )  # fmt: skip
        outputs = await asyncio.wait_for(work, timeout=30)
        [batch_id] = server.batch_api.batches

    assert [type(out) for out in outputs] == [DeadlineExceededError] * 3
    assert [out.input_index for out in outputs] == [0, 1, 2]
    assert "same checkpoint_dir" in str(outputs[0])  # how to collect the batch later
    assert batch_id in (tmp_path / "batch_api.json").read_text()


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_polling_stops_on_a_status_the_batch_api_does_not_have(provider: str) -> None:
    if provider == "anthropic":
        pytest.importorskip("anthropic")
    async with ScriptedServer() as server:
        server.batch_api.stuck_status = "daydreaming"
        config = {"llm": server.endpoint()}
        if provider == "anthropic":
            config = {"llm": {"provider": "anthropic", "model": "claude-test", "api_key": "k",
                              "base_url": f"http://127.0.0.1:{server.port}"}}  # fmt: skip
        job = BatchJob(LLMInference("llm"), config, poll_interval=0.01)
        work = job.run(ITEMS, on_error="collect")
        outputs = await asyncio.wait_for(work, timeout=30)
        polls = server.batch_api.polls

    errors = [getattr(out, "cause", out) for out in outputs]
    assert all(isinstance(error, BackendError) for error in errors), outputs
    message = str(errors[0])
    assert "alias 'llm'" in message and "'daydreaming'" in message and job.batch_ids[0] in message
    assert polls == 3
