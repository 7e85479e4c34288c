"""SFAOptimizer: structured feedback aggregation, a summary of the feedback, then a rewrite."""

from __future__ import annotations

import json
from typing import Any

from plait.errors import StructuredOutputError
from plait.feedback import clip
from plait.optimization.training.optimizer import Optimizer
from plait.optimization.training.prompts import (
    _CHANGES,
    _REASON,
    _feedback_part,
    _header,
    _sent,
    _value_reply_chars,
)
from plait.optimization.training.updates import (
    FeedbackSummary,
    UpdateRecord,
    clip_middle,
)
from plait.parameter import Parameter

__all__ = ["SFAOptimizer"]


class SFAOptimizer(Optimizer):
    """Structured feedback aggregation: summarise the feedback, then rewrite, upstream first.

    For each parameter with feedback, two structured calls: the first turns
    the (bounded) feedback items into at most five concrete changes
    (``{"summary", "changes"}``); the second writes the new value
    (``{"new_value", "rationale"}``) from the description, the current value,
    those changes and what changed upstream in this same step. Parameters are
    updated level by level in the order of the graphs of the last backward
    pass (falling back to the order they were given in); independent ones
    concurrently. If aggregation yields nothing usable, the raw feedback is
    used as the list of changes; if it asks for no change, the parameter is
    skipped.

    Example::

        optimizer = SFAOptimizer(program.named_parameters(), conservatism=0.3)
        optimizer.bind(ResourceConfig({"*": {"provider": "local"}}))
        ...                                  # forward + backward in training mode
        report = await optimizer.step()
        report.accepted, optimizer.history["stage1.instructions"][-1].reason

    Args: as `Optimizer`.
    """

    max_changes = 5
    """Most changes the aggregation keeps."""
    calls_per_update = 2  # the summary, then the rewrite

    async def _propose(
        self,
        manager: Any,
        name: str,
        param: Parameter,
        upstream: list[UpdateRecord],
        record: UpdateRecord,
    ) -> None:
        feedback, total = self._feedback_lines(
            param.get_accumulated_feedback(), param.dropped_feedback
        )
        summary, changes = await self._aggregate(manager, name, param, feedback, total, record)
        record.feedback, record.changes = summary, changes
        if not changes:
            record.status, record.reason = "skipped", "the feedback asked for no change"
            return
        parts = self._rewrite_parts(name, param, changes)
        await self._ask_for_value(manager, param, parts, upstream, record)

    def estimated_calls(
        self, name: str, param: Parameter, feedback: list[str]
    ) -> list[tuple[int, int]]:
        """The summary of ``feedback``, then the rewrite (see `Optimizer.estimated_calls`)."""
        text, total = self._feedback_lines(feedback)
        summary = json.dumps({"summary": _REASON, "changes": _CHANGES})
        rewrite = self._value_prompt(param, self._rewrite_parts(name, param, _CHANGES), [])
        return [
            (_sent(self._summary_prompt(name, param, text, total)), len(summary)),
            (_sent(rewrite), _value_reply_chars(param)),
        ]

    @staticmethod
    def _rewrite_parts(name: str, param: Parameter, changes: list[str]) -> list[str]:
        return [
            "Rewrite this part of an LLM program so that it makes the changes listed.",
            _header(name, param),
            "Changes to make:\n" + "\n".join(f"- {change}" for change in changes),
        ]

    def _summary_prompt(self, name: str, param: Parameter, feedback: str, total: int) -> str:
        return (
            "Below is feedback on runs of an LLM program. Turn it into a short list of "
            "concrete changes to one part of the program.\n\n"
            f"{_header(name, param)}\n\n"
            f"{_feedback_part(feedback, total, self.max_feedback_shown)}\n\n"
            'Reply with JSON: "summary": one sentence on what goes wrong, "changes": at most '
            f"{self.max_changes} short, concrete edits to the value (an empty list if it "
            "should stay as it is)."
        )

    async def _aggregate(
        self,
        manager: Any,
        name: str,
        param: Parameter,
        feedback: str,
        total: int,
        record: UpdateRecord,
    ) -> tuple[str, list[str]]:
        prompt = self._summary_prompt(name, param, feedback, total)
        try:
            result = await self._ask_structured(manager, prompt, FeedbackSummary, 400, record)
        except StructuredOutputError as exc:
            # Fail soft: the raw feedback still says what to change.
            items = param.get_accumulated_feedback()[-self.max_changes :]
            note = f"aggregation failed ({exc}); the raw feedback was used"
            return note, [clip_middle(item, 300) for item in items]
        changes = [clip(c.strip(), 300) for c in result.changes if c.strip()]
        return clip(result.summary.strip(), 400), changes[: self.max_changes]
