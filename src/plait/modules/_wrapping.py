"""Helpers shared by the modules that wrap another module (BestOfN, Refine, repairs).

A wrapper's ``async def forward`` calls its wrapped module many times with
the same inputs. These helpers name those inputs for reward functions and
validators, await a child whichever way it answers, and give each attempt
its own rollout id.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from plait import _context
from plait._jsondata import compact_json
from plait.history import History
from plait.module import Module
from plait.modules.predict import history_messages
from plait.signatures.adapters import format_value
from plait.values import unwrap

__all__ = [
    "AttemptCaller",
    "Retry",
    "bind_signature_inputs",
    "call_child",
    "either",
    "feedback_mode",
    "maybe_await",
    "named_inputs",
    "render_inputs",
    "rollout",
    "to_text",
    "valid_output",
]


def named_inputs(module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Returns the call's inputs by parameter name (``**inputs`` flattened in).

    Reward functions and validators get ``{"question": ...}`` whether the
    wrapped module was called positionally or by keyword.
    """
    try:
        signature = inspect.signature(module.forward)
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return {**{f"arg{i}": value for i, value in enumerate(args)}, **kwargs}
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


async def maybe_await(value: Any) -> Any:
    """Returns ``value``, awaited first if it is awaitable (sync or async callbacks)."""
    if inspect.isawaitable(value):
        return await value
    return value


async def call_child(module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Calls a child module from an ``async def forward`` and returns its output.

    Inside a running program the call goes through the run's resources (a
    coroutine is returned and awaited); a plain-Python child answers at once.
    """
    return await maybe_await(module(*args, **kwargs))


@contextlib.contextmanager
def rollout(name: str) -> Iterator[str]:
    """Sets the rollout id of the LLM calls made inside, nested under any current one.

    Ids are deterministic (``best_of_n:2``, or ``refine:1/best_of_n:2`` when
    nested), so a rerun with the response cache on reuses each attempt's
    replies, while attempts of one run never share them.
    """
    outer = _context.ROLLOUT.get()
    rollout_id = f"{outer}/{name}" if outer else name
    token = _context.ROLLOUT.set(rollout_id)
    try:
        yield rollout_id
    finally:
        _context.ROLLOUT.reset(token)


def to_text(output: Any) -> str:
    """Returns a module output as text for a prompt: JSON for structured data."""
    if isinstance(output, str):
        return output
    to_dict = getattr(output, "to_dict", None)
    if callable(to_dict):
        output = to_dict()
    return compact_json(output)


def valid_output(inputs: dict[str, Any], output: Any) -> float:
    """The reward used when none is given: 1.0 for a usable output, else 0.0.

    An attempt that raised (an invalid reply re-asked once and still
    invalid, a failed call) never gets here; this also refuses an output
    that is None or a `Prediction` / dict with a missing (None) field, or a
    non-final Prediction (one still waiting for tools).
    """
    if output is None or getattr(output, "is_final", True) is False:
        return 0.0
    values = output.values() if isinstance(output, Mapping) else ()
    return 0.0 if any(value is None for value in values) else 1.0


def either(
    owner: str, name: str, value: Any, alias: str, alias_value: Any, default: Any = None
) -> Any:
    """Returns the one of ``name=`` / its alias ``alias=`` that was given, else ``default``.

    Raises:
        TypeError: both were given.
    """
    if value is not None and alias_value is not None:
        raise TypeError(f"{owner}: pass {name}= or {alias}= (the same thing), not both")
    if alias_value is not None:
        return alias_value
    return default if value is None else value


# ------------------------------------------------------------------ feedback
FeedbackMode = Literal["feedback", "history"]


def feedback_mode(module: Module, wrapper: str) -> FeedbackMode:
    """Returns how ``module`` can be told about a previous attempt.

    A ``forward`` with a ``feedback`` parameter gets the text there (a custom
    module decides how to use it); one with ``history`` (Predict,
    ChainOfThought, ReAct) gets the previous attempt as conversation turns.

    Raises:
        TypeError: ``forward`` takes neither.
    """
    params = inspect.signature(module.forward).parameters
    named = {
        name
        for name, param in params.items()
        if param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
    }
    if "feedback" in named:
        return "feedback"
    if "history" in named:
        return "history"
    raise TypeError(
        f"{wrapper} feeds each retry what was wrong with the previous attempt, so the wrapped "
        f"{type(module).__name__}.forward must accept `feedback=` (a text) or `history=` "
        "(as Predict, ChainOfThought and ReAct do); add a `feedback: str | None = None` "
        "parameter to it"
    )


@dataclass(slots=True)
class Retry:
    """What the next attempt is told: the previous output and why it fell short."""

    output: Any
    reasons: str


class AttemptCaller:
    """Calls a wrapped module for attempt after attempt, passing each retry its feedback.

    In ``history`` mode every attempt gets a *copy* of the caller's history
    (so rejected attempts never reach it), extended for a retry with the
    previous inputs, the previous output and the feedback; `commit` then
    appends the chosen attempt's new turns to the caller's history.
    """

    def __init__(
        self, module: Module, mode: FeedbackMode, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.module = module
        self.mode = mode
        self.args = args
        self.kwargs = kwargs
        self.inputs = named_inputs(module, args, kwargs)
        self.inputs.pop("history", None)
        self.inputs.pop("feedback", None)
        self._turns: dict[int, list[Any]] = {}

    async def __call__(self, attempt: int, retry: Retry | None) -> Any:
        kwargs = dict(self.kwargs)
        if self.mode == "feedback":
            if retry is not None:
                kwargs["feedback"] = (
                    f"Your previous output:\n{to_text(retry.output)}\n\n{retry.reasons}"
                )
            return await call_child(self.module, self.args, kwargs)

        history = History(messages=history_messages(self.kwargs.get("history")))
        if retry is not None:
            history.add_user(render_inputs(self.inputs))
            history.add_assistant(to_text(retry.output))
            history.add_user(retry.reasons)
        before = len(history)
        kwargs["history"] = history
        output = await call_child(self.module, self.args, kwargs)
        self._turns[attempt] = list(history.turns[before:])
        return output

    def commit(self, attempt: int) -> None:
        """Appends the turns of ``attempt`` to the caller's History, if one was given."""
        caller = self.kwargs.get("history")
        extend = getattr(caller, "extend", None)
        if self.mode == "history" and hasattr(caller, "messages") and callable(extend):
            extend(self._turns.get(attempt, []))


def render_inputs(inputs: dict[str, Any]) -> str:
    """Returns inputs as ``name: value`` lines (as the JSON adapter writes them)."""
    return "\n".join(f"{name}: {format_value(value)}" for name, value in inputs.items())


def bind_signature_inputs(
    signature: Any, args: tuple[Any, ...], inputs: dict[str, Any], label: str
) -> dict[str, Any]:
    """Returns a signature's input values by name, from keywords (or one positional).

    Raises:
        TypeError: inputs are missing or unknown, or positionals are ambiguous;
            the message names every problem and the expected call.
    """
    expected = list(signature.input_fields)
    call = ", ".join(f"{name}=..." for name in expected) or "no inputs"
    if args:
        if len(args) > 1 or len(expected) != 1 or expected[0] in inputs:
            raise TypeError(f"{label} takes its inputs by keyword: call it with {call}")
        inputs = {expected[0]: args[0]}
    missing = [name for name in expected if name not in inputs]
    unknown = [name for name in inputs if name not in signature.input_fields]
    if missing or unknown:
        problems = [f"missing input(s): {', '.join(missing)}"] if missing else []
        problems += [f"unknown input(s): {', '.join(unknown)}"] if unknown else []
        raise TypeError(f"{label}: {'; '.join(problems)}; call it with {call}")
    return {name: unwrap(inputs[name]) for name in expected}
