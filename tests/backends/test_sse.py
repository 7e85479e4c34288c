"""The SSE reader: events survive any split of the body into network chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from plait.backends.openai._sse import DONE, iter_sse_data

BODY = (
    b": keep-alive comment\r\n"
    b"\r\n"
    b'data: {"a": 1}\r\n'
    b"\r\n"
    b"event: message\n"
    b"id: 7\n"
    b"data: first line\n"
    b"data:second line\n"
    b"\n"
    b"data: [DONE]\n"
    b"\n"
)
EXPECTED = [b'{"a": 1}', b"first line\nsecond line", DONE]


async def pieces(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


async def read(body: bytes, size: int) -> list[bytes]:
    return [data async for data in iter_sse_data(pieces(body, size))]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16, len(BODY)])
async def test_events_are_the_same_however_the_body_is_split(size):
    assert await read(BODY, size) == EXPECTED


async def test_a_last_event_without_its_blank_line_is_still_delivered():
    assert await read(b"data: a\n\ndata: tail", 4) == [b"a", b"tail"]
    assert await read(b"data: a\n\ndata: tail\n", 4) == [b"a", b"tail"]


async def test_a_large_event_is_not_limited_by_line_length():
    payload = b"x" * 300_000
    assert await read(b"data: " + payload + b"\n\n", 65_536) == [payload]
