"""Answers that end with their client: a run cancelled when the client hangs up, and an SSE
response that stops its producer (and with it the run and its model requests) at once.

Starlette notices a vanished client only when it next writes, which for a run waiting on a
slow model may be minutes away; here the request's ``receive`` is watched instead, and its
``http.disconnect`` cancels the work immediately.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

__all__ = ["ClientLeft", "EventStreamResponse", "until_disconnected"]


class ClientLeft(Exception):
    """The client hung up before its answer was ready; its work was cancelled."""


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(receive: Receive, work: Coroutine[Any, Any, Any]) -> Any:
    """Returns the result of ``work``, cancelling it if the client disconnects first.

    Raises:
        ClientLeft: the client disconnected; ``work`` was cancelled and has finished.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request itself is cancelled (the server stops)
        await _cancel(task, watcher)
        raise
    if task.done():
        watcher.cancel()
        return task.result()
    await _cancel(task, watcher)
    raise ClientLeft


async def _cancel(*tasks: asyncio.Future[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)


class EventStreamResponse(Response):
    """A ``text/event-stream`` answer that sends ``events`` as they come.

    Args:
        events: the encoded events (bytes).
        on_close: awaited once the answer ends, however it ends (frees the run's place).
        headers: extra response headers.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncIterator[bytes],
        on_close: Callable[[], Awaitable[Any]],
        headers: dict[str, str] | None = None,
    ) -> None:
        self.events = events
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.stream_headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "x-accel-buffering": "no",  # proxies such as nginx would hold events back
            **(headers or {}),
        }

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(k.encode(), v.encode()) for k, v in self.stream_headers.items()],
                }
            )
            await until_disconnected(receive, self._pump(send))
        except (ClientLeft, OSError):
            pass  # the client left: nothing is left to tell it
        finally:
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                await aclose()
            await self.on_close()

    async def _pump(self, send: Any) -> None:
        async for chunk in self.events:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
