"""Mellea's backend interface: lazy thunks, contexts that gain their replies, components.

Mellea's code calls the model through methods of the backend itself::

    thunk, ctx = backend.generate_from_context(action, ctx, format=..., model_options=...)
    thunks = backend.generate_from_raw(actions, ctx)
    await backend.do_generate_walk(component)

`plait.backends.base.Backend` keeps those four methods as one-line
forwarders to the functions here, so that code runs as written while the
backends themselves hold only the transport contract (``complete``,
``stream``, ``aclose``) and import nothing from the layers above them.

* `generate_from_context` prepares one call whose conversation is ``ctx``
  followed by ``action`` and returns a `ModelOutputThunk` at once, with the
  context after the call, which holds the reply as soon as the thunk is
  computed;
* `generate_from_raw` prepares one independent call per action;
* `compute_thunks` computes, concurrently, the thunks inside trees of
  components (`CBlock`, `Component`), so that they can be rendered: an
  action may be built from the replies of earlier calls.

Thunks are lazy: nothing is sent until a thunk is first awaited or iterated,
so a caller builds many and resolves them together (``asyncio.gather``). They
call their backend directly, and so bypass everything the resource layer
adds: endpoint limits, retries, the response cache, usage and cost totals,
budgets. That is the price of Mellea's shape, where the backend object is the
thing called and no program or alias is in sight to say whose limits apply.
Inside a program, make calls through the program's resources instead
(`plait.execution.generate`, or a module). A thunk is awaitable (the
`Response`), async-iterable (text as it streams), cancellable, and exposes
`usage` once done.

Example::

    class Compare(Component):
        def __init__(self, a, b):
            self.a, self.b = a, b

        def parts(self):
            return [CBlock("Which is better?"), self.a, self.b]

    first, second = backend.generate_from_raw(["Write a haiku.", "Write a limerick."])
    thunk, ctx = backend.generate_from_context(Compare(first, second), Context())
    reply = await thunk          # both poems are written concurrently, then compared
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from plait.backends.types import (
    Message,
    Request,
    Response,
    ResponseSchema,
    Role,
    SamplingOptions,
    ToolSpec,
    Usage,
)
from plait.execution.structured import output_type_for
from plait.tools import Tool

if TYPE_CHECKING:
    from plait.backends.base import Backend

__all__ = [
    "CBlock",
    "Component",
    "Context",
    "ModelOutputThunk",
    "compute_thunks",
    "generate_from_context",
    "generate_from_raw",
    "generate_walk",
    "render",
]


class Context:
    """An immutable conversation, with replies still to come, plus its request settings.

    `generate_from_context` returns the context *after* the call: the
    action it was given, then the reply, which appears in `messages` once its
    thunk is computed (before that the reply is not known, so it is left out).
    A context built on one whose reply is still pending waits for that reply
    when it is used for a call. Contexts are values: ``add`` returns a new one.

    Args:
        messages: the turns so far.
        template: settings (model, options, tools, schema) copied into every
            request made from here.
    """

    __slots__ = ("_parts", "template")

    def __init__(self, messages: Iterable[Message] = (), template: Request | None = None) -> None:
        self._parts: tuple[Any, ...] = tuple(messages)
        self.template = template

    @classmethod
    def _of(cls, parts: tuple[Any, ...], template: Request | None) -> Context:
        ctx = cls(template=template)
        ctx._parts = parts
        return ctx

    @property
    def messages(self) -> tuple[Message, ...]:
        """The turns known now: each pending reply is added once its thunk is computed."""
        known = (_known_message(part) for part in self._parts)
        return tuple(message for message in known if message is not None)

    @property
    def pending(self) -> tuple[ModelOutputThunk, ...]:
        """The thunks whose results this context still waits for (replies, action parts)."""
        return tuple(
            thunk
            for part in self._parts
            if not isinstance(part, Message)
            for thunk in generate_walk(part.source)
        )

    def add(self, message: Message) -> Context:
        """Returns a new context with ``message`` appended."""
        return Context._of((*self._parts, message), self.template)

    def to_request(self, action: Message) -> Request:
        """Returns the request for ``action`` spoken after this conversation.

        Raises:
            RuntimeError: a reply of this context is still pending; await it first.
        """
        if self.pending:
            raise RuntimeError(
                "this context still waits for a reply (a thunk not yet awaited); await it, "
                "or make the call with backend.generate_from_context, which waits for it"
            )
        return _request(self.template, (*self.messages, action))

    def _then(self, role: Role, source: Any) -> Context:
        return Context._of((*self._parts, _Pending(role, source)), self.template)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Context):
            return NotImplemented
        return self._parts == other._parts and self.template == other.template

    __hash__ = None  # type: ignore[assignment]  # replies arrive later

    def __repr__(self) -> str:
        return f"Context(turns={len(self._parts)}, pending={len(self.pending)})"


@dataclass(frozen=True, slots=True, eq=False)
class _Pending:
    """A turn whose text is known once some thunks are computed (a reply, or a Component)."""

    role: Role
    source: Any


def _known_message(part: Any) -> Message | None:
    """Returns the message of a context part, or None while its text is not known."""
    if isinstance(part, Message):
        return part
    source = part.source
    if isinstance(source, ModelOutputThunk):
        response = source._response
        if response is None:
            return None
        return Message(part.role, response.text, tool_calls=response.tool_calls)
    return None if generate_walk(source) else Message(part.role, render(source))


def _request(template: Request | None, messages: tuple[Message, ...]) -> Request:
    return Request(messages=messages) if template is None else template.with_messages(messages)


class ModelOutputThunk:
    """The pending reply of one backend call.

    The call starts when the thunk is first awaited or iterated, so building
    many thunks costs nothing until the caller resolves them (concurrently,
    e.g. with ``asyncio.gather`` or `compute_thunks`). It calls the
    backend directly: no endpoint limits, retries, response cache or usage
    totals apply. ``request`` is known at once, or — for an action whose
    text depends on other thunks — once the call starts.

    Example::

        thunk, ctx = backend.generate_from_context(Message("user", "Hi"), Context())
        async for piece in thunk:      # streams text
            print(piece, end="")
        response = await thunk         # the same call, now finished
        [m.role for m in ctx.messages] # ['user', 'assistant']
    """

    __slots__ = ("_backend", "_consumed", "_prepare", "_response", "_task", "request")

    def __init__(
        self,
        backend: Backend,
        request: Request | None = None,
        *,
        prepare: Callable[[], Awaitable[Request]] | None = None,
    ) -> None:
        if (request is None) == (prepare is None):
            raise TypeError("ModelOutputThunk needs a request or a prepare() coroutine, not both")
        self._backend = backend
        self.request = request
        self._prepare = prepare
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

    async def _request(self) -> Request:
        if self.request is None:
            assert self._prepare is not None
            self.request = await self._prepare()
        return self.request

    async def _call(self) -> Response:
        return await self._backend.complete(await self._request())

    def _start(self) -> asyncio.Task[Response]:
        if self._task is None:
            self._task = asyncio.ensure_future(self._call())
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
        async for chunk in self._backend.stream(await self._request()):
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


logger = logging.getLogger("plait.porting.mellea")


# ------------------------------------------------------------- the calls
def generate_from_context(
    backend: Backend,
    action: Any,
    ctx: Context,
    *,
    format: Any = None,
    model_options: Mapping[str, Any] | None = None,
    tool_calls: bool = False,
) -> tuple[ModelOutputThunk, Context]:
    """Prepares a call for ``action`` after ``ctx``; nothing is sent until the thunk is awaited.

    Mellea writes it ``backend.generate_from_context(action, ctx, ...)``. The
    call goes straight to ``backend`` (no limits, retries or cache; see the
    module docstring).

    Args:
        backend: the backend that makes the call.
        action: the last turn: a `Message`, text (a user turn), or a `CBlock`
            / `Component` (rendered into a user turn once the thunks inside
            it are computed, concurrently, when the call starts).
        ctx: the conversation before it; never changed.
        format: a type (pydantic model, ``list[str]`` …) or a
            `ResponseSchema` the reply must follow (constrained decoding).
            The thunk's value stays the reply text; for a validated typed
            reply, re-asked once when invalid, call through a module or
            `plait.execution.generate` (``ask_structured``) instead.
        model_options: sampling options upserted into the context's
            defaults: ``temperature``, ``max_tokens`` (or Mellea's
            ``max_new_tokens``), ``top_p``, ``stop``, ``seed``,
            ``presence_penalty``, ``frequency_penalty``, and ``model``.
        tool_calls: offer the tools of the action (its ``tools``
            attribute: `plait.Tool`s, functions or `ToolSpec`s), so the
            reply may call them (``(await thunk).tool_calls``).

    Returns:
        The thunk of the reply, and the context after the call: ``ctx``,
        the action, then the reply once the thunk is computed.

    Raises:
        TypeError: an action, option or format of an unknown kind.
    """
    settings = _CallSettings.of(action, format, model_options, tool_calls).honoured_by(backend)
    action_message = _action_message(action)
    if action_message is not None and not ctx.pending:
        request = settings.apply(ctx.to_request(action_message))
        thunk = ModelOutputThunk(backend, request)
    else:

        async def prepare() -> Request:
            # The earlier replies and the action's own parts, all at once.
            sources = [p.source for p in ctx._parts if isinstance(p, _Pending)]
            await compute_thunks(sources if action_message else [*sources, action])
            message = action_message or Message("user", render(action))
            return settings.apply(ctx.to_request(message))

        thunk = ModelOutputThunk(backend, prepare=prepare)
    after = ctx.add(action_message) if action_message is not None else ctx._then("user", action)
    return thunk, after._then("assistant", thunk)


def generate_from_raw(
    backend: Backend,
    actions: Sequence[Any],
    ctx: Context | None = None,
    *,
    format: Any = None,
    model_options: Mapping[str, Any] | None = None,
    tool_calls: bool = False,
) -> list[ModelOutputThunk]:
    """Prepares one independent call per action; thunks keep input order.

    Mellea writes it ``backend.generate_from_raw(actions, ctx, ...)``. Each
    action is a `Request` (sent as it is, with ``format`` / ``model_options``
    applied if given), or anything `generate_from_context` takes as an
    action, sent alone: no conversation is used, only the settings of
    ``ctx.template`` when a context is given. Nothing is sent until a thunk
    is awaited; await them together (``asyncio.gather(*thunks)``, or
    `compute_thunks`) to run the calls concurrently. They bypass limits,
    retries and the cache (see the module docstring).
    """
    template = ctx.template if ctx is not None else None
    thunks = []
    for action in actions:
        settings = _CallSettings.of(action, format, model_options, tool_calls).honoured_by(backend)
        if isinstance(action, Request):
            thunks.append(ModelOutputThunk(backend, settings.apply(action)))
            continue
        message = _action_message(action)
        if message is not None:
            thunks.append(ModelOutputThunk(backend, settings.apply(_request(template, (message,)))))
            continue
        thunks.append(ModelOutputThunk(backend, prepare=_raw_preparer(action, template, settings)))
    return thunks


def _raw_preparer(
    action: Any, template: Request | None, settings: _CallSettings
) -> Callable[[], Awaitable[Request]]:
    async def prepare() -> Request:
        await compute_thunks([action])
        message = Message("user", render(action))
        return settings.apply(_request(template, (message,)))

    return prepare


async def compute_thunks(actions: Sequence[Any]) -> None:
    """Computes, concurrently, every uncomputed thunk inside any of ``actions`` (component trees).

    Mellea writes it ``backend.do_generate_walk(action)`` and
    ``backend.do_generate_walks(actions)``. A thunk reachable from two
    actions is computed once, and each is sent through the backend that made
    it (see `generate_walk`).
    """
    thunks: dict[int, ModelOutputThunk] = {}
    for action in actions:
        for thunk in generate_walk(action):
            thunks.setdefault(id(thunk), thunk)
    if thunks:
        await asyncio.gather(*thunks.values())


# ------------------------------------------------------------- components
class CBlock:
    """A block of text in a prompt (Mellea's content block).

    Args:
        value: the text.
        meta: anything the caller wants to keep with it (not sent).
    """

    __slots__ = ("meta", "value")

    def __init__(self, value: str, meta: dict[str, Any] | None = None) -> None:
        if not isinstance(value, str):
            raise TypeError(f"CBlock holds text, got {type(value).__name__}")
        self.value = value
        self.meta = dict(meta or {})

    def __str__(self) -> str:
        return self.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CBlock) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"CBlock({self.value!r})"


class Component(ABC):
    """A piece of a prompt made of parts, rendered once every reply inside it is known.

    Implement `parts`; override `format_for_llm` to lay the parts out
    otherwise than one per line. A component may carry ``tools`` (an
    iterable of `plait.Tool`s, functions or `ToolSpec`s) offered when it is
    the action of ``generate_from_context(..., tool_calls=True)``.
    """

    @abstractmethod
    def parts(self) -> Sequence[Component | CBlock | ModelOutputThunk]:
        """Returns the parts, in order: blocks, components and thunks."""

    def format_for_llm(self) -> str:
        """Returns the text sent to the model: each part rendered, one per line.

        Override this for another layout (use `render` on parts).

        Raises:
            RuntimeError: a thunk inside has not been computed yet.
        """
        return "\n".join(render(part) for part in self.parts())


def generate_walk(c: CBlock | Component | ModelOutputThunk) -> list[ModelOutputThunk]:
    """Returns the uncomputed thunks reachable from ``c``, depth first over `Component.parts`.

    Raises:
        ValueError: something in the tree is not a CBlock, Component or ModelOutputThunk.
    """
    found: list[ModelOutputThunk] = []
    _walk(c, found, set())
    return found


def _walk(item: Any, found: list[ModelOutputThunk], seen: set[int]) -> None:
    if isinstance(item, ModelOutputThunk):
        if not item.is_computed and id(item) not in seen:
            seen.add(id(item))
            found.append(item)
    elif isinstance(item, Component):
        if id(item) in seen:
            return  # a component reachable twice (or a cycle) is walked once
        seen.add(id(item))
        for part in item.parts():
            _walk(part, found, seen)
    elif not isinstance(item, CBlock):
        raise ValueError(
            f"generate_walk found a {type(item).__name__} ({item!r:.60}); a component's parts "
            "must be CBlocks, Components or ModelOutputThunks (wrap text in CBlock(...))"
        )


def render(item: CBlock | Component | ModelOutputThunk) -> str:
    """Returns the text of a block, a component (`Component.format_for_llm`) or a computed thunk.

    Raises:
        RuntimeError: a thunk has not been computed; resolve the tree first
            (``await backend.do_generate_walk(item)``).
        ValueError: ``item`` is none of these.
    """
    if isinstance(item, CBlock):
        return item.value
    if isinstance(item, Component):
        return item.format_for_llm()
    if isinstance(item, ModelOutputThunk):
        if item.value is None:
            raise RuntimeError(
                "a ModelOutputThunk inside the prompt has not been computed; await it, or "
                "call `await backend.do_generate_walk(component)` before rendering"
            )
        return item.value
    raise ValueError(
        f"cannot render a {type(item).__name__}; expected a CBlock, Component or ModelOutputThunk"
    )


# ------------------------------------------------------------- call settings
_OPTION_NAMES = frozenset(f.name for f in fields(SamplingOptions))


@dataclass(frozen=True, slots=True)
class _CallSettings:
    """What ``format=``, ``model_options=`` and ``tool_calls=`` add to a request."""

    schema: ResponseSchema | None
    options: dict[str, Any]
    model: str | None
    tools: tuple[ToolSpec, ...]

    @classmethod
    def of(
        cls,
        action: Any,
        format: Any,
        model_options: Mapping[str, Any] | None,
        tool_calls: bool,
    ) -> _CallSettings:
        options = dict(model_options or {})
        if "max_new_tokens" in options:  # Mellea's name
            options.setdefault("max_tokens", options.pop("max_new_tokens"))
        model = options.pop("model", None)
        unknown = sorted(set(options) - _OPTION_NAMES)
        if unknown:
            known = ", ".join(sorted(_OPTION_NAMES | {"max_new_tokens", "model"}))
            raise TypeError(f"unknown model option(s) {', '.join(unknown)}; known: {known}")
        if isinstance(options.get("stop"), list):
            options["stop"] = tuple(options["stop"])
        tools = _tool_specs(getattr(action, "tools", None) or ()) if tool_calls else ()
        return cls(_schema_of(format), options, model, tools)

    def honoured_by(self, backend: Backend) -> _CallSettings:
        """These settings without ``format`` when ``backend`` cannot follow a response schema.

        Mellea's rule: such a backend logs a warning and continues to
        generate (free text), rather than failing the call.
        """
        if self.schema is None or getattr(backend, "follows_response_schema", True):
            return self
        logger.warning(
            "%s cannot constrain replies to format=%s; the call continues without it",
            type(backend).__name__,
            self.schema.name,
        )
        return replace(self, schema=None)

    def apply(self, request: Request) -> Request:
        changes: dict[str, Any] = {}
        if self.schema is not None:
            changes["response_schema"] = self.schema
        if self.options:
            changes["options"] = replace(request.options, **self.options)
        if self.model is not None:
            changes["model"] = self.model
        if self.tools:
            changes["tools"] = (*request.tools, *self.tools)
            changes["tool_choice"] = request.tool_choice or "auto"
        return replace(request, **changes) if changes else request


def _schema_of(format: Any) -> ResponseSchema | None:
    if format is None or isinstance(format, ResponseSchema):
        return format
    return output_type_for(format).schema


def _tool_specs(tools: Iterable[Any]) -> tuple[ToolSpec, ...]:
    specs = []
    for item in tools:
        if isinstance(item, ToolSpec):
            specs.append(item)
        elif isinstance(getattr(item, "spec", None), ToolSpec):
            specs.append(item.spec)
        elif callable(item):
            specs.append(Tool(item).spec)
        else:
            raise TypeError(
                f"a tool of the action is {type(item).__name__}; expected a plait Tool, a "
                "function or a ToolSpec"
            )
    return tuple(specs)


def _action_message(action: Any) -> Message | None:
    """Returns the turn of an action known now, or None for one rendered later (a component).

    Raises:
        TypeError: the action is of no kind a backend takes.
    """
    if isinstance(action, Message):
        return action
    if isinstance(action, str):
        return Message("user", action)
    if isinstance(action, CBlock):
        return Message("user", action.value)
    if isinstance(action, Component):
        return None
    raise TypeError(
        f"an action is a Message, text, a CBlock or a Component; got {type(action).__name__}"
    )
