"""A backend's stream read under a timeout, and a streamed attempt gathered into one reply.

The timeout of a streamed call covers the waits for the backend only, never
the time the reader holds a chunk: a slow reader (backpressure in a sink)
must not time a healthy call out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Protocol

from plait.backends.base import Backend
from plait.backends.types import Request, Response, StreamChunk, Usage


class TextSink(Protocol):
    """Where a streaming `ResourceManager.complete` sends the reply's text as it arrives."""

    started: bool
    """Whether text has been sent since the last restart."""

    async def text(self, delta: str) -> None: ...

    async def restart(self, reason: str) -> None: ...


async def within(
    stream: AsyncIterator[StreamChunk], timeout: float | None
) -> AsyncGenerator[StreamChunk, None]:
    """Yields a backend's chunks, each wait for the backend guarded by one ``timeout``.

    The deadline guards the waits for the backend, never a yield: a timeout
    spanning a yield would cancel the consumer's code instead, and the time
    the consumer holds a chunk (a slow reader) moves the deadline out.
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    chunks = stream.__aiter__()
    try:
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            paused = loop.time()
            yield chunk
            if deadline is not None:
                deadline += loop.time() - paused
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


async def streamed(
    backend: Backend, request: Request, timeout: float | None, on_text: TextSink
) -> Response:
    """Makes one attempt over the backend's stream, passing text to ``on_text``; the whole reply.

    The timeout covers the waits for the backend only (`within`), so a slow
    reader (backpressure in the sink) never times a healthy call out.
    """
    chunks = within(backend.stream(request), timeout)
    text: list[str] = []
    calls: list[Any] = []
    usage: Usage | None = None
    finish: str | None = None
    try:
        async for chunk in chunks:
            if chunk.text:
                text.append(chunk.text)
                await on_text.text(chunk.text)
            calls.extend(chunk.tool_calls)
            usage = chunk.usage or usage
            finish = chunk.finish_reason or finish
    finally:
        await chunks.aclose()
    return Response(
        text="".join(text), tool_calls=tuple(calls), usage=usage or Usage(), finish_reason=finish
    )
