"""Human in the loop: stop before a tool with side effects, ask, then resume where it stopped.

A tool made with ``@tool(require_confirmation=True)`` (or a function wrapped
in `confirm_first`) does not run when the model calls it: it raises
`ConfirmationRequired`, carrying the question, the tool, its arguments and an
id. `ReAct` (or `Predict` with tools: the same loop) catches it, keeps its
trajectory in the exception's ``context`` and lets it reach you::

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
model again for the steps already taken. (``ReAct(..., on_decline="raise")``
raises `ConfirmationRejected` for a "no" instead.) Under ``astream`` the same
pause arrives as a `Prediction` with ``is_final == False`` (its
``native_tool_calls`` are the pending calls, ``.confirmation`` the exception).

A module of your own pauses and resumes the same way when its ``async def
forward`` takes ``resume_state=`` (see `plait.resumable`)::

    class Cleanup(Module):
        async def forward(self, *, resume_state=None, **inputs):
            if resume_state:
                return await self.aresume(resume_state.user_response,
                                          resume_state.exception.context)
            try:
                return await self.do_work(**inputs)
            except ConfirmationRequired as e:
                e.context["saved_data"] = self.saved
                raise

A pause that leaves it is sealed for it; the next call's ``resume_state=``
reaches its ``forward`` checked and used up, and while that call runs, the
paused call is the person's to decide: a "yes" runs it (once), edited
arguments run instead, and a "no" makes it raise `ConfirmationRejected`.

A "yes" runs exactly the call that was shown, once. The module that pauses
*seals* the pause (`ConfirmationRequired.seal_for`): an HMAC-SHA256, keyed by
the approval key, over the whole pause (question, pending calls, trajectory,
inputs) and a fingerprint of the agent (its class, signature, tools' names,
schemas and functions). A resume is refused with `ResumeRefusedError`, before
any tool runs, when the pause was changed or forged, sealed with another key,
made by another agent, resumed with other inputs, or already used: each pause
has an ``approval_id`` that the process-wide ledger (`set_approval_ledger`)
lets through once. Only the person's answer may differ from what was paused.

The key is random per process unless one is configured (`set_approval_key`,
or the ``PLAIT_APPROVAL_KEY`` environment variable), so a pause made in one
process resumes in another only when both hold the same key. The pending
state is JSON (`ConfirmationRequired.to_json`, `ResumeState.to_json` and their
``from_json``, which check the seal), so a web server can ask in one request
and resume in another. The JSON holds data only (the conversation, the calls,
names of the agent's own tools); loading it never runs code. To refuse
replays across processes, install a ledger backed by a store they share (see
`ApprovalLedger`).
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import hmac
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from plait import _context
from plait import _jsontext as jsontext
from plait._jsondata import as_json_data
from plait.errors import (
    ConfigError,
    ConfirmationRejected,
    ExecutionInterrupt,
    PlaitError,
    ResumeRefusedError,
)

__all__ = [
    "APPROVAL_KEY_ENV",
    "ApprovalLedger",
    "ConfirmationRejected",
    "ConfirmationRequired",
    "MemoryApprovalLedger",
    "ResumeRefusedError",
    "ResumeState",
    "answering",
    "approval_used",
    "approved",
    "as_json_data",
    "claim_resume",
    "confirm_call",
    "confirm_first",
    "is_approved",
    "offering",
    "rejection",
    "set_approval_key",
    "set_approval_ledger",
]

_APPROVED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "plait_approved_calls", default=frozenset()
)
"""Ids of the tool calls the user approved, in the context that resumes them."""

_FORMAT = "plait.confirmation/1"

APPROVAL_KEY_ENV = "PLAIT_APPROVAL_KEY"
"""The environment variable that holds the approval key shared by the processes that resume."""

MIN_KEY_BYTES = 32
"""Shortest approval key accepted: an HMAC key is only as strong as its randomness."""

MAX_NESTING = 100
"""Deepest nesting of lists and objects a pause may hold; plait's own pauses stay far below."""


class ConfirmationRequired(ExecutionInterrupt):
    """Execution stopped: a person must confirm a tool call before it runs.

    Attributes:
        question: what to ask the person.
        confirmation_id: the id of the paused tool call (the model's tool-call id).
        approval_id: the id of this pause, new for every pause; an approval is
            used once, and this is the id a ledger keeps.
        tool_name: the tool waiting for confirmation, if a tool raised it.
        arguments: that call's arguments (a dict when they were valid JSON).
        context: what the module that paused needs to resume (JSON data; ReAct
            keeps its trajectory here).
        agent_fingerprint: SHA-256 of what identifies the module that paused
            (set by `seal_for`).
        seal: HMAC-SHA256 of the pause under the approval key (set by `seal_for`).
    """

    def __init__(
        self,
        question: str,
        *,
        confirmation_id: str | None = None,
        tool_name: str | None = None,
        arguments: Any = None,
        context: dict[str, Any] | None = None,
        approval_id: str | None = None,
    ) -> None:
        super().__init__(question)
        self.question = question
        self.confirmation_id = confirmation_id or uuid.uuid4().hex
        self.approval_id = approval_id or uuid.uuid4().hex
        self.tool_name = tool_name
        self.arguments = arguments
        self.context: dict[str, Any] = dict(context or {})
        self.agent_fingerprint: str | None = None
        self.seal: str | None = None

    @property
    def tool_call(self) -> dict[str, Any] | None:
        """The pending call as ``{"id", "name", "arguments"}`` (a tool call as sent)."""
        if self.tool_name is None:
            return None
        return {"id": self.confirmation_id, "name": self.tool_name, "arguments": self.arguments}

    def seal_for(self, agent: Any) -> None:
        """Binds the pause to the module that made it and seals it with the approval key.

        The pausing module calls this once its ``context`` is complete, just
        before raising: any later change to the pause (another call, other
        arguments, an edited trajectory) makes the seal fail, and so does
        resuming it in a module whose ``agent`` data differs.

        Args:
            agent: JSON data that identifies the module (for ReAct: its class,
                signature, and its tools' names, schemas and functions).
        """
        self.agent_fingerprint = _fingerprint(agent)
        self.seal = self._expected_seal()

    def check_seal(self) -> None:
        """Raises `ResumeRefusedError` unless the pause is sealed, unchanged, with this key."""
        if self.seal is None:
            raise ResumeRefusedError(
                f"resume state refused: approval {self.approval_id} is not sealed (only a pause "
                "raised by the module that paused can be resumed); ask the person again"
            )
        given = self.seal if isinstance(self.seal, str) and self.seal.isascii() else ""
        if not hmac.compare_digest(self._expected_seal(), given):
            raise ResumeRefusedError(
                f"resume state refused: approval {self.approval_id} was changed after it was "
                "made, or sealed with another key (every process that resumes needs the same "
                f"{APPROVAL_KEY_ENV}); ask the person again"
            )

    def _expected_seal(self) -> str:
        payload = _canonical(self._fields(), "the resume state")
        return hmac.new(_approval_key(), payload, hashlib.sha256).hexdigest()

    def _fields(self) -> dict[str, Any]:
        """Everything the seal covers: the whole pause but the seal itself."""
        return {
            "format": _FORMAT,
            "question": self.question,
            "confirmation_id": self.confirmation_id,
            "approval_id": self.approval_id,
            "tool_name": self.tool_name,
            "arguments": self.arguments,
            "context": self.context,
            "agent_fingerprint": self.agent_fingerprint,
        }

    def to_dict(self) -> dict[str, Any]:
        """Returns the pause as JSON-ready data (values that are not JSON become text)."""
        return as_json_data({**self._fields(), "seal": self.seal})

    def to_json(self) -> str:
        """Returns the pause as JSON text (store it; rebuild it with `from_json`)."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: Any) -> ConfirmationRequired:
        """Rebuilds a pause from `to_dict` data and checks its seal.

        Raises:
            ResumeRefusedError: the data is not a pause written by `to_dict`,
                is nested too deeply, or fails its seal (changed, forged,
                unsealed or sealed with another key).
        """
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ResumeRefusedError(
                f"not a plait confirmation (expected an object with format {_FORMAT!r})"
            )
        _check_nesting(data, "the resume state")
        context = data.get("context") or {}
        question = data.get("question")
        if not isinstance(question, str) or not isinstance(context, dict):
            raise ResumeRefusedError(
                "a plait confirmation needs a text 'question' and an object 'context'"
            )
        pause = cls(
            question,
            confirmation_id=data.get("confirmation_id"),
            tool_name=data.get("tool_name"),
            arguments=data.get("arguments"),
            context=context,
            approval_id=data.get("approval_id"),
        )
        pause.agent_fingerprint = data.get("agent_fingerprint")
        pause.seal = data.get("seal")
        pause.check_seal()
        return pause

    @classmethod
    def from_json(cls, text: str | bytes) -> ConfirmationRequired:
        """Rebuilds a pause from `to_json` text and checks its seal.

        Raises:
            ResumeRefusedError: the text is not JSON or not a pause, or the
                pause is refused (see `from_dict`).
        """
        return cls.from_dict(_load_json(text, "confirmation"))


@dataclass
class ResumeState:
    """A pause and the person's answer, to pass back as ``resume_state=``.

    ``response`` is ``"yes"`` (run the call as asked), ``"no"`` or any other
    text (do not run it; the text is shown to the model as the reason), or a
    dict (or JSON text of one) of edited arguments to run the call with. The
    answer is the person's to choose, so it is not sealed; the pause is.
    """

    exception: ConfirmationRequired
    response: Any = "yes"
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else the resuming module may need (kept in the JSON)."""

    @property
    def user_response(self) -> Any:
        """The answer: `response` under the name ported code reads."""
        return self.response

    @property
    def approval_id(self) -> str:
        """The id of the pause this answers (used once; what a ledger keeps)."""
        return self.exception.approval_id

    @property
    def decision(self) -> tuple[str, Any]:
        """``("approve", None)``, ``("edit", arguments)`` or ``("decline", reason)``.

        Raises:
            ResumeRefusedError: edited arguments nest deeper than `MAX_NESTING`.
        """
        response = self.response
        if isinstance(response, dict):
            _check_nesting(response, "the edited arguments")
            return "edit", response
        text = str(response).strip()
        if text.lower() in ("yes", "y", "approve", "approved", "ok", "true"):
            return "approve", None
        if text.startswith("{"):
            try:
                edited = _parse_json(text, "the edited arguments")
            except json.JSONDecodeError:
                edited = None  # not JSON: the text is the person's reason
            if isinstance(edited, dict):
                return "edit", edited
        reason = "" if text.lower() in ("no", "n", "deny", "false") else text
        return "decline", reason

    def to_json(self) -> str:
        """Returns the pause and the answer as JSON text."""
        data = {"pause": self.exception.to_dict(), "response": self.response, "extra": self.extra}
        return json.dumps(as_json_data(data), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> ResumeState:
        """Rebuilds a resume state from `to_json` text (data only; nothing is imported).

        Raises:
            ResumeRefusedError: the text is not a resume state, or its pause
                is refused (see `ConfirmationRequired.from_dict`).
        """
        data = _load_json(text, "resume state")
        if not isinstance(data, dict) or "pause" not in data:
            raise ResumeRefusedError("not a plait resume state (expected an object with 'pause')")
        extra = data.get("extra") or {}
        if not isinstance(extra, dict):
            raise ResumeRefusedError("a plait resume state's 'extra' must be an object")
        return cls(
            ConfirmationRequired.from_dict(data["pause"]), data.get("response", "yes"), extra
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


class _Answer:
    """The person's answer to a paused call, in force while the module that paused resumes."""

    def __init__(self, state: ResumeState) -> None:
        self.pause = state.exception
        self.decision, self.detail = state.decision
        self._used = False
        self._lock = threading.Lock()  # a sync tool checks from its worker thread

    def take(self, tool_name: str, arguments: Any) -> bool:
        """Whether this is the paused call (same tool, same arguments) and still unanswered."""
        pause = self.pause
        if pause.tool_name != tool_name or _canonical(arguments, "the arguments") != _canonical(
            pause.arguments, "the paused arguments"
        ):
            return False
        with self._lock:
            taken, self._used = not self._used, True
        return taken


_ANSWER: contextvars.ContextVar[_Answer | None] = contextvars.ContextVar(
    "plait_answer", default=None
)


@contextmanager
def answering(state: ResumeState | None) -> Iterator[None]:
    """Runs the block with ``state``'s answer deciding the paused call (once; None: no answer).

    The module that paused wraps its resumed work in it (`plait.resumable`), so
    that making the paused call again does what the person said: see
    `confirm_call`.
    """
    token = _ANSWER.set(None if state is None else _Answer(state))
    try:
        yield
    finally:
        _ANSWER.reset(token)


def confirm_call(call_id: str | None, tool_name: str, arguments: Any, question: str) -> Any:
    """Lets a call that needs a person's approval go on; returns the arguments to run it with.

    The call goes on when it was approved here (`approved`; ReAct wraps the
    call the person approved), or when it is the paused call of a module
    that is resuming (`answering`) and the person said yes (or gave other
    arguments, which are returned instead). An answer covers one call.

    Raises:
        ConfirmationRequired: nobody has approved this call yet (asks ``question``).
        ConfirmationRejected: it is the paused call, and the person declined it.
    """
    if is_approved(call_id):
        return arguments
    answer = _ANSWER.get()
    if answer is None or not answer.take(tool_name, arguments):
        raise ConfirmationRequired(
            question, confirmation_id=call_id, tool_name=tool_name, arguments=arguments
        )
    if answer.decision == "decline":
        raise rejection(answer.pause, answer.detail)
    return answer.detail if answer.decision == "edit" else arguments


def rejection(pause: ConfirmationRequired, reason: str = "") -> ConfirmationRejected:
    """Returns the error for a paused call the person declined (with their reason, if any)."""
    what = "the paused step"
    if pause.tool_name is not None:
        shown = json.dumps(as_json_data(pause.arguments), ensure_ascii=False)
        what = f"{pause.tool_name} with {shown}"
    because = f"; their reason: {reason}" if reason else ""
    return ConfirmationRejected(
        f"the person declined to run {what} (approval {pause.approval_id}){because}",
        confirmation_id=pause.confirmation_id,
        tool_call=pause.tool_call,
    )


def confirm_first(func: Callable[..., Any] | None = None, *, question: str | None = None) -> Any:
    """Makes ``func`` ask for confirmation before it runs.

    Calling the wrapped function raises `ConfirmationRequired` unless the call
    was approved (a resuming agent approves it; see `confirm_call`), and
    `ConfirmationRejected` when it is a call the person declined. As a tool
    (``@tool`` on top of it, or ``Tool(confirm_first(fn))``) it is a tool with
    ``require_confirmation=True``.

    Args:
        question: the question to ask; default "Run <name>(<arguments>)?".
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            arguments = dict(kwargs) if not args else {"args": list(args), **kwargs}
            decided = confirm_call(
                _CURRENT_CALL.get(),
                fn.__name__,
                arguments,
                question or f"Run {fn.__name__}({shown})?",
            )
            if decided is not arguments:  # the person changed them
                decided = dict(decided)
                args, kwargs = tuple(decided.pop("args", ())), decided
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


@contextmanager
def offering(state: Any) -> Iterator[None]:
    """Offers ``state`` (a call's ``resume_state=``) to the module that paused, inside the block.

    That module takes it with `claim_resume`. A block that ends without any
    module having taken it raises, so a resume state never goes unused in silence.

    Raises:
        PlaitError: no module inside the block resumed the state.
    """
    claim = {"state": state, "claimed": False}
    token = _context.RESUME.set(claim)
    try:
        yield
    finally:
        _context.RESUME.reset(token)
    if claim["claimed"]:
        return
    context = getattr(getattr(state, "exception", None), "context", None)
    paused_at = context.get("module") if isinstance(context, dict) else None
    if paused_at is None:
        raise PlaitError(
            "resume_state= was given, but its pause was not made by a module that resumes "
            "(ReAct, Predict with tools, or a module whose async def forward takes "
            "resume_state=), so nothing took it; run without it to start over"
        )
    raise PlaitError(
        f"resume_state= was given, but no module of this program resumed it: it paused at "
        f"module {paused_at!r}. Pass it to the program that paused (with the same "
        "structure), or run without it to start over"
    )


def claim_resume(
    module_path: str, *, agent: Callable[[], Any], inputs: Mapping[str, Any] | None = None
) -> ResumeState | None:
    """Returns the ``resume_state=`` of this call when it paused at ``module_path``; once.

    A module that can pause calls this at the start of its ``forward``: a
    state it gets back is its own (the pause's ``context["module"]`` names
    the module), and no other call of it in the run gets it again. Before it
    is handed over, the state is checked (see `ResumeRefusedError`) and its
    approval is used up in the ledger, so every check comes before any tool
    runs. The run fails with a clear error when no module claimed the state.

    Args:
        module_path: where the calling module sits in the program.
        agent: returns the JSON data the module seals its pauses with (see
            `ConfirmationRequired.seal_for`); called only when a state waits here.
        inputs: the inputs the call was given, when it was given any; they
            must be the paused ones (``context["inputs"]``).

    Raises:
        ResumeRefusedError: the state was changed, forged, sealed with another
            key, made by another agent, given other inputs, or already used.
    """
    claim = _context.RESUME.get()
    if claim is None or claim["claimed"]:
        return None
    state = claim["state"]
    if not isinstance(state, ResumeState) or not isinstance(state.exception, ConfirmationRequired):
        raise ResumeRefusedError(
            f"resume_state= takes a ResumeState(pause, answer), got {type(state).__name__}"
        )
    pause = state.exception
    if pause.context.get("module") != module_path:
        return None
    pause.check_seal()
    if pause.agent_fingerprint != _fingerprint(agent()):
        raise ResumeRefusedError(
            f"resume state refused: approval {pause.approval_id} was made by another agent "
            "(other tools, tool schemas or signature); resume it with the agent that paused, "
            "or ask the person again"
        )
    if inputs is not None:
        _check_same_inputs(pause, inputs)
    _ = state.decision  # unusable edited arguments are refused before the approval is spent
    if not _LEDGER[0].use(pause.approval_id):
        raise ResumeRefusedError(
            f"resume state refused: approval {pause.approval_id} was already used (an approval "
            "runs its call once); run the agent again and ask the person about its new pause"
        )
    claim["claimed"] = True
    return state


def _check_same_inputs(pause: ConfirmationRequired, inputs: Mapping[str, Any]) -> None:
    """Refuses a resume given other inputs than the paused ones, naming the fields that differ."""
    given = as_json_data(dict(inputs))
    paused = pause.context.get("inputs")
    if _canonical(given, "the inputs") == _canonical(paused, "the paused inputs"):
        return
    paused = paused if isinstance(paused, dict) else {}
    differ = sorted(name for name in {*given, *paused} if given.get(name) != paused.get(name))
    raise ResumeRefusedError(
        f"resume state refused: approval {pause.approval_id} paused on other inputs "
        f"({', '.join(differ) or 'their values'} differ); resume with the paused inputs, "
        "or with none to use them"
    )


# ------------------------------------------------------------------ the seal and its key
def _canonical(data: Any, what: str) -> bytes:
    """Returns the one JSON text of ``data`` that a seal covers (sorted keys, no spaces)."""
    _check_nesting(data, what)
    text = json.dumps(as_json_data(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def _fingerprint(agent: Any) -> str:
    """Returns the SHA-256 of the JSON data that identifies a pausing module."""
    return hashlib.sha256(_canonical(agent, "the agent")).hexdigest()


def _load_json(text: str | bytes, kind: str) -> Any:
    """Parses a stored pause or resume state: only JSON text of bounded depth is accepted.

    Raises:
        ResumeRefusedError: not JSON text, or nested too deeply.
    """
    try:
        return _parse_json(text, f"the {kind}")
    except ResumeRefusedError:
        raise
    except (TypeError, ValueError) as exc:
        raise ResumeRefusedError(f"not a plait {kind}: {exc}") from None


def _parse_json(text: str | bytes, what: str) -> Any:
    """Parses JSON that nests at most `MAX_NESTING` levels (other errors pass through)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        return jsontext.loads(text, MAX_NESTING)
    except jsontext.TooDeep:
        raise _too_deep(what) from None


def _check_nesting(data: Any, what: str) -> None:
    """Raises `ResumeRefusedError` when lists and objects nest deeper than `MAX_NESTING`.

    Walked with a stack, not recursion, so any depth gives this error and
    never a RecursionError.
    """
    stack = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > MAX_NESTING:
            raise _too_deep(what)
        stack.extend((child, depth + 1) for child in children)


def _too_deep(what: str) -> ResumeRefusedError:
    return ResumeRefusedError(
        f"resume state refused: {what} is nested more than {MAX_NESTING} levels deep, deeper "
        "than any pause plait makes; ask the person again"
    )


_KEY: list[bytes | None] = [None]
"""The approval key set with `set_approval_key` (None: the environment's, else the process's)."""

_PROCESS_KEY = os.urandom(MIN_KEY_BYTES)
"""This process's own random key: its pauses resume only here unless a key is configured."""


def set_approval_key(key: str | bytes | None) -> None:
    """Sets the key that seals and checks pauses in this process.

    Processes that resume each other's pauses need the same key; keep it
    secret (whoever holds it can forge approvals). Changing it retires every
    pause sealed with the old one.

    Args:
        key: at least 32 bytes (text is UTF-8 encoded), e.g. from
            ``python -c 'import secrets; print(secrets.token_hex(32))'``;
            None goes back to ``PLAIT_APPROVAL_KEY``, or when that is unset
            to this process's random key.

    Raises:
        ConfigError: the key is not text or bytes, or is too short.
    """
    _KEY[0] = None if key is None else _checked_key(key, "set_approval_key(key)")


def _approval_key() -> bytes:
    if _KEY[0] is not None:
        return _KEY[0]
    from_env = os.environ.get(APPROVAL_KEY_ENV)
    if from_env:
        return _checked_key(from_env, f"the environment variable {APPROVAL_KEY_ENV}")
    return _PROCESS_KEY


def _checked_key(key: Any, where: str) -> bytes:
    if not isinstance(key, (str, bytes)):
        raise ConfigError(f"{where} must be text or bytes, got {type(key).__name__}")
    raw = key.encode("utf-8") if isinstance(key, str) else key
    if len(raw) < MIN_KEY_BYTES:
        raise ConfigError(
            f"{where} is {len(raw)} bytes long; an approval key needs at least {MIN_KEY_BYTES} "
            "random bytes: make one with python -c 'import secrets; print(secrets.token_hex(32))'"
        )
    return raw


# ------------------------------------------------------------------ used approvals
class ApprovalLedger(Protocol):
    """Where used approvals are kept, so that each is used once.

    The default, `MemoryApprovalLedger`, refuses replays within one process.
    Pauses resumed by several processes (a configured approval key) need a
    ledger backed by a store they share, kept as long as the key is in use,
    e.g. a table whose primary key is the approval id::

        class SQLiteLedger:
            def __init__(self, path):
                self.db = sqlite3.connect(path, isolation_level=None)
                self.db.execute("CREATE TABLE IF NOT EXISTS used (approval_id TEXT PRIMARY KEY)")

            def use(self, approval_id):
                try:
                    self.db.execute("INSERT INTO used VALUES (?)", (approval_id,))
                except sqlite3.IntegrityError:
                    return False
                return True

        set_approval_ledger(SQLiteLedger("approvals.sqlite"))

    A ledger may also answer ``is_used(approval_id) -> bool`` (`approval_used` asks it): a
    server whose resume failed before its approval was used then lets the run wait again.
    """

    def use(self, approval_id: str) -> bool:
        """Records the approval as used; returns False when it had been used already.

        Must be atomic: of two uses of one id, however close, one gets False.
        Only ids of pauses whose seal was checked reach it.
        """
        ...


class MemoryApprovalLedger:
    """The default ledger: the approvals used in this process, in memory (thread-safe)."""

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._lock = threading.Lock()

    def use(self, approval_id: str) -> bool:
        with self._lock:
            if approval_id in self._used:
                return False
            self._used.add(approval_id)
            return True

    def is_used(self, approval_id: str) -> bool:
        """Whether the approval was used in this process."""
        with self._lock:
            return approval_id in self._used


_DEFAULT_LEDGER = MemoryApprovalLedger()
_LEDGER: list[ApprovalLedger] = [_DEFAULT_LEDGER]
"""The ledger every resume of this process goes through."""


def approval_used(approval_id: str) -> bool | None:
    """Whether this process's ledger holds the approval as used; None when the ledger cannot
    tell (it has no ``is_used``). A resume that failed with its approval unused ran no call
    of it, so its pause may wait again."""
    is_used = getattr(_LEDGER[0], "is_used", None)
    return None if is_used is None else bool(is_used(approval_id))


def set_approval_ledger(ledger: ApprovalLedger | None) -> None:
    """Sets where this process records used approvals (None: back to the in-memory default).

    Raises:
        ConfigError: ``ledger`` has no ``use(approval_id)`` method.
    """
    if ledger is not None and not callable(getattr(ledger, "use", None)):
        raise ConfigError(
            "set_approval_ledger needs an object with a use(approval_id) -> bool method, "
            f"got {type(ledger).__name__}"
        )
    _LEDGER[0] = _DEFAULT_LEDGER if ledger is None else ledger
