"""A minimal Server-Sent Events reader for streamed chat completions.

Only what OpenAI-compatible servers send is handled: ``data:`` fields,
multi-line data joined by newlines, ``:`` comment lines (keep-alives) and
other fields (``event:``, ``id:``, ``retry:``) ignored. Writing it here
instead of depending on an SSE library keeps the streaming hot path to a few
``bytes`` operations per line. One event may hold at most ``max_event_bytes``
of data (`plait.backends._bounded`): an event that never ends is refused at
that size instead of growing the client without bound.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

from plait.backends._bounded import DEFAULT_MAX_EVENT_BYTES, iter_lines, too_large
from plait.errors import BackendError

__all__ = ["DONE", "iter_sse_data"]

DONE = b"[DONE]"
"""The data payload OpenAI-compatible servers send as the last event of a stream."""


async def iter_sse_data(
    chunks: AsyncIterable[bytes],
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    where: str = "the server",
) -> AsyncIterator[bytes]:
    """Yields the data payload of each SSE event read from ``chunks``.

    Args:
        chunks: the response body in pieces of any size, as the network
            delivers them (`_http.Exchange.iter_body`). Lines
            are reassembled here, so no line-length limit of the HTTP client
            applies to a large event.
        max_event_bytes: the most data one event may hold.
        where: names the endpoint in the error for an event over the cap.

    An event ends at a blank line; a body that ends without one still yields
    its last event, because some servers close right after the final
    ``data:`` line.

    Raises:
        BackendError: an event (or one line) passed ``max_event_bytes``.
    """

    def too_long(size: int) -> BackendError:
        return too_large(
            where, "one stream event (read so far)", size, "max_event_bytes", max_event_bytes
        )

    parts: list[bytes] = []
    size = 0
    async for line in iter_lines(chunks, max_event_bytes, too_long):
        if not line:
            if parts:
                yield parts[0] if len(parts) == 1 else b"\n".join(parts)
                parts = []
                size = 0
        elif line.startswith(b"data:"):
            value = line[5:]
            if value.startswith(b" "):
                value = value[1:]
            size += len(value)
            if size > max_event_bytes:
                raise too_long(size)
            parts.append(value)
        # Comments (":keep-alive") and other fields carry nothing we use.
    if parts:
        yield b"\n".join(parts)
