"""The learning steps of a run, written down for its run report.

`LearningLog` is a callback that keeps every learning step it hears
(optimisation runs, rounds, candidate evaluations, proposals, backward passes,
decisions and updates: see `plait.callbacks`) as plain data, each step
naming the step it happened in. ``plait train`` keeps one, and its run
report (``learning`` in run.json) and HTML page show the steps::

    with Profiler() as profiler, LearningLog() as learning:
        await search.compile(program, train, val)
    report = profiler.report(learning=learning.steps)

Like the OpenTelemetry callback, it leaves the program's text (proposed and
updated values, a candidate's ``params``) out unless ``capture_content=True``:
a report is shared more widely than the program.
"""

from __future__ import annotations

from typing import Any

from plait import _context
from plait._jsondata import as_json_data
from plait.callbacks import CONTENT_KEYS, BaseCallback, active_call_id, active_callbacks

__all__ = ["LearningLog"]


class LearningLog(BaseCallback):
    """Keeps the learning steps of a run as data (`steps`); a ``with`` block adds it.

    Args:
        capture_content: also keep the program's text (proposals, values).
        max_steps: most steps kept; later ones are counted in `dropped`.
    """

    def __init__(self, *, capture_content: bool = False, max_steps: int = 5000) -> None:
        self.capture_content = capture_content
        self.max_steps = max_steps
        self.steps: list[dict[str, Any]] = []
        """One dict per step, in the order they started: ``id``, ``parent`` (the id of
        the step it happened in, or None), ``kind``, ``inputs``, ``outputs``, ``error``."""
        self.dropped = 0
        """Steps heard after `max_steps` were kept."""
        self._open: dict[str, dict[str, Any]] = {}
        self._ids: dict[str, int] = {}
        self._token: Any = None

    def __enter__(self) -> LearningLog:
        self._token = _context.CALLBACKS.set((*active_callbacks(), self))
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _context.CALLBACKS.reset(self._token)
            self._token = None

    # Every learning hook keeps its step the same way: calls open and close, points just happen.
    def on_optimize_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._call_started(call_id, "optimize", inputs)

    def on_optimize_end(
        self, call_id: str, outputs: Any, exception: Exception | None = None
    ) -> None:
        self._call_ended(call_id, outputs, exception)

    def on_round_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._call_started(call_id, "round", inputs)

    def on_round_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
        self._call_ended(call_id, outputs, exception)

    def on_candidate_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._call_started(call_id, "candidate", inputs)

    def on_candidate_end(
        self, call_id: str, outputs: Any, exception: Exception | None = None
    ) -> None:
        self._call_ended(call_id, outputs, exception)

    def on_proposal_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._call_started(call_id, "proposal", inputs)

    def on_proposal_end(
        self, call_id: str, outputs: Any, exception: Exception | None = None
    ) -> None:
        self._call_ended(call_id, outputs, exception)

    def on_backward_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._call_started(call_id, "backward", inputs)

    def on_backward_end(
        self, call_id: str, outputs: Any, exception: Exception | None = None
    ) -> None:
        self._call_ended(call_id, outputs, exception)

    def on_decision(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._began(call_id, "decision", inputs)

    def on_update(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._began(call_id, "update", inputs)

    # -------------------------------------------------------------- keeping
    def _began(self, call_id: str, kind: str, inputs: dict[str, Any]) -> dict[str, Any] | None:
        if len(self.steps) >= self.max_steps:
            self.dropped += 1
            return None
        number = len(self.steps)
        step: dict[str, Any] = {
            "id": number,
            "parent": self._ids.get(active_call_id() or ""),
            "kind": kind,
            "inputs": self._data(inputs),
            "outputs": None,
            "error": None,
        }
        self.steps.append(step)
        self._ids[call_id] = number
        return step

    def _call_started(self, call_id: str, kind: str, inputs: dict[str, Any]) -> None:
        step = self._began(call_id, kind, inputs)
        if step is not None:
            self._open[call_id] = step

    def _call_ended(self, call_id: str, outputs: Any, exception: Exception | None) -> None:
        step = self._open.pop(call_id, None)
        if step is None:
            return
        step["outputs"] = self._data(outputs) if isinstance(outputs, dict) else None
        if exception is not None:
            step["error"] = f"{type(exception).__name__}: {str(exception)[:300]}"

    def _data(self, facts: dict[str, Any]) -> dict[str, Any]:
        """Returns ``facts`` as JSON data, without the program's text unless captured."""
        kept = {
            key: value
            for key, value in facts.items()
            if self.capture_content or key not in CONTENT_KEYS
        }
        data: dict[str, Any] = as_json_data(kept, fallback=repr)
        return data
