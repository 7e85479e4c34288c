"""The SSE reader under any body: it yields events, the same however the network splits them.

`iter_sse_data` is what both OpenAI transports read a streamed body with;
here it gets the body in pieces cut at random places, as the network would
deliver it. The bytes also travel over real HTTP in test_openai_replies.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from plait.backends.openai._sse import iter_sse_data
from plait.errors import PlaitError
from plait.testing._replies import Reply, stream_events

from .support import fuzz, mutated_bytes, outcome

REPLY = Reply(
    content="Paris is the capital.",
    tool_calls=[{"id": "call_1", "name": "lookup", "arguments": '{"city": "Paris"}'}],
    finish_reason="stop",
    usage={"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
)
EVENTS = stream_events(REPLY, model="m", request_id="r1", created=1, pieces=3, include_usage=True)
VALID_BODY = (
    b": keep-alive\r\n\r\n"
    + b"".join(b"event: chunk\nid: 1\ndata: " + orjson.dumps(e) + b"\r\n\r\n" for e in EVENTS)
    + b"data: [DONE]\n\n"
)
SSE_FRAGMENTS = (b"data:", b"data: ", b": comment\n", b"event: x\n", b"retry: 1\n", b"\n\n")


def pieces(body: bytes, cuts: list[int]) -> Iterator[bytes]:
    """Yields ``body`` cut at the given offsets (taken modulo its length)."""
    start = 0
    for cut in sorted({c % (len(body) + 1) for c in cuts}):
        yield body[start:cut]
        start = cut
    yield body[start:]


async def events_of(body: bytes, cuts: list[int]) -> list[bytes]:
    async def chunks() -> AsyncIterator[bytes]:
        for piece in pieces(body, cuts):
            yield piece

    return [data async for data in iter_sse_data(chunks())]


@pytest.fixture
def loop() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as runner:
        yield runner


@fuzz(500)
@given(
    body=st.one_of(st.binary(max_size=400), mutated_bytes(VALID_BODY, SSE_FRAGMENTS)),
    cuts=st.lists(st.integers(min_value=0), max_size=12),
)
@example(body=VALID_BODY, cuts=[1, 2, 3, 50, 51])
def test_any_body_gives_the_same_events_however_it_is_split(
    loop: asyncio.Runner, body: bytes, cuts: list[int]
) -> None:
    whole = outcome("SSE reader", lambda: loop.run(events_of(body, [])))
    split = outcome("SSE reader", lambda: loop.run(events_of(body, cuts)))
    assert split == whole


async def endless_event(read: list[int]) -> AsyncIterator[bytes]:
    """Yields one SSE event that never ends: 1 MB data lines and no blank line."""
    line = b"data: " + b"x" * (2**20) + b"\n"
    while True:
        read[0] += len(line)
        if read[0] > 128 * 2**20:
            raise AssertionError("read 128 MB of one SSE event without refusing it")
        yield line


def test_an_event_that_never_ends_is_refused_before_it_fills_memory(
    loop: asyncio.Runner,
) -> None:
    read = [0]

    async def drain() -> None:
        async for _ in iter_sse_data(endless_event(read)):
            pass

    with pytest.raises(PlaitError):
        loop.run(drain())
