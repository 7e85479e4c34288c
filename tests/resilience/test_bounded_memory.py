"""Bounded memory under a hostile server: no reply, event or result line is held past its cap.

The scripted server sends `Flood` bodies, made as they are written, many times
larger than the cap the endpoint is given; what a test measures is the peak of
the memory Python allocated while the client read them (tracemalloc), against
a margin far below what the server sent.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Awaitable
from typing import Any

import pytest

from plait import LLMInference
from plait.backends.types import Message, Request
from plait.errors import BackendError, ConfigError
from plait.execution.batch_api import BatchJob
from plait.resources import ResourceConfig, ResourceManager
from plait.testing import Flood, ScriptedServer

from .support import endpoint

MIB = 1024 * 1024
CAP = 1 * MIB
SENT = 48 * MIB  # what a hostile server sends: far beyond the cap
MARGIN = 12 * MIB  # what reading it may cost at most, cap and buffers included
BLOCK = 64 * 1024


async def peak_growth(work: Awaitable[Any]) -> tuple[int, Any]:
    """Returns the peak of memory allocated while ``work`` ran, and its outcome."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        outcome: Any = await work
    except Exception as exc:
        outcome = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, outcome


def flooding(flood: Flood):
    """A responder that answers "flood" with ``flood`` and anything else with "ok"."""
    return lambda body: flood if body["messages"][-1]["content"] == "flood" else "ok"


async def call(manager: ResourceManager, streamed: bool, text: str) -> Any:
    request = Request(messages=(Message("user", text),))
    if not streamed:
        return await manager.complete("llm", request)
    return [chunk async for chunk in manager.stream("llm", request)]


async def hostile_call(
    server: ScriptedServer, streamed: bool, transport: str, **caps: int
) -> tuple[int, Any]:
    """Returns the peak memory and the outcome of a call the server answers with its flood.

    A first, ordinary call loads the transport (the SDK's import alone is
    megabytes) and opens the connection, so that only reading is measured.
    """
    config = {"llm": endpoint(server, transport=transport, max_retries=0, **caps)}
    async with ResourceManager(config) as manager:
        await call(manager, streamed, "warm up")
        return await peak_growth(call(manager, streamed, "flood"))


BODIES = {
    "declared": Flood(b" " * BLOCK, repeat=SENT // BLOCK, declare_length=True),
    "chunked": Flood(b" " * BLOCK, repeat=SENT // BLOCK),
}


@pytest.mark.parametrize("transport", ["http", "sdk"])
@pytest.mark.parametrize("body", list(BODIES))
async def test_a_reply_body_beyond_max_response_bytes_is_refused_within_the_cap(
    body: str, transport: str
) -> None:
    async with ScriptedServer(responder=flooding(BODIES[body])) as server:
        peak, error = await hostile_call(server, False, transport, max_response_bytes=CAP)

    assert isinstance(error, BackendError), error
    message = str(error)
    assert "alias 'llm'" in message and "max_response_bytes=1048576" in message
    assert peak < MARGIN, f"{peak / MIB:.1f} MiB held for a {SENT // MIB} MiB body"


EVENTS = {
    "endless data lines": Flood(
        b"data: " + b"x" * (BLOCK - 7) + b"\n",
        head=b'data: {"choices": []}\n\ndata: {"a": "',
        repeat=SENT // BLOCK,
        content_type="text/event-stream",
    ),
    "one endless line": Flood(
        b"x" * BLOCK, head=b"data: ", repeat=SENT // BLOCK, content_type="text/event-stream"
    ),
}


@pytest.mark.parametrize("transport", ["http", "sdk"])
@pytest.mark.parametrize("event", list(EVENTS))
async def test_a_stream_event_beyond_max_event_bytes_is_refused_within_the_cap(
    event: str, transport: str
) -> None:
    async with ScriptedServer(responder=flooding(EVENTS[event])) as server:
        peak, error = await hostile_call(server, True, transport, max_event_bytes=CAP)

    assert isinstance(error, BackendError), error
    message = str(error)
    assert "alias 'llm'" in message and "max_event_bytes=1048576" in message
    assert peak < MARGIN, f"{peak / MIB:.1f} MiB held for a {SENT // MIB} MiB event"


@pytest.mark.parametrize("transport", ["http", "sdk"])
async def test_replies_within_the_caps_are_read_as_before(transport: str) -> None:
    caps = {"max_response_bytes": 1024, "max_event_bytes": 512}
    async with ScriptedServer() as server:
        config = {"llm": endpoint(server, transport=transport, **caps)}
        async with ResourceManager(config) as manager:
            response = await call(manager, False, "hello")
            chunks = await call(manager, True, "hello")
    assert response.text == "echo: hello"
    assert "".join(chunk.text for chunk in chunks) == "echo: hello"


def test_the_caps_are_endpoint_settings_with_defaults_no_real_reply_reaches() -> None:
    config = ResourceConfig({"llm": {"provider": "openai", "model": "m"}})
    assert config.resolve("llm").max_response_bytes == 64 * MIB
    assert config.resolve("llm").max_event_bytes == 16 * MIB
    with pytest.raises(ConfigError, match=r"alias 'llm': key 'max_event_bytes' must be a posi"):
        ResourceConfig({"llm": {"provider": "openai", "model": "m", "max_event_bytes": 0}})


# -- Batch API result files ----------------------------------------------------------------


def flooded_results(unit: bytes, keep_lines: bool):
    """An ``edit_results`` that serves the real lines, then ``SENT`` bytes of ``unit``."""

    def edit(lines: list[dict]) -> Flood:
        import orjson

        head = b"".join(orjson.dumps(line) + b"\n" for line in lines) if keep_lines else b""
        return Flood(unit, head=head, repeat=SENT // len(unit))

    return edit


async def test_a_huge_result_file_is_read_line_by_line_in_bounded_memory() -> None:
    unknown = b'{"custom_id": "request-99", "response": {"status_code": 200}}'
    unit = unknown + b" " * (1024 - len(unknown) - 1) + b"\n"
    async with ScriptedServer() as server:
        server.batch_api.edit_results = flooded_results(unit, keep_lines=True)
        config = {"llm": server.endpoint(max_response_bytes=CAP)}
        job = BatchJob(LLMInference("llm"), config, poll_interval=0.01)
        peak, outputs = await peak_growth(job.run(["a", "b", "c"]))

    assert outputs == ["echo: a", "echo: b", "echo: c"]
    assert peak < MARGIN, f"{peak / MIB:.1f} MiB held for a {SENT // MIB} MiB result file"


async def test_a_result_line_beyond_max_response_bytes_fails_the_round_naming_alias_and_size():
    async with ScriptedServer() as server:
        server.batch_api.edit_results = flooded_results(b"x" * BLOCK, keep_lines=False)
        config = {"llm": server.endpoint(max_response_bytes=CAP)}
        job = BatchJob(LLMInference("llm"), config, poll_interval=0.01)
        peak, outputs = await peak_growth(job.run(["a", "b"], on_error="collect"))

    errors = [out for out in outputs]
    assert all(isinstance(error, BackendError) for error in errors), outputs
    message = str(errors[0])
    assert "alias 'llm'" in message and "max_response_bytes=1048576" in message
    assert peak < MARGIN, f"{peak / MIB:.1f} MiB held for a {SENT // MIB} MiB line"
