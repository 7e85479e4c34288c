"""A Batch API server that is careless or hostile: odd ids, endless batches, bad result files.

Every job runs against the scripted server's Batch API over loopback; what is
asserted is what a user sees (outputs, errors and their messages) and what the
server saw (the paths it was asked for, the polls it answered).
"""

from __future__ import annotations

import pytest

from plait import LLMInference
from plait.errors import BackendError
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
