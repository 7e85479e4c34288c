"""The `Backend` protocol and its lazy output thunk.

A backend turns one provider-neutral `Request` into a `Response`. Concrete
backends implement two coroutines, `complete` and `stream`; this file builds
the richer interface of the design (seed 004) on top of them:

* `generate_from_context(action, ctx)` prepares one call whose conversation
  is ``ctx`` followed by ``action`` and returns a `ModelOutputThunk` at once,
  with the context that will hold the reply;
* `generate_from_raw(actions)` prepares one independent call per action.

Thunks are lazy: nothing is sent until a thunk is first awaited or iterated,
so a caller builds many and resolves them together (``asyncio.gather``). They
talk to this backend directly, which means they bypass everything the
resource layer adds: endpoint limits, retries, the response cache, usage and
cost totals, budgets. Inside a program, make calls through the program's
resources instead (`plait.execution.generate`, or a module). A thunk is
awaitable (the `Response`), async-iterable (text as it streams),
cancellable, and exposes `usage` once done.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from plait.backends.types import Message, Request, Response, StreamChunk, Usage

__all__ = ["Backend", "Context", "ModelOutputThunk"]


@dataclass(frozen=True, slots=True)
class Context:
    """An immutable conversation plus the request settings that go with it."""

    messages: tuple[Message, ...] = ()
    template: Request | None = None
    """Settings (model, options, tools, schema) copied into every request made from here."""

    def add(self, message: Message) -> Context:
        """Returns a new context with ``message`` appended."""
        return replace(self, messages=(*self.messages, message))

    def to_request(self, action: Message) -> Request:
        """Returns the request for ``action`` spoken after this conversation."""
        messages = (*self.messages, action)
        if self.template is None:
            return Request(messages=messages)
        return self.template.with_messages(messages)


class Backend(ABC):
    """Talks to one model endpoint in provider-neutral types.

    Implementations must not retry: the resource layer owns retries, limits
    and the cache, and needs to see every failure as a `BackendError`.

    Override `complete` (and `stream`, for real token streaming); override
    `aclose` when the backend holds connections or a model. A user-written
    backend is used like a built-in one: name its class, an instance, or a
    name given to `plait.resources.register_provider` as the ``provider`` of
    a configuration entry, and limits, retries, the cache, usage and streaming
    all apply.
    """

    provider: str = "abstract"

    @abstractmethod
    async def complete(self, request: Request) -> Response:
        """Makes one call and returns the whole reply.

        Raises:
            BackendError: (or a subclass) for every provider failure, with the
                HTTP status and whether it may be retried.
        """

    async def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        """Makes one call and yields the reply as it arrives; the last chunk has usage.

        Override this for real token streaming. The default makes the whole
        call with `complete` and yields it as one chunk, so a backend that only
        implements `complete` still works under ``astream``.
        """
        response = await self.complete(request)
        yield StreamChunk(
            text=response.text,
            tool_calls=response.tool_calls,
            finish_reason=response.finish_reason,
            usage=response.usage,
        )

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Releases connections or models. Override when the backend holds any."""

    def generate_from_context(
        self, action: Message, ctx: Context
    ) -> tuple[ModelOutputThunk, Context]:
        """Prepares a call for ``action`` after ``ctx``; nothing is sent until the thunk is awaited.

        The call goes straight to this backend (no limits, retries or cache;
        see the module docstring).

        Returns:
            The thunk of the reply, and the context with the action appended.
            ``ctx`` itself is never changed.
        """
        thunk = ModelOutputThunk(self, ctx.to_request(action))
        return thunk, ctx.add(action)

    def generate_from_raw(self, actions: Sequence[Request]) -> list[ModelOutputThunk]:
        """Prepares one independent call per request; thunks keep input order.

        Nothing is sent until a thunk is awaited; await them together
        (``asyncio.gather(*thunks)``) to run the calls concurrently. They
        bypass limits, retries and the cache (see the module docstring).
        """
        return [ModelOutputThunk(self, request) for request in actions]


class ModelOutputThunk:
    """The pending reply of one backend call.

    The call starts when the thunk is first awaited or iterated, so building
    many thunks costs nothing until the caller resolves them (concurrently,
    e.g. with ``asyncio.gather``). It calls the backend directly: no endpoint
    limits, retries, response cache or usage totals apply.

    Example::

        thunk, ctx = backend.generate_from_context(Message("user", "Hi"), Context())
        async for piece in thunk:      # streams text
            print(piece, end="")
        response = await thunk         # the same call, now finished
    """

    __slots__ = ("_backend", "_consumed", "_response", "_task", "request")

    def __init__(self, backend: Backend, request: Request) -> None:
        self._backend = backend
        self.request = request
        self._task: asyncio.Task[Response] | None = None
        self._response: Response | None = None
        self._consumed = False

    @property
    def is_computed(self) -> bool:
        """Whether the reply has fully arrived."""
        return self._response is not None

    @property
    def value(self) -> str | None:
        """The reply text once computed, else None."""
        return None if self._response is None else self._response.text

    @property
    def usage(self) -> Usage | None:
        """Token usage once computed, else None."""
        return None if self._response is None else self._response.usage

    def cancel(self) -> bool:
        """Cancels the call if it is still running; returns whether it was."""
        return self._task is not None and self._task.cancel()

    def _start(self) -> asyncio.Task[Response]:
        if self._task is None:
            self._task = asyncio.ensure_future(self._backend.complete(self.request))
        return self._task

    def __await__(self) -> Generator[Any, None, Response]:
        if self._response is not None:
            return self._response
        response = yield from self._start().__await__()
        self._response = response
        return response

    async def __aiter__(self) -> AsyncIterator[str]:
        """Yields reply text as it streams; if the call already ran, yields it whole."""
        if self._task is not None or self._consumed:
            yield (await self).text
            return
        self._consumed = True
        text: list[str] = []
        tool_calls: list[Any] = []
        usage: Usage | None = None
        finish: str | None = None
        async for chunk in self._backend.stream(self.request):
            if chunk.text:
                text.append(chunk.text)
                yield chunk.text
            tool_calls.extend(chunk.tool_calls)
            usage = chunk.usage or usage
            finish = chunk.finish_reason or finish
        self._response = Response(
            text="".join(text),
            tool_calls=tuple(tool_calls),
            usage=usage or Usage(),
            finish_reason=finish,
        )
