"""Reading what a server sends within caps: a reply body, a line, a stream event.

A server decides how much it sends; without a cap, one endless SSE event or
a body of gigabytes grows the client until it dies. Every HTTP reply plait
reads from a provider is read within the endpoint's caps
(``max_response_bytes``, ``max_event_bytes``): here, or, for a whole reply
of the ``http`` transport, by its client as the bytes arrive
(`plait.backends.openai._http`), which reports a body over the cap with
`too_large` too. Reading stops as soon as a cap is passed, so the cost of a
hostile reply is the cap, never the reply. Exceeding one is a `BackendError`
that names the endpoint, the size, the setting and how to raise it; it is
not retried (the same server would send the same again).

The defaults are far above any real reply (a completion is kilobytes, a
stream event hundreds of bytes), so they only ever stop a broken or hostile
server. Only the standard library and plait's errors are imported here (the
resource configuration reads the defaults while ``import plait`` runs).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

from plait.errors import BackendError

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "iter_lines",
    "read_body",
    "read_chunks",
    "too_large",
]

_MIB = 1024 * 1024

DEFAULT_MAX_RESPONSE_BYTES = 64 * _MIB
"""Cap of one reply body, and of one line of a batch's result file."""

DEFAULT_MAX_EVENT_BYTES = 16 * _MIB
"""Cap of one Server-Sent Event of a streamed reply."""


def too_large(where: str, what: str, size: int, setting: str, limit: int) -> BackendError:
    """Returns the error for ``what`` having reached ``size`` bytes, over ``setting``."""
    return BackendError(
        f"{where} sent {what}: {_amount(size)}, more than {setting}={limit} "
        f"({_amount(limit)}); reading stopped there. If its replies are really this large, "
        f"raise {setting} in the endpoint's configuration"
    )


def _amount(size: int) -> str:
    if size < _MIB:
        return f"{size} bytes"
    return f"{size / _MIB:.1f} MiB"


async def read_body(response: Any, limit: int, where: str) -> bytes:
    """Returns an aiohttp response's whole body, refusing one over ``limit`` bytes.

    An ordinary reply declares its length: that is checked and the body read
    in one call, as cheap as without a cap. A body of unknown length
    (chunked) or compressed (whose declared length says nothing of what it
    inflates to) is read in pieces, stopping at the cap.
    """
    length = response.content_length
    if length is not None and "Content-Encoding" not in response.headers:
        if length > limit:
            raise too_large(
                where, "a reply body (its declared length)", length, "max_response_bytes", limit
            )
        body: bytes = await response.read()
        return body
    return await read_chunks(response.content.iter_any(), limit, where)


async def read_chunks(chunks: AsyncIterable[bytes], limit: int, where: str) -> bytes:
    """Returns the body arriving in ``chunks``, refusing one over ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_large(where, "a reply body (read so far)", size, "max_response_bytes", limit)
        parts.append(chunk)
    return b"".join(parts)


async def iter_lines(
    chunks: AsyncIterable[bytes], limit: int, too_long: Callable[[int], BackendError]
) -> AsyncIterator[bytes]:
    """Yields each line of a body arriving in ``chunks`` of any size, without its line break.

    A line longer than ``limit`` bytes raises ``too_long(size)`` as soon as
    that much of it is in, so an endless line costs ``limit``, not the line.
    The pieces of an unfinished line are kept apart until its end arrives
    (joining them on each chunk would copy a long line once per chunk).
    """
    held: list[bytes] = []
    held_size = 0
    async for chunk in chunks:
        if b"\n" not in chunk:
            held.append(chunk)
            held_size += len(chunk)
            if held_size > limit:
                raise too_long(held_size)
            continue
        if held:
            held.append(chunk)
            chunk = b"".join(held)
            held = []
        lines = chunk.split(b"\n")
        rest = lines.pop()
        for line in lines:
            if len(line) > limit:
                raise too_long(len(line))
            yield line[:-1] if line.endswith(b"\r") else line
        held_size = len(rest)
        if rest:
            held.append(rest)
            if held_size > limit:
                raise too_long(held_size)
    if held:
        line = b"".join(held)
        yield line[:-1] if line.endswith(b"\r") else line
