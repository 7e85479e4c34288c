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
from collections.abc import AsyncIterable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from plait.backends._bounded import iter_lines, too_large
from plait.backends.types import Response
from plait.errors import BackendError

__all__ = ["BatchReply", "ResultFile"]

logger = logging.getLogger("plait.backends")

_PREVIEW_BYTES = 200


@dataclass(frozen=True, slots=True)
class BatchReply:
    """The outcome of one request of a batch: a response, or why it has none."""

    custom_id: str
    response: Response | None = None
    error: BackendError | None = None


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
        # Counts and the first example only: a flood of bad lines must cost nothing.
        self._unknown = 0
        self._first_unknown = ""
        self._unreadable = 0
        self._first_unreadable = ""

    async def read(self, chunks: AsyncIterable[bytes], max_line_bytes: int) -> None:
        """Reads a result file arriving in ``chunks``, line by line, as it arrives.

        Raises:
            BackendError: a line is longer than ``max_line_bytes``.
        """

        def too_long(size: int) -> BackendError:
            what = "a result line (read so far)"
            return too_large(self.where, what, size, "max_response_bytes", max_line_bytes)

        async for line in iter_lines(chunks, max_line_bytes, too_long):
            if line.strip():
                self.add(line)

    def add(self, line: bytes) -> None:
        """Reads one line of the result file."""
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError:
            self._note_unreadable(f"not JSON: {_preview(line)}")
            return
        custom_id = data.get("custom_id") if isinstance(data, dict) else None
        if not isinstance(custom_id, str):
            self._note_unreadable(f"no custom_id: {_preview(line)}")
            return
        if custom_id not in self._replies:
            self._unknown += 1
            self._first_unknown = self._first_unknown or custom_id
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

    def _note_unreadable(self, problem: str) -> None:
        self._unreadable += 1
        self._first_unreadable = self._first_unreadable or problem

    def replies(self) -> dict[str, BatchReply]:
        """Returns the reply of every request that has one; logs the lines that answer none."""
        if self._unknown:
            logger.warning(
                "%s: %d result line(s) for requests this batch was not asked were ignored "
                "(first: %r)",
                self.where,
                self._unknown,
                self._first_unknown,
            )
        replies = {key: reply for key, reply in self._replies.items() if reply is not None}
        if self._unreadable:
            missing = [key for key, reply in self._replies.items() if reply is None]
            for custom_id in missing:
                replies[custom_id] = BatchReply(custom_id, error=self._unanswered(custom_id))
        return replies

    def _unanswered(self, custom_id: str) -> BackendError:
        return BackendError(
            f"{self.where}: no result line answers request {custom_id}, and "
            f"{self._unreadable} line(s) of the result file could not be read (the first: "
            f"{self._first_unreadable})"
        )


def _preview(line: bytes) -> str:
    shown = line[:_PREVIEW_BYTES].decode("utf-8", "replace")
    return shown + (" …" if len(line) > _PREVIEW_BYTES else "")
