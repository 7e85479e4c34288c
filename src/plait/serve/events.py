"""plait's stream events as Server-Sent Events: each event type named, its data JSON.

========================  ==============  ================================================
plait event               SSE ``event:``  ``data:``
========================  ==============  ================================================
`OutputStreamChunk`       ``text``        ``{module, field, delta, complete[, keep]}``
`ThoughtStreamChunk`      ``thought``     the same, for a reasoning field
`ToolCallEvent`           ``tool_call``   ``{module, tool, arguments, call_id}``
`ToolResultEvent`         ``tool_result`` ``{module, tool, content, ok, call_id, error}``
`StreamRestart`           ``restart``     ``{module, reason}``: drop that module's text so far
your own `StreamEvent`    ``event``       ``{type, module, data}`` (its fields as JSON)
the program's output      ``output``      ``{run_id, status, output, usage}``
a pause for approval      ``paused``      ``{run_id, status, program, pending, usage}``
the person's "no" stops   ``rejected``    ``{run_id, status, message, call_id, usage}``
a failure                 ``error``       ``{error: {type, message, request_id[, error_id]}}``
========================  ==============  ================================================

``module`` is the dotted path of the module call that made the event ("" for the program).
A stream ends with exactly one of ``output``, ``paused``, ``rejected`` or ``error``.

Text comes as deltas: a client keeps each ``(module, field)``'s text and adds ``delta`` to
it; when the text is not the previous text plus more (a JSON value re-read as more of it
arrived, a trailing space trimmed, a module called again), the event also carries ``keep``,
the characters of the previous text to keep before adding ``delta``. So a stream's size
grows with the reply's, not with its square (each event repeating the whole text so far
made a 40,000-character reply in 10,000 pieces 201 MB of SSE). A ``restart`` empties the
text of every field of its module, and the next text starts from empty.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from plait.serve.programs import json_data
from plait.streaming import (
    OutputStreamChunk,
    StreamEvent,
    StreamRestart,
    ThoughtStreamChunk,
    ToolCallEvent,
    ToolResultEvent,
)

__all__ = ["RunEvents", "sse"]


class RunEvents:
    """Turns the events of one run into SSE names and JSON data, text as deltas.

    It keeps the text each ``(module, field)`` has shown its client so far (the client
    keeps the same), so that each text event carries only what changed.
    """

    def __init__(self) -> None:
        self._texts: dict[tuple[str, str], str] = {}

    def data(self, event: StreamEvent) -> tuple[str, dict[str, Any]]:
        """Returns the SSE name and JSON data of the run's next event."""
        path = getattr(event, "module_path", "")
        if isinstance(event, OutputStreamChunk):
            name = "thought" if isinstance(event, ThoughtStreamChunk) else "text"
            return name, self._text(path, event)
        if isinstance(event, StreamRestart):
            for key in [key for key in self._texts if key[0] == path]:
                del self._texts[key]
            return "restart", {"module": path, "reason": event.reason}
        return _other(event, path)

    def _text(self, path: str, event: OutputStreamChunk) -> dict[str, Any]:
        key = (path, event.field_name)
        before = self._texts.get(key, "")
        content = event.content
        self._texts[key] = content
        keep = len(before) if content.startswith(before) else _common_start(before, content)
        data = {
            "module": path,
            "field": event.field_name,
            "delta": content[keep:],
            "complete": event.is_complete,
        }
        if keep < len(before):  # the text changed before its end: keep its start, add the rest
            data["keep"] = keep
        return data


def _common_start(a: str, b: str) -> int:
    """Returns the length of the longest common prefix of ``a`` and ``b``."""
    low, high = 0, min(len(a), len(b))
    while low < high:  # bisect on prefix equality: O(n log n) compares at C speed
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _other(event: StreamEvent, path: str) -> tuple[str, dict[str, Any]]:
    """Returns the SSE name and data of an event that is not text or a restart."""
    if isinstance(event, ToolCallEvent):
        return "tool_call", {
            "module": path,
            "tool": event.tool_name,
            "arguments": json_data(event.arguments),
            "call_id": event.call_id,
        }
    if isinstance(event, ToolResultEvent):
        return "tool_result", {
            "module": path,
            "tool": event.tool_name,
            "content": event.content,
            "ok": event.ok,
            "call_id": event.call_id,
            "error": event.error,  # "declined": a person said no; the tool did not fail
        }
    return "event", {"type": type(event).__name__, "module": path, "data": _fields(event)}


def _fields(event: StreamEvent) -> Any:
    """Returns a custom event's own fields as JSON data (the module object left out)."""
    if dataclasses.is_dataclass(event):
        values = {
            f.name: getattr(event, f.name)
            for f in dataclasses.fields(event)
            if f.name not in ("module", "module_path")
        }
        return json_data(values)
    return json_data(getattr(event, "__dict__", {}))


def sse(name: str, data: Any) -> bytes:
    """Returns one Server-Sent Event: its name and one line of JSON data."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {text}\n\n".encode()
