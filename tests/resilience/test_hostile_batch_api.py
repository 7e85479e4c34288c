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

    errors = [out for out in outputs]
    assert all(isinstance(error, BackendError) for error in errors), outputs
    assert f"batch id {batch_id!r}" in str(errors[0]) and "alias 'llm'" in str(errors[0])
    assert polled == []  # nothing was asked at a path it would have changed


async def test_a_created_batch_without_an_id_fails_naming_the_request() -> None:
    async with ScriptedServer() as server:
        server.batch_api.batch_id_format = ""
        job = BatchJob(LLMInference("llm"), {"llm": server.endpoint()}, poll_interval=0.01)
        outputs = await job.run(ITEMS, on_error="collect")

    error = outputs[0]
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

    errors = [out for out in outputs]
    assert all(isinstance(error, BackendError) for error in errors), outputs
    message = str(errors[0])
    assert "alias 'llm'" in message and "'daydreaming'" in message and job.batch_ids[0] in message
    assert polls == 3


# -- a result file that repeats, invents or garbles lines ----------------------------------

RESULT_KEY = {"openai": "response", "anthropic": "result"}


def batch_config(server: ScriptedServer, provider: str) -> dict:
    if provider == "openai":
        return {"llm": server.endpoint(max_retries=0)}
    pytest.importorskip("anthropic")
    base_url = f"http://127.0.0.1:{server.port}"
    entry = {"provider": "anthropic", "model": "claude-test", "api_key": "k", "base_url": base_url}
    return {"llm": {**entry, "max_retries": 0}}


async def run_edited(server: ScriptedServer, provider: str, edit) -> list:
    server.batch_api.edit_results = edit
    job = BatchJob(LLMInference("llm"), batch_config(server, provider), poll_interval=0.01)
    return await job.run(ITEMS, on_error="collect")


def answered(outputs: list) -> list[str]:
    return sorted(out for out in outputs if isinstance(out, str))


def line_for(lines: list[dict], custom_id: str) -> dict:
    return next(line for line in lines if line["custom_id"] == custom_id)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_second_answer_for_a_request_fails_that_item_and_replaces_nothing(
    provider: str,
) -> None:
    def repeat(lines: list[dict]) -> list:
        other = {**line_for(lines, "request-1"), "custom_id": "request-0"}
        return [*lines, other]

    async with ScriptedServer() as server:
        outputs = await run_edited(server, provider, repeat)

    failed = [out for out in outputs if not isinstance(out, str)]
    assert len(failed) == 1 and isinstance(failed[0], BackendError), outputs
    assert "request-0" in str(failed[0]) and "2 result lines" in str(failed[0])
    assert len(answered(outputs)) == 2


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_line_for_a_request_never_asked_is_reported_and_ignored(
    provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    def invent(lines: list[dict]) -> list:
        return [*lines, {**lines[0], "custom_id": "request-99"}]

    async with ScriptedServer() as server:
        outputs = await run_edited(server, provider, invent)

    assert answered(outputs) == [f"echo: {x}" for x in ITEMS]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("'request-99'" in text and "not asked" in text for text in warnings), warnings


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("garbage", ["oops", ["a list"], 7])
async def test_a_line_of_the_wrong_shape_fails_only_its_own_item(
    provider: str, garbage: object
) -> None:
    def garble(lines: list[dict]) -> list:
        bad = line_for(lines, "request-2")
        return [
            line if line is not bad else {**bad, RESULT_KEY[provider]: garbage} for line in lines
        ]

    async with ScriptedServer() as server:
        outputs = await run_edited(server, provider, garble)

    failed = [out for out in outputs if not isinstance(out, str)]
    assert len(failed) == 1 and isinstance(failed[0], BackendError), outputs
    assert "request-2" in str(failed[0]) and "alias 'llm'" in str(failed[0])
    assert len(answered(outputs)) == 2


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_an_unreadable_line_is_named_by_the_item_it_left_without_an_answer(
    provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    def garble(lines: list[dict]) -> list:
        return [b"{not json" if line["custom_id"] == "request-1" else line for line in lines]

    async with ScriptedServer() as server:
        outputs = await run_edited(server, provider, garble)

    failed = [out for out in outputs if not isinstance(out, str)]
    assert len(failed) == 1 and isinstance(failed[0], BackendError), outputs
    assert "request-1" in str(failed[0]) and "{not json" in str(failed[0])
    assert len(answered(outputs)) == 2
