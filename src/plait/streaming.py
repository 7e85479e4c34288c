"""Streaming events: what a running program tells its consumer while it works.

``async for event in program.astream(x)`` (every `Module` has it) runs the
program and yields `StreamEvent`s as they happen — text as the model writes
it, per output field; tool calls and their results; your own progress events
— and, last, the program's output (a `Prediction` for Predict-like modules).
Events of concurrent branches interleave as they happen; each names the
module it came from (``event.module``, the object, and ``event.module_path``,
the dotted path of its call).

Anything running inside the program reaches the consumer with `emit_event`,
which is a cheap no-op when nobody streams. The stream is bounded: when the
consumer falls behind, producers that await `emit_event` (plait's own token
streams do) wait, so memory stays flat; breaking out of the ``async for``
cancels the program and its requests.

Text comes from the providers' real streams (OpenAI-compatible SSE,
Anthropic, llama.cpp), never from chopping a finished reply. A reply that
must be asked again — a dropped stream the resource layer retries, or a
structured reply re-asked because it was invalid — first emits
`StreamRestart` for its module: discard what that module streamed so far;
its text starts again from empty. Cache hits arrive as one chunk per field.

This module is in the data layer: it imports nothing from plait but the
context variables, so every layer may emit.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from plait import _context

__all__ = [
    "EventStream",
    "FieldStreamer",
    "OutputStreamChunk",
    "StreamEvent",
    "StreamRestart",
    "ThoughtStreamChunk",
    "ToolCallEvent",
    "ToolResultEvent",
    "emit_event",
    "is_streaming",
    "json_fields",
    "whole_text",
]


class StreamEvent:
    """Base class of every event; subclass it (a dataclass) for your own progress events.

    A `Prediction` is one too: the last item of a Predict-like module's
    stream, so ``isinstance(event, StreamEvent)`` keeps it with the events before it.

    Example::

        @dataclass
        class Progress(StreamEvent):
            step: str
            done: float

        emit_event(Progress("download", 0.5))   # from a forward, a tool, anywhere inside
    """

    __slots__ = ()


class _NamesItsModule:
    """What every event that comes from one module call carries: the module and its path.

    ``module`` is the object itself, to act on without a lookup; it
    is left out of the repr, which would print its whole tree.
    ``module_path`` is the dotted path of the call (``summarizer``,
    ``stage1.llm``), which tells two calls of one shared module apart; when
    an event is made without it, it is the path of the module call running
    where the event is made.
    """

    module: Any
    module_path: str

    def __post_init__(self) -> None:
        if not self.module_path:
            self.module_path = _context.module_path(self.module)


@dataclass
class OutputStreamChunk(_NamesItsModule, StreamEvent):
    """New text of one output field of one module call."""

    module: Any = field(repr=False)
    """The module that writes the field."""
    field_name: str
    """The output field: a signature's field, ``text`` for a plain reply."""
    delta: str
    """Text added since this field's previous chunk ("" on the closing chunk)."""
    content: str
    """The field's text so far (JSON text for a field that is not a string)."""
    is_complete: bool = False
    """True on the field's last chunk: ``content`` is then whole."""
    module_path: str = ""
    """The dotted path of that module's call."""


@dataclass
class ThoughtStreamChunk(OutputStreamChunk):
    """New text of a reasoning field (ChainOfThought's ``reasoning``), as it is written."""


@dataclass
class ToolCallEvent(_NamesItsModule, StreamEvent):
    """A module is about to run a tool the model asked for."""

    module: Any = field(repr=False)
    """The module that runs the tool."""
    tool_name: str
    arguments: Any
    """The arguments: a dict when they were valid JSON, else the model's text."""
    call_id: str = ""
    module_path: str = ""
    """The dotted path of that module's call."""


@dataclass
class ToolResultEvent(_NamesItsModule, StreamEvent):
    """What that tool call returned (``content`` is what the model is shown)."""

    module: Any = field(repr=False)
    """The module that ran the tool."""
    tool_name: str
    content: str
    ok: bool = True
    call_id: str = ""
    module_path: str = ""
    """The dotted path of that module's call."""
    error: str | None = None
    """Why the call did not run as asked, as `ToolResult.error` says: ``"declined"`` when a
    person rejected it (not a failure of the tool), ``"unknown_tool"`` …; None when it ran."""


@dataclass
class StreamRestart(_NamesItsModule, StreamEvent):
    """Discard what ``module`` streamed so far: its reply is being produced again."""

    module: Any = field(repr=False)
    """The module whose reply starts again."""
    reason: str
    module_path: str = ""
    """The dotted path of that module's call."""


class _Ready:
    """An awaitable that is already done (what `emit_event` returns when nothing waits)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        yield from ()


_READY = _Ready()


def is_streaming() -> bool:
    """Whether a consumer is streaming this run (so producing events is worth it)."""
    return _context.STREAM.get() is not None


def emit_event(event: StreamEvent) -> Any:
    """Sends ``event`` to the consumer of the enclosing ``astream``, if there is one.

    Callable from any code inside a running program — a ``forward``, an
    ``async def forward`` leaf, a tool (also one running in a worker thread)
    — without ``await``. The event is queued at once; the returned awaitable
    resolves when the stream has room again, so ``await emit_event(e)``
    applies the consumer's backpressure (plait's own producers do).
    """
    stream = _context.STREAM.get()
    if stream is None:
        return _READY
    return stream.put(event)


class EventStream:
    """The bounded, thread-safe queue between a running program and its ``astream`` consumer.

    Args:
        maxsize: events held before producers that await `put` are made to wait.
    """

    def __init__(self, maxsize: int = 256) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._items: deque[StreamEvent] = deque()
        self._maxsize = maxsize
        self._reader: asyncio.Future[None] | None = None
        self._space: deque[asyncio.Future[None]] = deque()
        self._closed = False

    def put(self, event: StreamEvent) -> Any:
        """Queues ``event``; returns an awaitable that resolves once there is room."""
        if threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self._append, event)
            return _READY
        self._append(event)
        if len(self._items) <= self._maxsize:
            return _READY
        waiter = self._loop.create_future()
        self._space.append(waiter)
        return waiter

    def _append(self, event: StreamEvent) -> None:
        self._items.append(event)
        self._wake_reader()

    def __len__(self) -> int:
        """Events waiting for the consumer now."""
        return len(self._items)

    def close(self) -> None:
        """Marks the end: `get` returns None once the queued events are taken."""
        self._closed = True
        self._wake_reader()

    def _wake_reader(self) -> None:
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)

    async def get(self) -> StreamEvent | None:
        """Returns the next event, waiting for one; None when closed and drained."""
        while not self._items:
            if self._closed:
                return None
            self._reader = self._loop.create_future()
            await self._reader
        event = self._items.popleft()
        while self._space and len(self._items) <= self._maxsize:
            waiter = self._space.popleft()
            if not waiter.done():
                waiter.set_result(None)
        return event


class FieldStreamer:
    """Turns the growing text of one reply into per-field chunk events.

    Args:
        module: the module whose reply it is; events name it.
        split: returns ``{field: text so far}`` for the reply text so far,
            fields in order (a JSON object parsed partially, marker sections,
            or the whole text as one field).
        thought_fields: fields whose chunks are `ThoughtStreamChunk`.
        path: the dotted path of the call, when the caller knows it better
            than the running module call does (an LLM node of a graph).

    A field is complete once a later field has begun, or when `finish` is
    called at the end of the reply.
    """

    def __init__(
        self,
        module: Any,
        split: Callable[[str], dict[str, str]],
        thought_fields: frozenset[str] = frozenset(),
        path: str = "",
    ) -> None:
        self.module = module
        self.path = path or _context.module_path(module)
        self._split = split
        self._thoughts = thought_fields
        self._text = ""
        self._contents: dict[str, str] = {}
        self._complete: set[str] = set()
        self.started = False

    async def text(self, delta: str) -> None:
        """Takes new reply text and emits the field chunks it adds."""
        self.started = True
        # The reply so far grows by concatenation, a copy of it per piece at C speed, where
        # joining a list of every piece again made each piece cost one step per piece
        # before it: 50,000 pieces took seconds of CPU.
        self._text += delta
        await self._emit(self._split(self._text), final=False)

    async def finish(self) -> None:
        """Emits the closing chunk of every field."""
        await self._emit(self._split(self._text), final=True)

    async def restart(self, reason: str) -> None:
        """Emits `StreamRestart` and forgets the text so far (the reply comes again)."""
        if self.started:
            await emit_event(StreamRestart(self.module, reason, self.path))
        self._text = ""
        self._contents.clear()
        self._complete.clear()
        self.started = False

    async def _emit(self, fields: dict[str, str], final: bool) -> None:
        names = list(fields)
        for position, name in enumerate(names):
            if name in self._complete:
                continue
            content = fields[name]
            before = self._contents.get(name, "")
            done = final or position < len(names) - 1
            if content == before and not done:
                continue
            if content.startswith(before):
                delta = content[len(before) :]
            elif before.startswith(content):  # trailing space trimmed once the field ended
                delta = ""
            else:  # a non-text value re-read from more JSON
                delta = content
            self._contents[name] = content
            if done:
                self._complete.add(name)
            chunk = ThoughtStreamChunk if name in self._thoughts else OutputStreamChunk
            await emit_event(chunk(self.module, name, delta, content, done, self.path))


def whole_text(field_name: str) -> Callable[[str], dict[str, str]]:
    """Returns a splitter that puts the whole reply in one field."""
    return lambda text: {field_name: text}


def json_fields(text: str) -> dict[str, str]:
    """Returns the fields of a JSON object that is still being written, parsed leniently.

    Strings come as their (partial) text; other values as compact JSON of what
    has arrived. Uses jiter's partial mode, which reads an unfinished object
    (and an unfinished last string) instead of failing.
    """
    import json  # import time: only a streamed structured reply

    import jiter  # import time: only a streamed structured reply

    start = text.find("{")
    if start < 0:
        return {}
    try:
        data = jiter.from_json(text[start:].encode(), partial_mode="trailing-strings")
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(key): value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        for key, value in data.items()
    }
