"""Callbacks: hooks told about every module, LLM, tool and adapter call, and every learning step.

Subclass `BaseCallback` and override the hooks you need. Their names and
arguments (``on_module_start(call_id, instance, inputs)``,
``on_lm_end(call_id, outputs, exception)`` …) are the widespread ones, so an
existing callback ports by changing its import. Each call gets a ``call_id`` that pairs its
start and end hooks; inside a start hook, `active_call_id` is the id of the
enclosing call, so a callback can nest what it records (the OpenTelemetry
callback in `plait.report.telemetry` does).

One mechanism, three scopes (see `plait.settings`)::

    plait.settings.configure(callbacks=[Log()])       # every run in the process
    with plait.settings.context(callbacks=[Log()]):   # runs inside this block
        ...
    program.summarizer.callbacks = [Log()]             # this module's calls and what they contain

A callback that raises is logged (logger ``plait.callbacks``) and never breaks
a run. With none configured, a call pays one context lookup.

What each hook receives:

* module — ``instance``: the module; ``inputs``: its arguments by name;
  ``outputs``: what it returned (raw data, a `Prediction` …).
* lm — ``instance``: the `EndpointConfig` serving the alias; ``inputs``:
  ``alias``, ``provider``, ``model``, ``messages`` (OpenAI-style dicts) and
  the sampling options, ``tools`` and ``response_format`` when set;
  ``outputs``: the `Response` (``.text``, ``.usage``, ``.finish_reason``,
  ``.meta["cached"]``).
* tool — ``instance``: the `Tool`; ``inputs``: ``{"arguments": ..., "call_id": ...}``;
  ``outputs``: the `ToolResult`.
* adapter_format / adapter_parse — ``instance``: the adapter; ``inputs``:
  ``signature`` and ``inputs``/``demos`` (format) or ``completion`` (parse);
  ``outputs``: the messages, or the parsed outputs.
* evaluate — ``instance``: the program; ``inputs``: ``devset`` and ``metric``.

Learning (program searches, optimizers, the `Trainer`) is told step by step.
Its ``inputs`` and ``outputs`` are plain data (numbers, text, lists, dicts),
so a callback can store or export them as they are:

* optimize — one optimisation run (a search's ``compile``, ``Trainer.fit``):
  ``instance``: the search or Trainer; ``inputs``: ``optimizer``, ``program``;
  ``outputs``: ``start_score``, ``best_score``, ``improved``, ``calls``, ``reason`` ….
* round — one round of a search that works in rounds (`ReflectiveSearch`),
  one optimizer step of the `Trainer` (``epoch``, ``batch``; outputs
  ``train_score``, ``applied``, ``rejected``).
* candidate — one candidate program evaluated on validation: ``inputs``:
  ``candidate`` (its trial number, once known), ``note``, ``params``;
  ``outputs``: ``score``, ``n``, ``calls``, ``cost``, ``seconds``.
* proposal — one proposed change, with the model calls that proposed it
  inside: ``parameter``, ``method``; ``outputs``: ``accepted`` and
  ``proposed`` (the value).
* backward — one backward pass: ``outputs``: ``parameters`` (name → feedback
  items it received), ``nodes``.
* decision (a point, `tell`) — an accept/reject decision and its evidence:
  ``accepted``, ``rule``, ``reason``, and as the rule has them ``candidate``,
  ``wins``, ``losses``, ``p_value``, ``old_score``, ``new_score``.
* update (a point) — a parameter's new value: ``parameter``, ``old_chars`` /
  ``new_chars``, ``old_sha256`` / ``new_sha256`` (12 hex digits), and the
  values ``old`` / ``new`` themselves.

`CONTENT_KEYS` names the keys that hold the program's text (proposed values,
old and new values, a candidate's ``params``): exporters that may leave the
machine (OpenTelemetry, the run report) record them only when asked to.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from plait import _context

__all__ = [
    "CONTENT_KEYS",
    "BaseCallback",
    "CallScope",
    "ReportedCall",
    "active_call_id",
    "active_callbacks",
    "call_path",
    "callbacks_for",
    "end_call",
    "start_call",
    "tell",
]

logger = logging.getLogger("plait.callbacks")

CONTENT_KEYS = frozenset({"old", "new", "proposed", "params"})
"""Keys of learning ``inputs``/``outputs`` that hold the program's own text (see module docs)."""


class BaseCallback:
    """Base class of callbacks: every hook does nothing until overridden.

    Example::

        class Timer(BaseCallback):
            def on_lm_start(self, call_id, instance, inputs):
                self.started[call_id] = time.perf_counter()

            def on_lm_end(self, call_id, outputs, exception=None):
                print(call_id, time.perf_counter() - self.started.pop(call_id))
    """

    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when a module call starts (the whole program, a graph node, a child)."""

    def on_module_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        """Called when that module call ends, with its output or its exception."""

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when an LLM call starts (before the cache, limits and retries)."""

    def on_lm_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        """Called when that LLM call ends, with the `Response` or the final error."""

    def on_adapter_format_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when an adapter starts writing a signature's messages."""

    def on_adapter_format_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        """Called when the adapter has written them (``outputs``: the messages)."""

    def on_adapter_parse_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when an adapter starts reading outputs from a reply."""

    def on_adapter_parse_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        """Called when it has read them, or failed to (a `StructuredOutputError`)."""

    def on_tool_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when a tool call starts."""

    def on_tool_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        """Called when it ends (``outputs``: the `ToolResult`; ``exception``: what it raised)."""

    def on_evaluate_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when `plait.evaluate` starts."""

    def on_evaluate_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        """Called when it ends, with its result."""

    def on_optimize_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when an optimisation run starts (a search's ``compile``, ``Trainer.fit``)."""

    def on_optimize_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        """Called when it ends (``outputs``: its scores, calls and reason, as data)."""

    def on_round_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when a round of a search, or an optimizer step of a Trainer, starts."""

    def on_round_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        """Called when that round ends."""

    def on_candidate_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when a candidate program's evaluation starts (``instance``: the program)."""

    def on_candidate_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        """Called when it ends (``outputs``: ``score``, ``n``, ``calls``, ``cost`` …)."""

    def on_proposal_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when a proposal starts (its model calls are told inside it)."""

    def on_proposal_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        """Called when it ends (``outputs``: ``accepted`` and the ``proposed`` value)."""

    def on_backward_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when a backward pass starts."""

    def on_backward_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        """Called when it ends (``outputs``: the ``parameters`` it reached)."""

    def on_decision(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when a learning step accepts or rejects something, with its evidence."""

    def on_update(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when a parameter gets a new value (``instance``: the `Parameter`)."""

    def on_circuit(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """Called when the circuit of a fallback chain's endpoint opens or closes again
        (``instance``: the `plait.resources.circuit.Circuit`; ``inputs``: ``endpoint``,
        ``state`` (``"opened"`` / ``"closed"``), ``failures`` in a row, ``opened_at``
        (epoch seconds), ``cooldown``)."""


def active_callbacks() -> tuple[Any, ...]:
    """Returns the callbacks of a call made here: the enclosing module call's, else settings'."""
    resolved = _context.CALLBACKS.get()
    if resolved is not None:
        return resolved
    configured = _context.setting("callbacks")
    return tuple(configured) if configured else ()


def callbacks_for(module: Any) -> tuple[Any, ...]:
    """Returns the callbacks of a call of ``module``: the active ones plus the module's own."""
    inherited = active_callbacks()
    own: Sequence[Any] = getattr(module, "callbacks", ())
    if not own:
        return inherited
    return (*inherited, *(cb for cb in own if cb not in inherited))


def call_path() -> str:
    """Returns the dotted module path of the module call being reported (inside its hooks)."""
    return _context.CALL_PATH.get()


def active_call_id() -> str | None:
    """Returns the call id of the innermost call running here (the parent, inside a start hook)."""
    return _context.ACTIVE_CALL.get()


class CallScope:
    """One call that callbacks were told started; `end_call` tells them it ended."""

    __slots__ = ("call_id", "callbacks", "kind", "token")

    def __init__(self, kind: str, call_id: str, callbacks: tuple[Any, ...], token: Any) -> None:
        self.kind = kind
        self.call_id = call_id
        self.callbacks = callbacks
        self.token = token


def _new_call_id() -> str:
    """Returns a fresh call id (a UUID4 in hex); uuid loads only when callbacks listen."""
    import uuid  # import time: only when a callback listens

    return uuid.uuid4().hex


def start_call(
    kind: str, instance: Any, inputs: dict[str, Any], callbacks: tuple[Any, ...]
) -> CallScope | None:
    """Tells ``callbacks`` that a call of ``kind`` started; returns its scope (None: no callbacks).

    ``kind`` is ``module``, ``lm``, ``tool``, ``adapter_format``,
    ``adapter_parse``, ``evaluate``, or a learning step (``optimize``,
    ``round``, ``candidate``, ``proposal``, ``backward``). Call `end_call` with the scope in the
    same task, whatever happens.
    """
    if not callbacks:
        return None
    call_id = _new_call_id()
    for callback in callbacks:
        _safely(callback, f"on_{kind}_start", call_id, instance, inputs)
    return CallScope(kind, call_id, callbacks, _context.ACTIVE_CALL.set(call_id))


def end_call(
    scope: CallScope | None, outputs: Any = None, exception: BaseException | None = None
) -> None:
    """Tells the callbacks of ``scope`` that its call ended (with ``outputs`` or ``exception``)."""
    if scope is None:
        return
    with contextlib.suppress(ValueError):  # ended in another context than it started: no-op
        _context.ACTIVE_CALL.reset(scope.token)
    error = exception if isinstance(exception, Exception) else None
    for callback in scope.callbacks:
        _safely(callback, f"on_{scope.kind}_end", scope.call_id, outputs, error)


def tell(kind: str, instance: Any, inputs: dict[str, Any], callbacks: tuple[Any, ...]) -> None:
    """Tells ``callbacks`` of a point in a run (``decision``, ``update``): ``on_<kind>``.

    A point has no end; inside its hook `active_call_id` is the call it happened in.
    """
    if not callbacks:
        return
    call_id = _new_call_id()
    for callback in callbacks:
        _safely(callback, f"on_{kind}", call_id, instance, inputs)


class ReportedCall:
    """A ``with`` block that ``callbacks`` hear of as one call of ``kind``.

    Entering tells them the call started (`start_call`); leaving tells them it
    ended (`end_call`) with ``outputs``, which the block sets, or with the
    exception that escaped the block. ``exception`` reports a failure the
    call returned rather than raised (a tool's error result)::

        with ReportedCall("lm", config, inputs, callbacks) as call:
            call.outputs = await send(request)
    """

    __slots__ = ("_callbacks", "_inputs", "_instance", "_kind", "_scope", "exception", "outputs")

    def __init__(
        self, kind: str, instance: Any, inputs: dict[str, Any], callbacks: tuple[Any, ...]
    ) -> None:
        self._kind = kind
        self._instance = instance
        self._inputs = inputs
        self._callbacks = callbacks
        self._scope: CallScope | None = None
        self.outputs: Any = None
        self.exception: BaseException | None = None

    def __enter__(self) -> ReportedCall:
        self._scope = start_call(self._kind, self._instance, self._inputs, self._callbacks)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> None:
        if exc is None:
            end_call(self._scope, self.outputs, self.exception)
        else:
            end_call(self._scope, None, exc)


def _safely(callback: Any, hook: str, *args: Any) -> None:
    method = getattr(callback, hook, None)
    if method is None:
        return
    try:
        method(*args)
    except Exception:
        logger.exception("callback %r raised in %s; the run goes on", callback, hook)
