"""Tools: Python functions a model may call, described by a JSON schema.

`Tool` wraps a sync or async function. The JSON schema of its arguments is
built from the type hints (a pydantic model is made from the signature), and
descriptions come from ``Annotated[T, Field(description=...)]``, a
``Field(...)`` default, or the docstring's ``Args:`` section, in that order.

`Tool.call` is what an agent loop uses: it takes the arguments as the model
sent them (JSON text or a dict) and *never raises* for a bad call. Invalid
JSON, arguments that fail validation (each problem named by argument),
exceptions raised by the function, a call that outlives its timeout and a
return value that cannot be turned into text all come back as a `ToolResult`
with ``ok=False`` whose ``content`` is written for the model to read and
correct itself. Only cancellation propagates.

Every wait is bounded: a call may take `DEFAULT_TIMEOUT` seconds unless the
tool says otherwise, and a sync function runs in a worker thread, so a tool
that blocks (``time.sleep``, a blocking HTTP client) stalls neither the event
loop nor the other calls in flight.

Example::

    from typing import Annotated
    from pydantic import Field
    from plait import tool

    @tool
    def add(a: float, b: Annotated[float, Field(description="Second addend")]) -> float:
        \"\"\"Adds two numbers.

        Args:
            a: First addend.
        \"\"\"
        return a + b

    add.spec.parameters["properties"]["a"]   # {'type': 'number', 'description': 'First addend.'}
    await add.call('{"a": 1, "b": 2}')        # ToolResult(ok=True, content='3.0', ...)
    add(1, 2)                                 # 3.0 — still the plain function
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import json
import re
import threading
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, overload

import orjson

from plait._jsondata import compact_json
from plait.backends.types import Message, ToolSpec
from plait.callbacks import ReportedCall, active_callbacks
from plait.confirmation import (
    ConfirmationRequired,
    approved,
    confirm_call,
    current_tool_call,
)
from plait.errors import ConfirmationRejected, PlaitError
from plait.media import Media

__all__ = [
    "DEFAULT_TIMEOUT",
    "Tool",
    "ToolCallError",
    "ToolResult",
    "tool",
    "tool_identity",
    "tool_table",
]

DEFAULT_TIMEOUT = 60.0
"""Seconds a tool call may take unless the tool sets ``timeout`` (``None`` disables it).

Long enough for a slow web request, short enough that a hung tool costs the
agent one error turn instead of the whole run."""

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""Tool names OpenAI accepts (Anthropic's rule is the same); checked when a tool is made."""

_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Returns?|Yields?|Raises|"
    r"Examples?|Notes?|Attributes|See Also|Warnings?):\s*$"
)
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


class ToolCallError(PlaitError):
    """A tool called with `Tool.acall` could not run: bad arguments, a timeout.

    Attributes:
        result: the `ToolResult` that says what went wrong (``error``, ``content``).
    """

    def __init__(self, result: ToolResult) -> None:
        super().__init__(result.content)
        self.result = result


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of one tool call, ready to be shown to the model."""

    name: str
    """The tool's name (as the model called it)."""
    content: str
    """The text the model sees: the return value as text, or the error explained."""
    ok: bool = True
    """False when the call was refused (bad arguments, unknown tool) or the tool raised."""
    value: Any = None
    """The function's return value (None when the call failed)."""
    error: str | None = None
    """Kind of failure: ``invalid_arguments``, ``unknown_tool``, ``timeout``, ``exception``,
    ``unserialisable_result`` (the return value could not be turned into text), and from an
    agent ``declined`` (the person said no) or ``repeated`` (the person already answered the
    same call in this run, so it was not asked about again)."""
    exception: BaseException | None = None
    """The exception the tool raised, for the program (the model only sees ``content``)."""
    call_id: str | None = None
    """The id of the model's tool call this answers, when known."""
    media: tuple[Any, ...] = ()
    """Images, audio or documents the value carries (`plait.Image` …): an agent shows them
    to the model as inputs in the turn after the tool results, since providers take
    media only in a user's turn."""

    def to_message(self) -> Message:
        """Returns the ``tool`` turn that answers the call."""
        return Message("tool", self.content, tool_call_id=self.call_id, name=self.name)


class Tool:
    """A function the model can call, with a JSON schema of its arguments.

    Args:
        func: a sync or async function (or callable). Every parameter must be
            nameable by keyword; ``*args`` and ``**kwargs`` are refused.
        name: the name the model sees; defaults to ``func.__name__``.
        description: what the tool does; defaults to the docstring's text
            before its first section (``Args:``, ``Returns:`` …).
        in_thread: run a *sync* function in a worker thread (the default),
            so a blocking tool stalls neither the event loop nor the other
            calls in flight, and several calls of one turn overlap. Pass
            False for a function that must run on the loop's thread, e.g.
            one that touches loop-bound objects (an ``asyncio.Queue``, an
            HTTP connection); it then blocks everything while it runs and
            cannot be timed out. Async functions always run on the loop.
        timeout: seconds a call may take (`DEFAULT_TIMEOUT` unless given;
            None: no limit); a slower call becomes an error result (the
            model is told) instead of hanging the agent. Python cannot kill
            a thread: a timed-out sync tool keeps running in the background
            until it returns on its own, and its result is dropped.
        max_result_chars: longest result text shown to the model; longer
            results are cut (saying how much), so one verbose tool cannot
            overflow the agent's context. ``ToolResult.value`` stays whole.
        require_confirmation: ask a person before running (a tool with side
            effects): `call` raises `plait.confirmation.ConfirmationRequired`
            unless the call was approved; `ReAct` (and `Predict`, and a
            module whose ``forward`` takes ``resume_state=``) pauses and
            resumes around it. A function wrapped in
            `plait.confirmation.confirm_first` requires it too.

    Raises:
        ValueError: the name is not 1-64 letters, digits, ``_`` or ``-``.
        TypeError: the function takes ``*args``/``**kwargs`` or a type hint
            cannot be resolved.

    A `Tool` is still the function: ``tool(2, 3)`` calls it directly (and
    returns a coroutine for an async one). Used as a method decorator, it
    binds to the instance like a function does.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        name: str | None = None,
        description: str | None = None,
        *,
        in_thread: bool = True,
        timeout: float | None = DEFAULT_TIMEOUT,
        max_result_chars: int = 8000,
        require_confirmation: bool = False,
    ) -> None:
        if not callable(func):
            raise TypeError(f"Tool needs a callable, got {type(func).__name__}")
        self.func = func
        self.name = name if name is not None else getattr(func, "__name__", "")
        if not _NAME.match(self.name):
            raise ValueError(
                f"tool name {self.name!r} is not valid: use 1-64 letters, digits, '_' or '-'; "
                "pass name=... (e.g. Tool(fn, name='search'))"
            )
        summary, arg_docs = _parse_docstring(inspect.getdoc(func) or "")
        self.description = description if description is not None else summary
        self.in_thread = in_thread
        self.timeout = timeout
        self.max_result_chars = max_result_chars
        self.require_confirmation = require_confirmation or bool(
            getattr(func, "plait_requires_confirmation", False)
        )
        self._is_async = _is_async_callable(func)
        self._params = _keyword_parameters(func, self.name)
        self.args_model = _build_args_model(func, self.name, self._params)
        self.parameters = _schema_of(self.args_model, arg_docs)
        functools.update_wrapper(self, func, updated=())

    @property
    def spec(self) -> ToolSpec:
        """Returns the provider-neutral description sent in ``Request.tools``."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    @property
    def is_async(self) -> bool:
        """Whether the function is a coroutine function."""
        return self._is_async

    # ----------------------------------------------------------------- calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __get__(self, instance: Any, owner: type | None = None) -> Tool:
        if instance is None or not hasattr(self.func, "__get__"):
            return self
        bound = Tool.__new__(Tool)
        bound.__dict__.update(self.__dict__)
        bound.func = self.func.__get__(instance, owner)
        return bound

    async def call(
        self, arguments: str | Mapping[str, Any] | None = None, *, call_id: str | None = None
    ) -> ToolResult:
        """Validates the model's arguments, runs the tool and returns the result.

        Never raises for a bad call: invalid JSON, failed validation,
        exceptions from the tool, a timeout and a result that cannot be
        turned into text become a `ToolResult` with ``ok=False`` whose content
        tells the model what went wrong. Cancellation propagates, and so does
        `ConfirmationRequired`: a tool that needs a person's approval (and
        has not got it for this ``call_id``) stops the agent instead of running;
        and `ConfirmationRejected`, when a resuming module makes again the
        call the person declined (`plait.confirmation.confirm_call`).

        Args:
            arguments: the arguments as JSON text (as the model sent them) or
                a mapping; None or ``""`` means no arguments.
            call_id: the id of the model's tool call, copied to the result;
                approvals are given by this id.
        """
        callbacks = active_callbacks()
        inputs = {"arguments": arguments, "call_id": call_id}
        with ReportedCall("tool", self, inputs, callbacks) as call:
            result = call.outputs = await self._checked_call(arguments, call_id)
            call.exception = result.exception
        return result

    async def acall(self, **kwargs: Any) -> Any:
        """Runs the tool on keyword arguments and returns what the function returned.

        The arguments are validated and the call is timed, confirmed and
        reported to callbacks exactly as in `call`; but where `call` hands
        every failure back as text for a model, this raises it, as a direct
        call would.

        Raises:
            ToolCallError: the arguments are invalid, the call timed out, or
                (never for an exception of the tool's own) it could not finish.
            Exception: whatever the tool itself raised.
            ConfirmationRequired: the tool needs a person's approval first.
            ConfirmationRejected: the person declined this call.
        """
        result = await self.call(kwargs)
        if result.ok:
            return result.value
        if result.error == "exception" and result.exception is not None:
            raise result.exception
        raise ToolCallError(result)

    async def _checked_call(
        self, arguments: str | Mapping[str, Any] | None, call_id: str | None
    ) -> ToolResult:
        data, problem = _decode_arguments(arguments)
        kwargs: dict[str, Any] = {}
        if data is not None:
            kwargs, problem = self.validate_arguments(data)
        if problem is not None:
            return self._invalid(problem, call_id)
        if not self.require_confirmation:
            with current_tool_call(call_id):
                return await self._run(kwargs, call_id)
        shown = json.dumps(data, ensure_ascii=False, default=str)
        decided = confirm_call(call_id, self.name, data, f"Run the tool {self.name} with {shown}?")
        if decided is not data:  # the person changed the arguments: check theirs as well
            kwargs, problem = self.validate_arguments(decided)
            if problem is not None:
                return self._invalid(problem, call_id)
        # The call is cleared: a confirm_first function inside runs without asking again.
        cleared = call_id or uuid.uuid4().hex
        with approved(cleared), current_tool_call(cleared):
            return await self._run(kwargs, call_id)

    def _invalid(self, problem: str, call_id: str | None) -> ToolResult:
        return ToolResult(
            self.name,
            f"Error: invalid arguments for tool '{self.name}': {problem}",
            ok=False,
            error="invalid_arguments",
            call_id=call_id,
        )

    async def _run(self, kwargs: dict[str, Any], call_id: str | None) -> ToolResult:
        deadline = asyncio.timeout(self.timeout)  # None: no deadline
        try:
            async with deadline:
                value = await self._invoke(kwargs)
        except (
            asyncio.CancelledError,
            KeyboardInterrupt,
            SystemExit,
            ConfirmationRequired,
            ConfirmationRejected,
        ):
            raise
        except Exception as exc:
            if isinstance(exc, TimeoutError) and deadline.expired():
                content = (
                    f"Error: tool '{self.name}' did not finish within {self.timeout:g} seconds"
                )
                kind = "timeout"
            else:  # including a TimeoutError the tool raised itself
                content = f"Error: tool '{self.name}' raised {type(exc).__name__}: {_describe(exc)}"
                kind = "exception"
            return ToolResult(
                self.name, content, ok=False, error=kind, exception=exc, call_id=call_id
            )
        try:
            text = self.render_result(value)
        except Exception as exc:  # bytes that are not UTF-8, a cycle, a __str__ that raises
            content = (
                f"Error: tool '{self.name}' returned a value of type {type(value).__name__} "
                f"that cannot be turned into text ({_describe(exc)})"
            )
            return ToolResult(
                self.name,
                content,
                ok=False,
                error="unserialisable_result",
                exception=exc,
                call_id=call_id,
            )
        if len(text) > self.max_result_chars:
            cut = len(text) - self.max_result_chars
            text = f"{text[: self.max_result_chars]}\n[... {cut} more characters cut]"
        media = self.result_media(value)
        return ToolResult(self.name, text, value=value, call_id=call_id, media=media)

    def validate_arguments(self, data: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """Returns (the keyword arguments to call with, None), or ({}, what is wrong).

        Checked against the function's signature; a tool whose schema comes from
        elsewhere (an MCP server's) overrides this to check against that schema.
        """
        # import time: pydantic loads on first use, not on a plain call
        from pydantic import ValidationError

        try:
            model = self.args_model.model_validate(data)
        except ValidationError as exc:
            return {}, _describe_errors(exc, self.parameters)
        return {name: getattr(model, field) for field, name in self._params.items()}, None

    def render_result(self, value: Any) -> str:
        """Returns a return value as the text the model reads: a string as it is, data as JSON,
        an image, audio or document as its short description (the model is shown the
        item itself, `result_media`).

        A tool whose values carry their own text for the model (an MCP tool's
        result with images) overrides this.
        """
        if isinstance(value, Media):
            return f"[{value.describe()}]"
        return _render(value)

    def result_media(self, value: Any) -> tuple[Any, ...]:
        """Returns the images, audio or documents in a return value, to show the model.

        A `plait.Image` (or `Audio`, `File`) returned by the function is one; a
        tool whose values hold media elsewhere (an MCP tool's result) overrides this.
        """
        return (value,) if isinstance(value, Media) else ()

    async def _invoke(self, kwargs: dict[str, Any]) -> Any:
        if self.in_thread and not self._is_async:
            return await _in_daemon_thread(self.func, kwargs, f"plait-tool-{self.name}")
        value = self.func(**kwargs)
        if inspect.isawaitable(value):
            value = await value
        return value

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


@overload
def tool(func: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    in_thread: bool = True,
    timeout: float | None = DEFAULT_TIMEOUT,
    max_result_chars: int = 8000,
    require_confirmation: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    in_thread: bool = True,
    timeout: float | None = DEFAULT_TIMEOUT,
    max_result_chars: int = 8000,
    require_confirmation: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turns a function into a `Tool`; use bare (``@tool``) or with options.

    Example::

        @tool(name="web_search", description="Searches the web.")
        async def search(query: str, limit: int = 5) -> list[str]: ...

        @tool(require_confirmation=True)      # a person approves each call
        def delete_file(path: str) -> str: ...
    """
    make = functools.partial(
        Tool,
        name=name,
        description=description,
        in_thread=in_thread,
        timeout=timeout,
        max_result_chars=max_result_chars,
        require_confirmation=require_confirmation,
    )
    return make(func) if func is not None else make


# ------------------------------------------------------------------ schema
def _is_async_callable(func: Any) -> bool:
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 — an object with async __call__
    )


def _keyword_parameters(func: Callable[..., Any], name: str) -> dict[str, str]:
    """Returns internal field name → parameter name; refuses what keywords cannot pass."""
    params: dict[str, str] = {}
    for i, param in enumerate(inspect.signature(func).parameters.values()):
        if i == 0 and param.name == "self":
            continue  # a method decorated in its class: bound by __get__, not sent by the model
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(
                f"tool {name!r}: parameter '{param.name}' is *args/**kwargs, which a JSON "
                "schema cannot describe; give the tool named parameters instead"
            )
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(
                f"tool {name!r}: parameter '{param.name}' is positional-only; tools are called "
                "with keyword arguments"
            )
        params[f"p{i}"] = param.name
    return params


def _build_args_model(func: Callable[..., Any], name: str, params: dict[str, str]) -> Any:
    """Returns a pydantic model of the arguments.

    Fields get internal names (``p0``, ``p1`` …) and the parameter name as
    alias: a parameter may be called ``json`` or ``copy``, which would shadow
    BaseModel's attributes.
    """
    # import time: pydantic loads on first use, not on a plain call
    from pydantic import ConfigDict, Field, create_model
    from pydantic.fields import FieldInfo

    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception as exc:
        raise TypeError(
            f"tool {name!r}: cannot resolve the type hints of its parameters ({exc}); "
            "define the types at module level or pass them as real objects"
        ) from exc
    signature = inspect.signature(func)
    fields: dict[str, Any] = {}
    for field, param_name in params.items():
        param = signature.parameters[param_name]
        annotation = hints.get(param_name, Any)
        default: Any = ... if param.default is param.empty else param.default
        if not isinstance(default, FieldInfo):
            default = Field(default)
        fields[field] = (typing.Annotated[annotation, Field(alias=param_name)], default)
    config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    return create_model(f"{name}_arguments", __config__=config, **fields)


def _schema_of(model: Any, arg_docs: Mapping[str, str]) -> dict[str, Any]:
    schema = _drop_titles(model.model_json_schema())
    schema.pop("additionalProperties", None)  # extras are refused when validating anyway
    schema.setdefault("properties", {})
    for arg, text in arg_docs.items():
        prop = schema["properties"].get(arg)
        if prop is not None and "description" not in prop:
            prop["description"] = text
    return schema


_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not")


def _drop_titles(schema: Any) -> Any:
    """Returns the schema without pydantic's generated ``title`` keys (noise in a prompt).

    Only schema keywords are touched: a property that is *named* ``title`` stays.
    """
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k != "title"}
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _drop_titles(sub) for name, sub in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_drop_titles(sub) for sub in out[key]]
    for key in _SUBSCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = _drop_titles(out[key])
    return out


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Returns the summary (text before the first section) and ``Args:`` descriptions.

    Understands Google style: ``name: text`` or ``name (type): text`` lines,
    indented under ``Args:``, with indented continuation lines.
    """
    lines = doc.splitlines()
    summary: list[str] = []
    args: dict[str, str] = {}
    i = 0
    while i < len(lines) and not _SECTION.match(lines[i].strip()):
        summary.append(lines[i])
        i += 1
    while i < len(lines):
        header = lines[i].strip()
        i += 1
        in_args = header.split(":")[0] in ("Args", "Arguments", "Parameters", "Params")
        current: str | None = None
        base_indent: int | None = None
        while i < len(lines) and not _SECTION.match(lines[i].strip()):
            line = lines[i]
            i += 1
            if not in_args or not line.strip():
                continue
            indent = len(line) - len(line.lstrip())
            if base_indent is None:
                base_indent = indent
            match = _ARG_LINE.match(line.strip())
            if indent <= base_indent and match:
                current = match.group(1).lstrip("*")
                args[current] = match.group(2).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(summary).strip(), args


# ---------------------------------------------------------------- calling
async def _in_daemon_thread(func: Callable[..., Any], kwargs: dict[str, Any], name: str) -> Any:
    """Runs ``func(**kwargs)`` in a new daemon thread and awaits its result.

    Not ``asyncio.to_thread``: a timed-out call cannot be stopped, and in the
    loop's default executor it would keep a worker busy (a few hung tools
    starve every later one) and make ``asyncio.run`` wait for it at exit. A
    daemon thread of its own is simply abandoned. The caller's context
    variables are copied in, as ``to_thread`` does.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # the caller stopped waiting (timeout, cancellation)
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def work() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (context.run(func, **kwargs), None)
        except BaseException as exc:
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed while the tool ran
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=work, name=name, daemon=True).start()
    return await future


def _describe(exc: BaseException) -> str:
    """Returns ``str(exc)``, or a stand-in when even that raises (a broken ``__str__``)."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__} whose text cannot be shown>"


def _decode_arguments(arguments: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Returns (arguments as a dict, None), or (None, what is wrong with them)."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}, None
    if isinstance(arguments, Mapping):
        return dict(arguments), None
    if not isinstance(arguments, str | bytes):
        return None, f"expected a JSON object, got {type(arguments).__name__}"

    try:
        data = orjson.loads(arguments)
    except orjson.JSONDecodeError as exc:
        return None, f"the arguments are not valid JSON ({exc}); send one JSON object"
    if not isinstance(data, dict):
        return None, f"expected a JSON object of named arguments, got {type(data).__name__}"
    return data, None


def _describe_errors(exc: Any, schema: Mapping[str, Any]) -> str:
    """Returns one line per validation problem, each naming its argument."""
    problems = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"]) or "(arguments)"
        if err["type"] == "missing":
            problems.append(f"argument '{loc}' is required but missing")
        elif err["type"] == "extra_forbidden":
            known = ", ".join(schema.get("properties", {})) or "none"
            problems.append(f"argument '{loc}' is not a parameter of this tool (known: {known})")
        else:
            problems.append(f"argument '{loc}': {err['msg']} (got {err.get('input')!r})")
    return "; ".join(problems)


def _render(value: Any) -> str:
    """Returns a tool's return value as text for the model (JSON for data)."""
    if isinstance(value, str):
        return value
    return compact_json(value)


def tool_table(tools: Iterable[Tool | Callable[..., Any]]) -> dict[str, Tool]:
    """Returns tools by name, wrapping plain functions in `Tool`; refuses two of one name."""
    if isinstance(tools, Tool) or callable(tools):
        tools = [tools]
    table: dict[str, Tool] = {}
    for item in tools:
        wrapped = item if isinstance(item, Tool) else Tool(item)
        if wrapped.name in table:
            raise ValueError(
                f"got two tools named {wrapped.name!r}; give one another name with "
                "Tool(fn, name=...)"
            )
        table[wrapped.name] = wrapped
    return table


def tool_identity(tool: Tool) -> dict[str, Any]:
    """Returns what identifies a tool to an approval: its name, function and argument schema.

    A pause is sealed with the identities of the pausing module's tools, so
    a module that would run another function (or take other arguments)
    under the same tool name cannot resume it.
    """
    func = tool.func
    named = func if hasattr(func, "__qualname__") else type(func)  # a callable object: its class
    qualified = f"{getattr(named, '__module__', '?')}.{named.__qualname__}"
    return {"name": tool.name, "function": qualified, "schema": tool.parameters}
