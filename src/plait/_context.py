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
"""The innermost active ``ExecutionSettings``, if any (has ``.resources``, ``.callbacks`` …)."""

GLOBAL_SETTINGS: list[Any] = [None]
"""The process-wide ``ExecutionSettings`` set by ``plait.settings.configure`` (one slot).

Not a ContextVar: ``configure`` is meant to reach every thread and task, as a
process's defaults should; scoped overrides use `SETTINGS`.
"""


def setting(name: str) -> Any:
    """Returns the value of an execution setting: the innermost context's, else the global one.

    None when neither sets it. This is how every layer reads the settings,
    so ``plait.settings.context(...)`` and ``plait.settings.configure(...)``
    are one mechanism with two scopes.
    """
    scoped = SETTINGS.get()
    if scoped is not None:
        value = getattr(scoped, name)
        if value is not None:
            return value
    configured = GLOBAL_SETTINGS[0]
    return None if configured is None else getattr(configured, name)


NODE_SCOPE: ContextVar[tuple[str, int | None]] = ContextVar("plait_node_scope", default=("", None))
"""(module path, batch index) of the ``async def forward`` leaf running now, if any.

Calls made inside such a leaf run outside the traced graph; the scope lets
them be profiled, traced, streamed and failed under their full path and the
item's index.
"""


def module_path(module: Any) -> str:
    """Returns the path of the call of ``module`` running now (its node's path, else its name).

    What trace records and stream events name a module by.
    """
    path = NODE_SCOPE.get()[0]
    return path or getattr(module, "_name", None) or type(module).__name__


STREAM: ContextVar[Any] = ContextVar("plait_stream", default=None)
"""The event stream of an active ``module.astream(...)``, if any (see `plait.streaming`)."""

CALLBACKS: ContextVar[tuple[Any, ...] | None] = ContextVar("plait_callbacks", default=None)
"""The callbacks of the module call running now (settings' plus the module's own), once a
call has resolved them; None means "not resolved here: read the settings"."""

ACTIVE_CALL: ContextVar[str | None] = ContextVar("plait_active_call", default=None)
"""The call id (see `plait.callbacks`) of the innermost module, LLM, tool or adapter call."""

PROFILE: ContextVar[Any] = ContextVar("plait_profile", default=None)
"""The active `plait.report.profiling.Profiler`, if any; the scheduler reports to it."""

ROLLOUT: ContextVar[str | None] = ContextVar("plait_rollout", default=None)
"""Rollout id stamped on every LLM request made in this context (deliberate fresh samples).

``BestOfN`` sets a different one per attempt so the response cache keeps them apart.
"""

RESUME: ContextVar[dict[str, Any] | None] = ContextVar("plait_resume", default=None)
"""``{"state": ResumeState, "claimed": bool}`` while a call runs with ``resume_state=``."""

CALL_PATH: ContextVar[str] = ContextVar("plait_call_path", default="")
"""The module path of the module call whose callbacks run now (``plait.callbacks.call_path``)."""
