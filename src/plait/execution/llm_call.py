"""One LLMInference call: build the neutral request, call the resources, read the reply.

This is where a module's settings (system prompt, temperature, response
format) meet the resource layer. Structured replies are validated with
pydantic through `ask_structured`: an invalid (or truncated) reply is
re-asked once with the validation error shown to the model, then the call
fails with a `StructuredOutputError` naming the alias and the expected type;
a refused reply is never stored in the response cache.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from plait import _context
from plait.backends.types import (
    Message,
    Request,
    Response,
    SamplingOptions,
    Usage,
    as_message,
)
from plait.errors import PlaitError
from plait.media import Media
from plait.module import LLMInference
from plait.values import Value, ValueKind

__all__ = ["USE_CACHE", "build_request", "call_llm", "generate"]

logger = logging.getLogger("plait.execution")

USE_CACHE: contextvars.ContextVar[bool] = contextvars.ContextVar("plait_use_cache", default=True)
"""Whether LLM calls may use the endpoints' response caches (the execution option ``cache``).

A call (`plait.execution.run`) or a batch (`plait.execution.batch`) sets it while it
runs; the scheduler's tasks and ``async def forward`` leaves inherit it.
"""


def _messages_of(prompt: Any, system: str | None) -> tuple[Message, ...]:
    """Returns the conversation for a prompt.

    A prompt is text (one user turn), a `Message`, a conversation (a list of
    Messages or ``{"role", "content"}`` dicts), or an object with ``.messages``
    such as `plait.History`. An `Image`, `Audio` or `File`, or a list of text
    and such media, is one user turn showing them in that order. The module's
    system prompt goes first, unless the conversation starts with its own
    system turn.
    """
    head = (_system_turn(system),) if system else ()
    if isinstance(prompt, str):
        return (*head, Message("user", prompt))
    if isinstance(prompt, Message):
        return (*head, prompt)
    if isinstance(prompt, Media):
        return (*head, Message("user", parts=(prompt,)))
    turns_of = getattr(prompt, "messages", None)
    if turns_of is not None and not isinstance(prompt, Mapping):
        prompt = turns_of
    if isinstance(prompt, Sequence) and not isinstance(prompt, bytes):
        if any(isinstance(item, Media) for item in prompt):
            return (*head, Message("user", parts=tuple(prompt)))
        turns = [as_message(turn, f"prompt item {i}") for i, turn in enumerate(prompt)]
        if head and turns and turns[0].role == "system":
            head = ()  # an explicit system turn wins over the module's
        return (*head, *turns)
    return (*head, Message("user", str(prompt)))


@functools.lru_cache(maxsize=256)
def _system_turn(text: str) -> Message:
    """Returns the system turn of a prompt text (messages are immutable, so one per text)."""
    return Message("system", text)


@functools.lru_cache(maxsize=256)
def _sampling(temperature: float | None, max_tokens: int | None) -> SamplingOptions:
    """Returns a module's sampling options (immutable, so one object per setting)."""
    return SamplingOptions(temperature=temperature, max_tokens=max_tokens)


def build_request(module: LLMInference, prompt: Any, timeout: float | None = None) -> Request:
    """Returns the provider-neutral request for calling ``module`` on ``prompt``."""
    system = module.system_prompt.value if module.system_prompt is not None else None
    fmt = module.response_format
    return Request(
        messages=_messages_of(prompt, str(system) if system else None),
        options=_sampling(module.temperature, module.max_tokens),
        response_schema=_output_type(fmt).schema if fmt is not None else None,
        timeout=timeout,
        rollout_id=_context.ROLLOUT.get(),
    )


def _output_type(fmt: Any) -> Any:
    """Returns the reader of response format ``fmt`` (`structured.output_type_for`).

    `plait.execution.structured` (and pydantic behind it) loads with the first
    call that has a response format: a program of text calls never needs it.
    """
    # import time: only a typed output (structured loads pydantic)
    from plait.execution.structured import output_type_for

    return output_type_for(fmt)


def _field_streamer(module: LLMInference, fmt: Any, path: str) -> Any:
    """Returns the sink that streams a reply's text to the run's consumer, as fields."""
    # import time: only a streamed run
    from plait.streaming import FieldStreamer, json_fields, whole_text

    return FieldStreamer(module, whole_text("text") if fmt is None else json_fields, path=path)


async def call_llm(
    module: LLMInference,
    prompt: Any,
    resources: Any,
    timeout: float | None = None,
    path: str = "",
) -> Value:
    """Calls ``module`` on ``prompt`` through ``resources`` (a ResourceManager).

    When a consumer streams the run (``astream``), the reply is streamed
    from the provider and its text reaches the consumer as it arrives, as
    chunks of the field ``text`` (or of the response format's fields), named
    by ``path``; the request, cache, retries and result are the same.

    Returns:
        ``Value(RESPONSE)`` with the reply text, or ``Value(STRUCTURED)`` with
        the typed object; ``meta`` holds alias, model, usage, latency and
        ``finish_reason`` (``"length"`` when the token limit cut the text off).

    Raises:
        StructuredOutputError: the reply did not parse even after one re-ask.
        BackendError: the call failed after the resource layer's retries.
    """
    request = build_request(module, prompt, timeout)
    use_cache = USE_CACHE.get()
    fmt = module.response_format
    sink = _field_streamer(module, fmt, path) if _context.STREAM.get() is not None else None
    if fmt is None:
        response = await resources.complete(module.alias, request, cache=use_cache, on_text=sink)
        if sink is not None:
            await sink.finish()
        _warn_if_incomplete(module, response)
        return _value_of(ValueKind.RESPONSE, response.text, response, response.usage)
    # import time: only a typed output (structured loads pydantic)
    from plait.execution.structured import ask_structured

    output = _output_type(fmt)

    async def complete(request: Request, accept: Callable[[Response], bool]) -> Response:
        if sink is not None and sink.started:
            await sink.restart("the reply was invalid; asked again")
        return await resources.complete(
            module.alias, request, cache=use_cache, accept=accept, on_text=sink
        )

    reply = await ask_structured(
        complete,
        request,
        output.read,
        expected=output.expected,
        label=f"alias {module.alias!r}",
        target=output.name,
    )
    if sink is not None:
        await sink.finish()
    value = _value_of(ValueKind.STRUCTURED, reply.value, reply.response, reply.usage)
    if reply.attempts > 1:
        value.meta["reasked"] = True
    return value


_WARNED: weakref.WeakSet[LLMInference] = weakref.WeakSet()
"""Modules already warned about an incomplete reply (once each, not once per batch item)."""


def _warn_if_incomplete(module: LLMInference, response: Response) -> None:
    """Logs a warning, once per module, for a text reply that was cut off or is empty.

    The caller of an eval-mode program gets plain text, so a truncated answer
    would otherwise pass for a whole one; every call's reason is also in the
    output Value's ``meta["finish_reason"]`` and in profiler records.
    """
    incomplete = response.finish_reason == "length" or not (response.text or response.tool_calls)
    if not incomplete or module in _WARNED:
        return
    _WARNED.add(module)
    if response.finish_reason == "length":
        logger.warning(
            "alias %r (%s): the reply was cut off by the token limit (max_tokens=%s, "
            "finish_reason 'length'); raise max_tokens for whole answers",
            module.alias,
            module._name or "LLMInference",
            module.max_tokens,
        )
    else:
        logger.warning(
            "alias %r (%s): the model sent an empty reply (finish_reason %r)",
            module.alias,
            module._name or "LLMInference",
            response.finish_reason,
        )


def _value_of(kind: ValueKind, payload: Any, response: Response, usage: Usage) -> Value:
    meta = dict(response.meta)
    meta["usage"] = usage
    meta["input_tokens"] = usage.input_tokens
    meta["output_tokens"] = usage.output_tokens
    meta["cost"] = usage.cost
    meta["model"] = response.model
    meta["finish_reason"] = response.finish_reason
    if response.tool_calls:
        meta["tool_calls"] = response.tool_calls
    return Value(kind, payload, meta=meta)


async def generate(
    alias: str,
    request: Request,
    *,
    accept: Callable[[Response], bool] | None = None,
    on_text: Any = None,
) -> Response:
    """Makes one LLM call from inside a running program, through that program's resources.

    For ``async def forward`` leaves that build their own requests (signature
    adapters, tool loops): the call counts against the run's global limit and
    the endpoint's limits, is retried and cached like any other, and carries
    the context's rollout id. ``accept`` decides whether the reply may be
    cached, and ``on_text`` receives the reply's text as it streams (see
    `ResourceManager.complete`); structured callers pass their validation
    through `ask_structured`.

    Raises:
        PlaitError: no program is running in this context.
    """
    executor = _context.current_run()
    if executor is None:
        raise PlaitError(
            f"generate({alias!r}, ...) needs a running program: call it inside an "
            "`async def forward` of a module executed with resources (bound, "
            "ExecutionSettings, or plait.run)"
        )
    return await executor.complete(alias, request, accept=accept, on_text=on_text)
