"""A finished batch's result file, read from outside: one answer per request, the rest reported.

Both Batch API clients (OpenAI's result files, Anthropic's results stream)
hand their lines to one `ResultFile`, which trusts nothing in them:

* a line for a request the batch was not asked (an unknown ``custom_id``) is
  ignored and logged, never delivered to anyone;
* a second line for the same request fails that request: which answer is right
  cannot be told, and taking the last one would silently replace the first;
* a line of the wrong shape fails only its own request when its ``custom_id``
  can be read; a line that cannot be read at all is counted, and each request
  left without an answer names it.

The provider-specific part is a ``parse(custom_id, line) -> BatchReply`` that
reads one decoded line whose ``custom_id`` is known.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from plait.backends.types import Response
from plait.errors import BackendError

__all__ = ["BatchReply", "ResultFile", "iter_lines"]

logger = logging.getLogger("plait.backends")

_PREVIEW_BYTES = 200


@dataclass(frozen=True, slots=True)
class BatchReply:
    """The outcome of one request of a batch: a response, or why it has none."""

    custom_id: str
    response: Response | None = None
    error: BackendError | None = None


async def iter_lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """Yields the non-blank lines of a body that arrives in ``chunks`` of any size."""
    pending = b""
    async for chunk in chunks:
        lines = (pending + chunk).split(b"\n") if pending else chunk.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


class ResultFile:
    """Collects the result lines of one batch by ``custom_id`` (see the module doc).

    Args:
        where: names the batch and server in every message.
        custom_ids: the ids of the requests the batch was asked.
        parse: reads one decoded line whose ``custom_id`` is one of them.
    """

    def __init__(
        self,
        where: str,
        custom_ids: Iterable[str],
        parse: Callable[[str, dict[str, Any]], BatchReply],
    ) -> None:
        self.where = where
        self._parse = parse
        self._replies: dict[str, BatchReply | None] = dict.fromkeys(custom_ids)
        self._lines: dict[str, int] = {}
        self._unknown: list[str] = []
        self._unreadable: list[str] = []

    def add(self, line: bytes) -> None:
        """Reads one line of the result file."""
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError:
            self._unreadable.append(f"not JSON: {_preview(line)}")
            return
        custom_id = data.get("custom_id") if isinstance(data, dict) else None
        if not isinstance(custom_id, str):
            self._unreadable.append(f"no custom_id: {_preview(line)}")
            return
        if custom_id not in self._replies:
            self._unknown.append(custom_id)
            return
        count = self._lines[custom_id] = self._lines.get(custom_id, 0) + 1
        if count == 1:
            self._replies[custom_id] = self._parse(custom_id, data)
        else:
            self._replies[custom_id] = BatchReply(
                custom_id,
                error=BackendError(
                    f"{self.where}: the result file has {count} result lines for request "
                    f"{custom_id}; which one answers it cannot be told, so none is used"
                ),
            )

    def replies(self) -> dict[str, BatchReply]:
        """Returns the reply of every request that has one; logs the lines that answer none."""
        if self._unknown:
            logger.warning(
                "%s: %d result line(s) for requests this batch was not asked were ignored "
                "(first: %r)",
                self.where,
                len(self._unknown),
                self._unknown[0],
            )
        replies = {key: reply for key, reply in self._replies.items() if reply is not None}
        if self._unreadable:
            missing = [key for key, reply in self._replies.items() if reply is None]
            for custom_id in missing:
                replies[custom_id] = BatchReply(custom_id, error=self._unanswered(custom_id))
        return replies

    def _unanswered(self, custom_id: str) -> BackendError:
        count = len(self._unreadable)
        return BackendError(
            f"{self.where}: no result line answers request {custom_id}, and {count} line(s) "
            f"of the result file could not be read (the first: {self._unreadable[0]})"
        )


def _preview(line: bytes) -> str:
    shown = line[:_PREVIEW_BYTES].decode("utf-8", "replace")
    return shown + (" …" if len(line) > _PREVIEW_BYTES else "")
