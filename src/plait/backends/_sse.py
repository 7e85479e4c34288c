"""A minimal Server-Sent Events reader for streamed chat completions.

Only what OpenAI-compatible servers send is handled: ``data:`` fields,
multi-line data joined by newlines, ``:`` comment lines (keep-alives) and
other fields (``event:``, ``id:``, ``retry:``) ignored. Writing it here
instead of depending on an SSE library keeps the streaming hot path to a few
``bytes`` operations per line.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

__all__ = ["DONE", "iter_sse_data"]

DONE = b"[DONE]"
"""The data payload OpenAI-compatible servers send as the last event of a stream."""


async def iter_sse_data(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """Yields the data payload of each SSE event read from ``chunks``.

    Args:
        chunks: the response body in pieces of any size, as the network
            delivers them (aiohttp's ``response.content.iter_any()``). Lines
            are reassembled here, so no line-length limit of the HTTP client
            applies to a large event.

    An event ends at a blank line; a body that ends without one still yields
    its last event, because some servers close right after the final
    ``data:`` line.
    """
    parts: list[bytes] = []
    pending = b""
    async for chunk in chunks:
        lines = (pending + chunk).split(b"\n") if pending else chunk.split(b"\n")
        pending = lines.pop()  # the unterminated tail, completed by the next chunk
        for raw in lines:
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                if parts:
                    yield parts[0] if len(parts) == 1 else b"\n".join(parts)
                    parts = []
            elif line.startswith(b"data:"):
                value = line[5:]
                parts.append(value[1:] if value.startswith(b" ") else value)
            # Comments (":keep-alive") and other fields carry nothing we use.
    tail = pending.rstrip(b"\r")
    if tail.startswith(b"data:"):
        value = tail[5:]
        parts.append(value[1:] if value.startswith(b" ") else value)
    if parts:
        yield b"\n".join(parts)
