"""The exception tree of plait.

Every error plait raises on purpose derives from `PlaitError`, so callers can
catch the whole family with one clause and still tell the cases apart::

    PlaitError
    ├── TracingError          a forward() did something a trace cannot record
    ├── ConfigError           a ResourceConfig (or its file) is malformed
    ├── UnknownAliasError     a call names an alias that no endpoint serves (also KeyError)
    ├── BackendError          a provider call failed; carries status, alias, attempts
    │   ├── BackendTimeout        no answer within the timeout
    │   ├── BackendConnectionError  the connection dropped or was refused
    │   ├── RateLimitError        429; carries retry_after when the provider sent one
    │   ├── BudgetExceededError   the run's cost budget is spent
    │   └── CircuitOpenError      every endpoint of a fallback chain is skipped for a
    │                             cool-down after failing again and again
    ├── StructuredOutputError a reply could not be parsed into the requested type
    │   └── ReplyCutOffError      the reply was cut off at its ``max_tokens`` limit; names
    │                             the field (or the tool argument), the limit and the fix
    ├── ExecutionError        a run failed as a whole, not in one node
    │   └── DeadlineExceededError  a call or batch ran past its ``deadline``
    ├── ExecutionInterrupt    not a failure: the program stopped on purpose and can resume
    │   └── ConfirmationRequired   a person must confirm a tool call; plait.confirmation
    ├── MediaError            an Image, Audio or File input cannot be used: unreadable,
    │                         over its size cap, of the wrong format, or not sendable to the
    │                         provider (also ValueError)
    ├── FileError             a file plait writes (or reads back) is a symbolic link, not a
    │                         regular file, or unusable; names the path (also OSError)
    ├── ResumeRefusedError    a resume state was changed, forged, replayed, made by another
    │                         agent or given other inputs (also ValueError); never wrapped
    ├── ConfirmationRejected  a person declined a call that cannot go on without it; never
    │                         wrapped
    ├── MCPError              an MCP server did not start, crashed, timed out or answered
    │                         something that is not MCP; names the server and the tool
    │
    │   defined where they are raised:
    ├── SignatureSyntaxError      a string signature does not parse (also ValueError);
    │                             plait.signatures.parser
    ├── CheckpointError           a checkpoint directory or file cannot be used;
    │   │                         plait.execution.checkpoint
    │   └── CheckpointMismatchError  it was written by another program or for other inputs
    ├── AllAttemptsFailedError    every attempt of BestOfN / Refine failed;
    │                             plait.modules.best_of_n
    ├── RequirementsNotMetError   outputs still break requirements after repair;
    │                             plait.modules.requirements
    ├── DatasetError              a data file of the ``plait`` command cannot be read or
    │                             written; names file, line and column; plait.cli.datasets
    ├── ProgramError              the program, metric or columns named on the ``plait``
    │                             command line cannot be used; plait.cli.programs
    └── RunReportError            a run.json cannot be read as a report (also ValueError);
                                  names the file and the line or field; plait.report

Foreign exceptions are wrapped at one boundary (the backend adapters) and
chained with ``raise ... from exc``, so the original traceback is never lost.

A run's errors keep their type: a node that fails raises what it raised (a
`BudgetExceededError`, a `MediaError`, a provider's `RateLimitError`, your own
code's `ValueError` ...), so ``except`` clauses catch what the docs name, at every
entry point. `locate` notes where in the program it happened: the attributes
``node_id``, ``module_path`` and ``input_index`` (declared on `PlaitError`, set on
any exception) and one note (PEP 678) that tracebacks print under the message;
`described` is the one-line text of both.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = [
    "BackendConnectionError",
    "BackendError",
    "BackendTimeout",
    "BudgetExceededError",
    "CircuitOpenError",
    "ConfigError",
    "ConfirmationRejected",
    "DeadlineExceededError",
    "ExecutionError",
    "ExecutionInterrupt",
    "FileError",
    "MCPError",
    "MediaError",
    "PlaitError",
    "RateLimitError",
    "ReplyCutOffError",
    "ResumeRefusedError",
    "StructuredOutputError",
    "TracingError",
    "UnknownAliasError",
    "described",
    "locate",
]


class PlaitError(Exception):
    """Base class of every error plait raises on purpose.

    Attributes:
        node_id: id of the graph node where a run failed with it (set by `locate`).
        module_path: dotted path of that node's module (``stage3.synthesizer``).
        input_index: index of the batch item it failed, or None for a single call.
    """

    node_id: str | None = None
    module_path: str | None = None
    input_index: int | None = None


def locate(
    exc: BaseException,
    where: str,
    *,
    node_id: str | None = None,
    module_path: str | None = None,
    input_index: int | None = None,
) -> BaseException:
    """Notes on ``exc`` where in a program it happened, and returns it.

    The innermost place wins: a failure inside an ``async def forward`` leaf is located
    at the child node that raised it, and the leaf's own node adds nothing, except the
    batch index when the child did not know it. ``where`` (say ``"stage2.business
    failed on input 2"``) becomes the exception's note. An exception that refuses new
    attributes keeps only the note.
    """
    if getattr(exc, "_plait_where", None) is not None:
        if input_index is not None and getattr(exc, "input_index", None) is None:
            _set(exc, "input_index", input_index)
        return exc
    for name, value in (
        ("node_id", node_id),
        ("module_path", module_path),
        ("input_index", input_index),
        ("_plait_where", where),
    ):
        _set(exc, name, value)
    exc.add_note(where)
    return exc


def _set(exc: BaseException, name: str, value: Any) -> None:
    with contextlib.suppress(AttributeError, TypeError):  # slots, or a read-only property
        setattr(exc, name, value)


def described(exc: BaseException, *, index: bool = True) -> str:
    """Returns ``exc`` on one line: its type, its message (lines joined with ``;``) and,
    when a run failed with it, where (``BudgetExceededError: the budget ... (summarizer
    failed on input 1)``); the one text the CLI, ``plait mcp`` and evaluation rows give.

    Args:
        index: name the batch index too; the CLI, which numbers rows its own way, says
            only the module (``(in summarizer)``).
    """
    message = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    where = getattr(exc, "_plait_where", None)
    if where is not None and not index:
        path = getattr(exc, "module_path", None)
        where = f"in {path}" if path else None
    return f"{type(exc).__name__}: {message}" + (f" ({where})" if where else "")


class TracingError(PlaitError):
    """A forward() used a traced value in a way that cannot be recorded.

    The message names the module path and the line of ``forward`` and says
    what to write instead.
    """


class ConfigError(PlaitError, ValueError):
    """A resource configuration is malformed; the message names alias and key."""


class UnknownAliasError(PlaitError, KeyError):
    """A call used an alias that no endpoint of the configuration serves."""

    def __init__(self, alias: str, known: list[str]) -> None:
        self.alias = alias
        self.known = sorted(known)
        known_text = ", ".join(repr(k) for k in self.known) or "none"
        super().__init__(f"unknown alias {alias!r} in ResourceConfig; known: {known_text}")

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0])


class BackendError(PlaitError):
    """A provider call failed.

    Attributes:
        status: HTTP status (or None when no response arrived).
        alias: the resource alias the call was made for, when known.
        attempts: how many attempts were made before giving up.
        retryable: whether the resource layer may retry this failure.
        retry_after: seconds the provider asked us to wait, if it said.
        body: the provider's error body, decoded when possible.
        detail: the provider's own text that the message quotes (an error
            body's message, the start of a malformed reply). It may echo the
            prompt, so telemetry leaves it out unless content capture is on.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        alias: str | None = None,
        attempts: int = 1,
        retryable: bool = False,
        retry_after: float | None = None,
        body: Any = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.alias = alias
        self.attempts = attempts
        self.retryable = retryable
        self.retry_after = retry_after
        self.body = body
        self.detail = detail


class BackendTimeout(BackendError):
    """The provider did not answer within the call's timeout."""

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("retryable", True)
        super().__init__(message, **kwargs)


class BackendConnectionError(BackendError):
    """The connection was refused, reset or closed before a full answer.

    Attributes:
        unsent: True when nothing of the request left (the connection was refused): the
            provider never saw it, so a run's budget does not count it as a call.
    """

    def __init__(self, message: str, *, unsent: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("retryable", True)
        super().__init__(message, **kwargs)
        self.unsent = unsent


class RateLimitError(BackendError):
    """The provider answered 429 Too Many Requests."""

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("retryable", True)
        kwargs.setdefault("status", 429)
        super().__init__(message, **kwargs)


class BudgetExceededError(BackendError):
    """The configured cost budget of a run has been spent; no further calls are made."""


class CircuitOpenError(BackendError):
    """No endpoint of a fallback chain was tried: each one's circuit is open.

    An endpoint that failed ``circuit_failures`` calls in a row is skipped for
    ``circuit_cooldown`` seconds; the message names each one and when it will be
    probed again. Nothing was sent.
    """


class StructuredOutputError(PlaitError, ValueError):
    """A model reply could not be parsed into the requested type, even after a re-ask.

    Attributes:
        raw: the last reply text.
        target: a readable name of the requested type.
        usage: tokens and cost of every attempt (set when the re-asks ran out).
    """

    def __init__(self, message: str, *, raw: str = "", target: str = "") -> None:
        super().__init__(message)
        self.raw = raw
        self.target = target
        self.usage: Any = None


class ReplyCutOffError(StructuredOutputError):
    """A typed reply or a tool call was cut off at its token limit (``finish_reason`` "length").

    What was cut cannot be used, so the step where it happened fails with this error,
    rather than passing the remains on (an agent would otherwise fail a step later, for a
    reason nobody can see). The message is plait's own text, with nothing the model wrote:
    the step, the field (or tool argument) being written when the limit struck, the limit,
    and the fix (a larger ``max_tokens``, or a length limit on that field).

    Attributes:
        field: the output field or tool argument being written ("" when unknown).
        tool: the tool whose call was cut ("" for a typed reply).
        limit: the request's ``max_tokens`` (None: the provider's default limit).
        reason: the message without the step's label: one line a server may show its
            clients (it quotes nothing the model or the provider wrote).
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        raw: str = "",
        field: str = "",
        tool: str = "",
        limit: int | None = None,
    ) -> None:
        super().__init__(message, raw=raw)
        self.reason = reason
        self.field = field
        self.tool = tool
        self.limit = limit


class FileError(PlaitError, OSError):
    """A file plait would write, or read back from its own state, cannot be used safely.

    Raised for a path that is a symbolic link (plait never writes through one or replaces
    one), that is not a regular file (a directory, FIFO or device), that cannot be opened or
    written, or whose contents are not what plait wrote there (too large, not JSON, nested
    too deeply). The message names the path and what to do. It is also an `OSError`, as the
    failed ``open`` it replaces was.
    """


class MediaError(PlaitError, ValueError):
    """An `Image`, `Audio` or `File` input cannot be used.

    Raised when one is built (the path cannot be read, the item is over its
    size cap, the bytes are not of the kind's formats) and when a call cannot
    carry it (a provider or model that takes no such input, a URL where the
    provider needs the bytes). The message names the input and what to do.
    """


class ExecutionError(PlaitError):
    """A run failed as a whole rather than in one node (`DeadlineExceededError`).

    A node that fails does not raise this: its own error reaches the caller, located
    by `locate` (earlier versions wrapped it in an ``ExecutionError`` whose ``cause``
    held it; catch the error's own class, or `PlaitError`, instead).

    Attributes:
        node_id: id of the failed node in the graph.
        module_path: dotted path of the module that failed (``stage3.synthesizer``).
        input_index: index of the batch item, or None for a single call.
        cause: the underlying exception (also ``__cause__``).
    """

    def __init__(
        self,
        message: str,
        *,
        node_id: str | None = None,
        module_path: str | None = None,
        input_index: int | None = None,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.module_path = module_path
        self.input_index = input_index
        self.cause = cause


class DeadlineExceededError(ExecutionError):
    """A call or batch ran past its ``deadline``; the work still running was cancelled.

    Attributes:
        deadline: the seconds the call or batch was allowed.
    """

    def __init__(self, message: str, *, deadline: float, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.deadline = deadline


class ExecutionInterrupt(PlaitError):
    """The program stopped on purpose and can be resumed (not a failure).

    It passes through the scheduler as it is (never wrapped in an
    `ExecutionError`), so the caller catches the interrupt itself, e.g.
    `plait.confirmation.ConfirmationRequired`.
    """


class ResumeRefusedError(PlaitError, ValueError):
    """A ``resume_state=`` (or a stored pause) was refused before anything ran.

    The pause was changed after it was made, forged, sealed with another
    approval key, made by another agent, given other inputs than the paused
    ones, is nested absurdly deep, or its approval was already used. The
    message names the approval id and what to do (usually: ask the person
    again). Like `ExecutionInterrupt`, it reaches the caller as it is, never
    wrapped in an `ExecutionError`: it is about the call's ``resume_state=``,
    not a failure of one node.
    """


class ConfirmationRejected(PlaitError):
    """A person declined a call that cannot go on without their yes.

    Raised by the call itself when a resumed module makes the call the person
    declined (a tool, or a function wrapped in ``confirm_first``), by ReAct
    when it is built with ``on_decline="raise"``, and by your own code (a
    module's ``aresume``). Like `ResumeRefusedError`, it reaches the caller
    as it is, never wrapped in an `ExecutionError`: it is the person's
    answer, not a failure of one node.

    Attributes:
        message: what was declined (and the person's reason, when they gave one).
        confirmation_id: the id of the declined call's pause, when known.
        tool_call: the declined call as ``{"id", "name", "arguments"}``, when a
            tool call was declined.
    """

    def __init__(
        self, message: str, *, confirmation_id: str | None = None, tool_call: Any = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.confirmation_id = confirmation_id
        self.tool_call = tool_call


class MCPError(PlaitError):
    """An MCP server could not be used: it did not start, its connection ended (a crash),
    a call outlived its timeout, or it answered something that is not MCP.

    The message names the server and, for a call, the tool, and says what to do.
    """
