"""Human in the loop: stop before a tool with side effects, ask, then resume where it stopped.

A tool made with ``@tool(require_confirmation=True)`` (or a function wrapped
in `confirm_first`) does not run when the model calls it: it raises
`ConfirmationRequired`, carrying the question, the tool, its arguments and an
id. `ReAct` catches it, keeps its trajectory in the exception's ``context``
and lets it reach you::

    resume = None
    while True:
        try:
            result = await agent(question="Delete old logs", resume_state=resume)
            break
        except ConfirmationRequired as pending:
            answer = input(f"{pending.question} [y/n] ")
            resume = ResumeState(pending, "yes" if answer == "y" else "no")

Resuming runs the approved call (``"yes"``; or a dict / JSON text of edited
arguments) or shows the model that the user declined (``"no"``, or any other
text, which is passed on as the reason), and continues without asking the
model again for the steps already taken. Under ``astream`` the same pause
arrives as a `Prediction` with ``is_final == False`` (its
``native_tool_calls`` are the pending calls, ``.confirmation`` the exception).

The pending state is JSON (`ConfirmationRequired.to_json`,
`ResumeState.to_json` and their ``from_json``), so a web server can ask in
one request and resume in another, or in another process. The JSON holds
data only (the conversation, the calls, names of the agent's own tools);
loading it never runs code.
"""

from __future__ import annotations

import contextvars
import functools
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from plait import _context
from plait.errors import ExecutionInterrupt, PlaitError

__all__ = [
    "ConfirmationRejected",
    "ConfirmationRequired",
    "ResumeState",
    "approved",
    "claim_resume",
    "confirm_first",
    "is_approved",
]

_APPROVED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "plait_approved_calls", default=frozenset()
)
"""Ids of the tool calls the user approved, in the context that resumes them."""

_FORMAT = "plait.confirmation/1"


class ConfirmationRequired(ExecutionInterrupt):
    """Execution stopped: a person must confirm a tool call before it runs.

    Attributes:
        question: what to ask the person.
        confirmation_id: the id of this pause (the model's tool-call id when there is one).
        tool_name: the tool waiting for confirmation, if a tool raised it.
        arguments: that call's arguments (a dict when they were valid JSON).
        context: what the module that paused needs to resume (JSON data; ReAct
            keeps its trajectory here).
    """

    def __init__(
        self,
        question: str,
        *,
        confirmation_id: str | None = None,
        tool_name: str | None = None,
        arguments: Any = None,
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(question)
        self.question = question
        self.confirmation_id = confirmation_id or uuid.uuid4().hex
        self.tool_name = tool_name
        self.arguments = arguments
        self.context: dict[str, Any] = dict(context or {})

    @property
    def tool_call(self) -> dict[str, Any] | None:
        """The pending call as ``{"id", "name", "arguments"}`` (seed 003's ``tool_call``)."""
        if self.tool_name is None:
            return None
        return {"id": self.confirmation_id, "name": self.tool_name, "arguments": self.arguments}

    def to_dict(self) -> dict[str, Any]:
        """Returns the pause as JSON-ready data."""
        return {
            "format": _FORMAT,
            "question": self.question,
            "confirmation_id": self.confirmation_id,
            "tool_name": self.tool_name,
            "arguments": self.arguments,
            "context": self.context,
        }

    def to_json(self) -> str:
        """Returns the pause as JSON text (store it; rebuild it with `from_json`)."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: Any) -> ConfirmationRequired:
        """Rebuilds a pause from `to_dict` data.

        Raises:
            ValueError: the data is not a pause written by `to_dict`.
        """
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(
                f"not a plait confirmation (expected an object with format {_FORMAT!r})"
            )
        context = data.get("context") or {}
        question = data.get("question")
        if not isinstance(question, str) or not isinstance(context, dict):
            raise ValueError("a plait confirmation needs a text 'question' and an object 'context'")
        return cls(
            question,
            confirmation_id=str(data.get("confirmation_id") or "") or None,
            tool_name=data.get("tool_name"),
            arguments=data.get("arguments"),
            context=context,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> ConfirmationRequired:
        """Rebuilds a pause from `to_json` text.

        Raises:
            ValueError: the text is not JSON or not a pause.
        """
        return cls.from_dict(json.loads(text))


class ConfirmationRejected(PlaitError):
    """A person declined a step that cannot go on without it (raised by your own code).

    ReAct does not raise it: a declined tool call is shown to the model as the
    tool's result, so the agent can answer otherwise.
    """

    def __init__(
        self, message: str, *, confirmation_id: str | None = None, tool_call: Any = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.confirmation_id = confirmation_id
        self.tool_call = tool_call


@dataclass
class ResumeState:
    """A pause and the person's answer, to pass back as ``resume_state=``.

    ``response`` is ``"yes"`` (run the call as asked), ``"no"`` or any other
    text (do not run it; the text is shown to the model as the reason), or a
    dict (or JSON text of one) of edited arguments to run the call with.
    """

    exception: ConfirmationRequired
    response: Any = "yes"
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else the resuming module may need (kept in the JSON)."""

    @property
    def user_response(self) -> Any:
        """The answer (seed 003's name for ``response``)."""
        return self.response

    @property
    def decision(self) -> tuple[str, Any]:
        """``("approve", None)``, ``("edit", arguments)`` or ``("decline", reason)``."""
        response = self.response
        if isinstance(response, dict):
            return "edit", response
        text = str(response).strip()
        if text.lower() in ("yes", "y", "approve", "approved", "ok", "true"):
            return "approve", None
        if text.startswith("{"):
            try:
                edited = json.loads(text)
            except ValueError:
                edited = None
            if isinstance(edited, dict):
                return "edit", edited
        reason = "" if text.lower() in ("no", "n", "deny", "false") else text
        return "decline", reason

    def to_json(self) -> str:
        """Returns the pause and the answer as JSON text."""
        data = {"pause": self.exception.to_dict(), "response": self.response, "extra": self.extra}
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> ResumeState:
        """Rebuilds a resume state from `to_json` text (data only; nothing is imported).

        Raises:
            ValueError: the text is not a resume state.
        """
        data = json.loads(text)
        if not isinstance(data, dict) or "pause" not in data:
            raise ValueError("not a plait resume state (expected an object with 'pause')")
        return cls(
            ConfirmationRequired.from_dict(data["pause"]),
            data.get("response", "yes"),
            dict(data.get("extra") or {}),
        )


def is_approved(confirmation_id: str | None) -> bool:
    """Whether the call with this id was approved in the current context."""
    return confirmation_id is not None and confirmation_id in _APPROVED.get()


@contextmanager
def approved(*confirmation_ids: str) -> Iterator[None]:
    """Runs the block with these calls approved (a resuming module wraps the approved call)."""
    token = _APPROVED.set(_APPROVED.get() | frozenset(confirmation_ids))
    try:
        yield
    finally:
        _APPROVED.reset(token)


def confirm_first(func: Callable[..., Any] | None = None, *, question: str | None = None) -> Any:
    """Makes ``func`` ask for confirmation before it runs (seed 003's decorator).

    Calling the wrapped function raises `ConfirmationRequired` unless the call
    was approved (a resuming agent approves it). As a tool (``@tool`` on top
    of it, or ``Tool(confirm_first(fn))``) it is a tool with
    ``require_confirmation=True``.

    Args:
        question: the question to ask; default "Run <name>(<arguments>)?".
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            call_id = _CURRENT_CALL.get()
            if not is_approved(call_id):
                shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
                raise ConfirmationRequired(
                    question or f"Run {fn.__name__}({shown})?",
                    confirmation_id=call_id,
                    tool_name=fn.__name__,
                    arguments=dict(kwargs) if not args else {"args": list(args), **kwargs},
                )
            return fn(*args, **kwargs)

        wrapper.plait_requires_confirmation = True  # type: ignore[attr-defined]
        return wrapper

    return decorate if func is None else decorate(func)


_CURRENT_CALL: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "plait_current_tool_call", default=None
)
"""The id of the tool call running now (set by `Tool.call`), for `confirm_first`."""


@contextmanager
def current_tool_call(call_id: str | None) -> Iterator[None]:
    """Marks the block as running the tool call ``call_id`` (for `confirm_first`)."""
    token = _CURRENT_CALL.set(call_id)
    try:
        yield
    finally:
        _CURRENT_CALL.reset(token)


def claim_resume(module_path: str) -> ResumeState | None:
    """Returns the ``resume_state=`` of this call when it paused at ``module_path``; once.

    A module that can pause calls this at the start of its ``forward``: a
    state it gets back is its own (the pause's ``context["module"]`` names
    the module), and no other call of it in the run gets it again. The run
    fails with a clear error when no module claimed the state it was given.
    """
    claim = _context.RESUME.get()
    if claim is None or claim["claimed"]:
        return None
    state: ResumeState = claim["state"]
    if state.exception.context.get("module") != module_path:
        return None
    claim["claimed"] = True
    return state
