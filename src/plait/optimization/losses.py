"""Losses: modules that judge an output and return `Feedback`.

A loss is the last node of a `TrainingStep`'s graph. Its backward sends its
feedback to the output it judged, never to the target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plait.feedback import BackwardContext, BackwardResult, Feedback
from plait.module import Module

__all__ = ["Loss", "VerifierLoss"]


class Loss(Module):
    """Base class of losses: ``forward(output, target) -> Feedback``.

    Override ``forward`` (``async def`` when it calls an LLM). The backward
    is shared: the feedback goes to the judged ``output`` only.
    """

    def forward(self, output: Any, target: Any = None) -> Feedback:
        raise NotImplementedError(f"{type(self).__name__} must implement forward(output, target)")

    def backward(self, feedback: str, ctx: BackwardContext) -> BackwardResult:
        return BackwardResult(input_feedback={"output": feedback})


class VerifierLoss(Loss):
    """A loss from a Python check, for tasks with a checkable answer.

    Args:
        check: ``check(output, target)`` returning a bool (right/wrong), a float
            score in [0, 1], a message string (a complaint; empty means fine),
            or a `Feedback`.
        name: how the check is named in feedback.

    Example::

        loss = VerifierLoss(lambda out, target: out.strip().lower() == target)
    """

    def __init__(self, check: Callable[[Any, Any], Any], name: str | None = None) -> None:
        super().__init__()
        self.check = check
        self.check_name = name or getattr(check, "__name__", "check")

    def forward(self, output: Any, target: Any = None) -> Feedback:
        verdict = self.check(output, target)
        if isinstance(verdict, Feedback):
            return verdict
        expected = "" if target is None else f" Expected: {target!r}."
        if isinstance(verdict, bool):
            if verdict:
                return Feedback(f"The output passed {self.check_name}.", score=1.0)
            return Feedback(
                f"The output failed {self.check_name}.{expected} Got: {output!r}.",
                score=0.0,
                items=["Change the instructions so this kind of input gets the expected output."],
            )
        if isinstance(verdict, int | float):
            score = max(0.0, min(1.0, float(verdict)))
            return Feedback(f"{self.check_name} scored the output {score:.2f}.{expected}", score)
        message = str(verdict)
        if not message:
            return Feedback(f"The output passed {self.check_name}.", score=1.0)
        return Feedback(f"{self.check_name}: {message}{expected} Got: {output!r}.", score=0.0)
