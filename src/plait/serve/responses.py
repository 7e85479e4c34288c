"""Answers that end with their client: a run cancelled when the client hangs up, and an SSE
response that stops its producer (and with it the run and its model requests) at once.

Starlette notices a vanished client only when it next writes, which for a run waiting on a
slow model may be minutes away; here the request's ``receive`` is watched instead, and its
``http.disconnect`` cancels the work immediately.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive

__all__ = ["ClientLeft", "EventStreamResponse", "JsonResponse", "until_disconnected"]


class ClientLeft(Exception):
    """The client hung up before its answer was ready; its work was cancelled."""


async def until_disconnected(receive: Receive, work: Coroutine[Any, Any, Any]) -> Any:
    """Returns the result of ``work``, cancelling it if the client disconnects first.

    ``work`` runs in the calling task, and one watcher task waits for the disconnect and
    cancels the caller (a run costs one task more, not two).

    Raises:
        ClientLeft: the client disconnected; ``work`` was cancelled and has finished.
    """
    loop = asyncio.get_running_loop()
    caller = asyncio.current_task(loop)
    assert caller is not None, "until_disconnected runs inside a task"
    state = {"finished": False, "left": False}

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        # ``finished`` is set in the same step that ``work`` returns in, so a client that
        # leaves after that step never cancels what comes next (sending the answer).
        if not state["finished"]:
            state["left"] = True
            caller.cancel()

    watcher = loop.create_task(watch())
    try:
        result = await work
        state["finished"] = True
        return result
    except asyncio.CancelledError:
        state["finished"] = True
        if state["left"] and caller.uncancel() == 0:
            raise ClientLeft from None
        raise  # this request itself is cancelled (the server stops)
    finally:
        state["finished"] = True
        watcher.cancel()


class JsonResponse(Response):
    """A JSON answer written by orjson (several times faster than the standard library's
    ``json``, which Starlette's ``JSONResponse`` uses)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)

    def init_headers(self, headers: Mapping[str, str] | None = None) -> None:
        status = self.status_code
        plain = headers is None and self.media_type == "application/json"
        if plain and status >= 200 and status not in _EMPTY:
            # the headers Starlette would make for this answer, made directly
            length = b"%d" % len(self.body)
            self.raw_headers = [(b"content-length", length), (b"content-type", _JSON)]
        else:
            super().init_headers(headers)


_JSON = JsonResponse.media_type.encode()
_EMPTY = (204, 304)
"""Statuses whose answers have no body, so no content-length (as Starlette has it)."""


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
