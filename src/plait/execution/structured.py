"""Structured outputs: from a Python type to a JSON schema, and asking until a reply parses.

Providers want an *object* at the root of a response schema (OpenAI's strict
mode requires it, and llama.cpp grammars are most reliable with it), so a
type that is not an object — ``list[str]``, ``Literal["a", "b"]``, ``int`` —
is wrapped as ``{"value": <type>}`` on the wire and unwrapped after parsing.

`ask_structured` is the one path by which plait asks a model for a typed
reply: it validates, re-asks once with one wording, never lets a refused
reply into the response cache, and treats a reply cut off by the token limit
as invalid (when the last attempt was cut off, the error is a `ReplyCutOffError`
naming the field and the limit).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from plait._jsontext import loads
from plait.backends.types import Message, Request, Response, ResponseSchema, Usage
from plait.errors import ReplyCutOffError, StructuredOutputError
from plait.execution.cut_off import cut_off_error

__all__ = [
    "REASK",
    "Attempt",
    "OutputType",
    "StructuredReply",
    "ask_structured",
    "output_type_for",
    "type_adapter",
]

_WRAP_KEY = "value"


@dataclass(frozen=True)
class OutputType:
    """How to ask for and read one response type."""

    target: Any
    schema: ResponseSchema
    wrapped: bool
    """Whether the type sits under ``{"value": ...}`` on the wire."""

    @property
    def name(self) -> str:
        return _type_name(self.target)

    @property
    def expected(self) -> str:
        """What a good reply is, in the words of a re-ask."""
        return f"only a JSON object that follows the schema of {self.name}"

    def read(self, response: Response) -> Any:
        """Returns the typed object in a reply's text (see `parse`)."""
        return self.parse(response.text)

    def parse(self, text: str) -> Any:
        """Returns the typed object in ``text``; raises StructuredOutputError saying why not."""
        # import time: pydantic loads on first use, not on a plain call
        from pydantic import ValidationError

        try:
            data = loads(_strip_fences(text))
        except ValueError as exc:
            raise StructuredOutputError(
                f"reply is not valid JSON for {self.name}: {exc}", raw=text, target=self.name
            ) from None
        if self.wrapped and (not isinstance(data, dict) or _WRAP_KEY not in data):
            # Lenient: a model may answer the bare value instead of the wrapper.
            data = {_WRAP_KEY: data}
        try:
            parsed = type_adapter(self._validated_type()).validate_python(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise StructuredOutputError(
                f"reply does not match {self.name}: {problems}", raw=text, target=self.name
            ) from None
        return getattr(parsed, _WRAP_KEY) if self.wrapped else parsed

    def _validated_type(self) -> Any:
        return _wrapper(self.target) if self.wrapped else self.target


def _strip_fences(text: str) -> str:
    match = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    return match.group(1) if match else text.strip()


def _type_name(target: Any) -> str:
    return getattr(target, "__name__", None) or repr(target)


@functools.cache
def type_adapter(target: Any) -> Any:
    """Returns pydantic's `TypeAdapter` for ``target`` (one per type, cached)."""
    # import time: pydantic loads on first use, not on a plain call
    from pydantic import TypeAdapter

    return TypeAdapter(target)


@functools.cache
def _wrapper(target: Any) -> Any:
    # import time: pydantic loads on first use, not on a plain call
    from pydantic import create_model

    fields: dict[str, Any] = {_WRAP_KEY: (target, ...)}
    return create_model("Wrapped", **fields)


@functools.cache
def output_type_for(target: Any) -> OutputType:
    """Returns the schema and parser for ``target`` (cached per type).

    Raises:
        TypeError: ``target`` is not something pydantic can describe as JSON.
    """
    try:
        schema = type_adapter(target).json_schema()
    except Exception as exc:
        raise TypeError(
            f"response_format {_type_name(target)} cannot be described as a JSON schema: {exc}"
        ) from None
    wrapped = schema.get("type") != "object"
    if wrapped:
        schema = type_adapter(_wrapper(target)).json_schema()
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", _type_name(target))[:64] or "response"
    return OutputType(target, ResponseSchema(name=name, schema=schema), wrapped)


# ------------------------------------------------------------- asking for it
REASK = "Your previous reply could not be used: {error}\nReply again with {expected}."
"""The one re-ask text: what was wrong, then what to send instead."""

_CUT_OFF = "it was cut off at the token limit before it was complete; keep it shorter"
"""What a re-ask tells the model of a cut-off reply (its error speaks to the program's author)."""

Complete = Callable[[Request, Callable[[Response], bool]], Awaitable[Response]]
"""Sends a request with an ``accept`` hook (see `ResourceManager.complete`); returns the reply."""


@dataclass(slots=True)
class Attempt:
    """One request of a structured call and what came of it (for traces)."""

    request: Request
    started: float
    """``time.perf_counter()`` when the request was sent."""
    response: Response | None = None
    """The reply; None when the call itself failed."""
    value: Any = None
    """What the reply parsed to (when ``error`` is None)."""
    error: Exception | None = None
    """Why the reply was refused, or why the call failed."""


@dataclass(slots=True)
class StructuredReply:
    """A structured call's accepted answer."""

    value: Any
    """The parsed (and checked) value."""
    response: Response
    """The accepted reply."""
    request: Request
    """The request that got it: the original one, or the last re-ask."""
    usage: Usage
    """Tokens and cost of every attempt together."""
    attempts: int
    """Requests made: 1, or more after re-asks."""


async def ask_structured(
    complete: Complete,
    request: Request,
    parse: Callable[[Response], Any],
    *,
    expected: str,
    label: str,
    target: str = "",
    reasks: int = 1,
    fields: tuple[str, ...] = (),
    on_attempt: Callable[[Attempt], None] | None = None,
) -> StructuredReply:
    """Asks until a reply parses, re-asking with the error shown; the one path for typed replies.

    Every structured call in plait goes through here (LLMInference with a
    response format, Predict and its adapters, LLM losses, optimizers), so
    they share one behaviour:

    * a reply cut off by the token limit is invalid whatever it holds, and
      when the last attempt was cut off the error is a `ReplyCutOffError`
      naming the field being written, the limit and the fix;
    * ``parse(response)`` decides the rest by raising `StructuredOutputError`
      (it may check meaning as well as shape);
    * the decision is made inside ``complete``'s ``accept`` hook, so the
      response cache stores only accepted replies and never replays one that
      was refused;
    * a refused reply is re-asked (up to ``reasks`` times) in one wording
      (`REASK`): the conversation so far, the reply, what was wrong with it.

    Args:
        complete: sends one request with an accept hook (the manager's
            ``complete`` or the running program's ``generate``, bound to an alias).
        request: the first request.
        parse: returns the value in a reply, or raises `StructuredOutputError`.
        expected: what a good reply is, for the re-ask ("only a JSON object
            that follows the schema").
        label: names the caller in the final error ("alias 'llm'").
        target: names the expected type in the final error ("Verdict").
        reasks: re-asks after the first refused reply.
        fields: the output field names, which a cut-off error may name (those
            of the request's schema and tools it knows already).
        on_attempt: called after every request with what came of it.

    Raises:
        ReplyCutOffError: the last reply was cut off at its token limit.
        StructuredOutputError: no reply was accepted; names ``label`` and each
            attempt's problem, with the last reply in ``raw``.
        BackendError: a call failed after the resource layer's retries.
    """
    usage = Usage()
    problems: list[StructuredOutputError] = []
    for attempt_number in range(1, reasks + 2):
        attempt = Attempt(request, time.perf_counter())

        def accept(response: Response, attempt: Attempt = attempt) -> bool:
            try:
                if response.finish_reason == "length":
                    raise cut_off_error(label, attempt.request, response, fields)
                attempt.value, attempt.error = parse(response), None
            except StructuredOutputError as exc:
                attempt.value, attempt.error = None, exc
            return attempt.error is None

        try:
            response = await complete(request, accept)
        except Exception as exc:
            attempt.error = exc
            if on_attempt is not None:
                on_attempt(attempt)
            raise
        attempt.response = response
        usage += response.usage
        if on_attempt is not None:
            on_attempt(attempt)
        if attempt.error is None:
            return StructuredReply(attempt.value, response, request, usage, attempt_number)
        problem = attempt.error
        assert isinstance(problem, StructuredOutputError)
        problems.append(problem)
        told = _CUT_OFF if isinstance(problem, ReplyCutOffError) else problem
        request = request.with_messages(
            (
                *request.messages,
                Message("assistant", response.text),
                Message("user", REASK.format(error=told, expected=expected)),
            )
        )
    error = _final_error(label, target, problems)
    error.usage = usage
    raise error


def _final_error(
    label: str, target: str, problems: list[StructuredOutputError]
) -> StructuredOutputError:
    last = problems[-1]
    if isinstance(last, ReplyCutOffError):  # the step fails for the cut, named as it is
        last.target = last.target or target
        if len(problems) > 1:
            last.__cause__ = problems[0]
        return last
    if len(problems) == 1:
        detail = str(last)
    else:
        detail = "; ".join(f"attempt {i}: {p}" for i, p in enumerate(problems, 1))
    reasks = len(problems) - 1
    after = {0: "with no re-ask", 1: "after one re-ask"}.get(reasks, f"after {reasks} re-asks")
    what = f"not a valid {target}" if target else "invalid"
    error = StructuredOutputError(
        f"{label}: the reply is still {what} {after}: {detail}",
        raw=last.raw,
        target=target or last.target,
    )
    error.__cause__ = problems[0]
    return error
