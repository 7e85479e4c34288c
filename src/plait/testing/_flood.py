"""Writing a `Flood` reply: shared by the scripted server's chat routes and its Batch API routes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from plait.testing._replies import Flood

if TYPE_CHECKING:
    from plait.testing.scripted_server import RequestRecord

__all__ = ["send_flood"]


async def send_flood(
    request: web.Request, flood: Flood, record: RequestRecord | None = None
) -> web.StreamResponse:
    """Writes a `Flood`; a client that hangs up (having read enough) just ends it."""
    response = web.StreamResponse(status=flood.status, headers={"Content-Type": flood.content_type})
    if flood.declare_length:
        response.content_length = flood.size
    await response.prepare(request)
    if record is not None:
        record.status = flood.status
    try:
        for block in flood.blocks():
            await response.write(block)
        await response.write_eof()
    except (ConnectionError, RuntimeError):  # the client closed the connection
        pass
    return response
