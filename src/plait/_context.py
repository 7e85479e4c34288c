"""Context variables that let lower layers see what the upper layers are doing.

`Value` (the data layer) must refuse `if value:` while a trace is being
recorded, and `Module.__call__` must know whether it is being traced or run
inside an executing graph. Both facts live in upper layers; instead of
importing upward, those layers publish an object here and the lower layers
consult it through the small protocols below.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

if TYPE_CHECKING:
    from plait.values import Value


class TraceSession(Protocol):
    """What the data and model layers may ask of an active trace."""

    def fail(self, value: Value, action: str) -> NoReturn:
        """Raises a TracingError for using ``value`` in ``action`` (e.g. ``len()``)."""

    def param_ref(self, param: Any) -> str:
        """Returns the graph ref (``param:dotted.name``) of a parameter."""

    def record_call(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Records (or follows) a module call and returns its traced output."""

    def record_op(self, name: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Records one functional-op node and returns its traced output."""


TRACE: ContextVar[TraceSession | None] = ContextVar("plait_trace", default=None)
"""The trace being recorded in this task, if any."""

RUN: ContextVar[Any] = ContextVar("plait_run", default=None)
"""The executor running the current graph node, if any (seen by ``async def forward`` leaves)."""


def current_trace() -> TraceSession | None:
    """Returns the active trace session, or None outside tracing."""
    return TRACE.get()


def current_run() -> Any:
    """Returns the active executor, or None outside an executing graph."""
    return RUN.get()


SETTINGS: ContextVar[Any] = ContextVar("plait_settings", default=None)
"""The innermost active ``ExecutionSettings``, if any (has ``.resources``)."""

PROFILE: ContextVar[Any] = ContextVar("plait_profile", default=None)
"""The active profiler (``plait.profiling.Profiler``), if any; the scheduler reports to it."""

ROLLOUT: ContextVar[str | None] = ContextVar("plait_rollout", default=None)
"""Rollout id stamped on every LLM request made in this context (deliberate fresh samples).

``BestOfN`` sets a different one per attempt so the response cache keeps them apart.
"""
