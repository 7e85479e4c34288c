"""`TestBackend`: the ``test`` provider, which answers every call without a model.

A user's tests run their program against it instead of a real model: the
program goes through everything a real endpoint has (limits, retries, the
response cache, usage, budgets, streaming), no network is touched, and each
request the program made is kept in `TestBackend.calls` for assertions.

Each reply comes from the first of these that is given:

* ``function``: called with the `Request`, returns the reply (it may be async);
* ``replies``: a list used in turn, one per call; or a mapping, whose first
  key found in the last user turn's text chooses the reply;
* otherwise a reply made from the request: a valid JSON value of its schema
  for a typed call (a ``Literal`` field gets its first value, an int 0, a list
  one item), a call of the forced tool with valid arguments when a tool is
  required, and `PLAIN_TEXT` for plain text.

A reply may be text, a JSON-able value (a dict, a list: sent as its JSON
text), a `Response` (tool calls, usage and finish reason as given) or an
exception, which the call raises (a `plait.errors.RateLimitError` to see the
retries, say).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from plait.backends.base import Backend
from plait.backends.test._made import made_value
from plait.backends.types import Request, Response, StreamChunk, ToolCall, ToolSpec, Usage
from plait.errors import BackendError

__all__ = ["PLAIN_TEXT", "TestBackend"]

PLAIN_TEXT = "test reply"
"""What a call that asks for no schema and no tool is answered with."""

_CHUNK = 8
"""Characters per streamed chunk, so a streamed reply arrives in several pieces."""


class TestBackend(Backend):
    """Answers every call in-process, and records it; see the module's docstring.

    Args:
        replies: the replies, used in turn (a list), or by the first key found
            in the last user turn's text (a mapping); None makes each reply
            from the request.
        function: called with each `Request`; returns the reply (or an
            awaitable of it). It wins over ``replies``.
        model: the model name replies report (``"test"`` when not set).
        timeout: accepted like every backend's and unused: nothing waits.

    Use ``{"provider": "test"}`` (or the model string ``"test"``) when the
    made-up replies are enough; build one yourself, ``{"provider":
    TestBackend(replies=[...])}``, to give replies and to read ``calls``.
    The same settings also go in ``backend_options``.

    Example::

        backend = TestBackend(replies=['{"label": "spam"}'])
        config = {"llm": {"provider": backend}}
        ...
        assert backend.calls[0].response_schema is not None
    """

    __test__ = False  # a class named Test*, not a pytest test class
    provider = "test"

    def __init__(
        self,
        replies: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        function: Callable[[Request], Any] | None = None,
        model: str | None = None,
        timeout: float | None = None,
    ) -> None:
        if replies is not None and (
            isinstance(replies, str | bytes) or not _is_collection(replies)
        ):
            raise TypeError(
                "TestBackend replies must be a list of replies or a mapping of text to reply, "
                f"got {type(replies).__name__}"
            )
        if function is not None and not callable(function):
            raise TypeError(f"TestBackend function must be callable, got {type(function).__name__}")
        self.replies = replies
        self.function = function
        self.model = model or "test"
        self.calls: list[Request] = []
        """Every request received, in the order the calls reached this backend."""

    async def complete(self, request: Request) -> Response:
        """Records the request and returns its reply (raising it when it is an exception)."""
        index = len(self.calls)
        self.calls.append(request)
        reply = await self._reply(request, index)
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, Response):  # a copy: the layers above fill in its usage and meta
            response = replace(reply, usage=replace(reply.usage), meta=dict(reply.meta))
        else:
            response = _response(request, reply)
        if response.model is None:
            response.model = self.model
        if response.usage.total_tokens == 0:
            response.usage = _usage(request, response)
        return response

    async def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        """Yields the reply of `complete` a few characters at a time; the last chunk has usage."""
        response = await self.complete(request)
        text = response.text
        pieces = [text[start : start + _CHUNK] for start in range(0, len(text), _CHUNK)] or [""]
        for piece in pieces[:-1]:
            yield StreamChunk(text=piece)
        yield StreamChunk(
            text=pieces[-1],
            tool_calls=response.tool_calls,
            finish_reason=response.finish_reason,
            usage=response.usage,
        )

    async def _reply(self, request: Request, index: int) -> Any:
        if self.function is not None:
            reply = self.function(request)
            return await reply if inspect.isawaitable(reply) else reply
        if isinstance(self.replies, Mapping):
            return _chosen(self.replies, request)
        if self.replies is not None:
            if index >= len(self.replies):
                return BackendError(
                    f"TestBackend was given {len(self.replies)} replies and this is call "
                    f"{index + 1}; give one reply per call, or a function"
                )
            return self.replies[index]
        return _made_reply(request)

    def __repr__(self) -> str:
        given = "function" if self.function else "replies" if self.replies is not None else "made"
        return f"TestBackend({given}, {len(self.calls)} calls)"


def _is_collection(value: Any) -> bool:
    return isinstance(value, Mapping | Sequence)


def _chosen(replies: Mapping[str, Any], request: Request) -> Any:
    """The reply of the first key found in the last user turn's text."""
    asked = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
    for key, reply in replies.items():
        if key in asked:
            return reply
    keys = ", ".join(repr(k) for k in replies)
    return BackendError(
        f"TestBackend found none of its reply keys ({keys}) in the last user turn "
        f"{asked[:80]!r}; add a key, or give a function"
    )


def _made_reply(request: Request) -> Response:
    """A valid reply to the request: a forced tool's call, its schema's value, or plain text."""
    tool = _forced_tool(request)
    if tool is not None:
        arguments = json.dumps(made_value(tool.parameters))
        call = ToolCall(
            id=f"call_test_{len(request.messages)}", name=tool.name, arguments=arguments
        )
        return Response(text="", tool_calls=(call,), finish_reason="tool_calls")
    if request.response_schema is not None:
        return _response(request, made_value(request.response_schema.schema))
    return _response(request, PLAIN_TEXT)


def _forced_tool(request: Request) -> ToolSpec | None:
    """The tool a request requires (``tool_choice`` ``"required"`` or a tool's name)."""
    if not request.tools or request.tool_choice in (None, "auto", "none"):
        return None
    named = [t for t in request.tools if t.name == request.tool_choice]
    return named[0] if named else request.tools[0]


def _response(request: Request, reply: Any) -> Response:
    text = reply if isinstance(reply, str) else json.dumps(_plain(reply))
    return Response(text=text, finish_reason="stop")


def _plain(value: Any) -> Any:
    """A pydantic model as its JSON-able dict; anything else as it is."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


def _usage(request: Request, response: Response) -> Usage:
    """Token counts of about four characters each, so limits and usage see real numbers."""
    asked = sum(len(m.content) for m in request.messages) + sum(
        len(c.arguments) for m in request.messages for c in m.tool_calls
    )
    said = len(response.text) + sum(len(c.arguments) for c in response.tool_calls)
    return Usage(input_tokens=max(1, asked // 4), output_tokens=max(1, said // 4))
