"""plait's stream events as Server-Sent Events: each event type named, its data JSON.

========================  ==============  ================================================
plait event               SSE ``event:``  ``data:``
========================  ==============  ================================================
`OutputStreamChunk`       ``text``        ``{module, field, delta, content, complete}``
`ThoughtStreamChunk`      ``thought``     the same, for a reasoning field
`ToolCallEvent`           ``tool_call``   ``{module, tool, arguments, call_id}``
`ToolResultEvent`         ``tool_result`` ``{module, tool, content, ok, call_id}``
`StreamRestart`           ``restart``     ``{module, reason}``: drop that module's text so far
your own `StreamEvent`    ``event``       ``{type, module, data}`` (its fields as JSON)
the program's output      ``output``      ``{run_id, status, output, usage}``
a pause for approval      ``paused``      ``{run_id, status, program, pending, usage}``
the person's "no" stops   ``rejected``    ``{run_id, status, message, call_id, usage}``
a failure                 ``error``       ``{error: {type, message, request_id[, error_id]}}``
========================  ==============  ================================================

``module`` is the dotted path of the module call that made the event ("" for the program).
A stream ends with exactly one of ``output``, ``paused``, ``rejected`` or ``error``.
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

__all__ = ["event_data", "sse"]


def event_data(event: StreamEvent) -> tuple[str, dict[str, Any]]:
    """Returns the SSE name and JSON data of one plait stream event."""
    path = getattr(event, "module_path", "")
    if isinstance(event, OutputStreamChunk):
        name = "thought" if isinstance(event, ThoughtStreamChunk) else "text"
        return name, {
            "module": path,
            "field": event.field_name,
            "delta": event.delta,
            "content": event.content,
            "complete": event.is_complete,
        }
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
        }
    if isinstance(event, StreamRestart):
        return "restart", {"module": path, "reason": event.reason}
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
