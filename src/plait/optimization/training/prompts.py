"""What an optimizer shows the model: the prompts of its updates, and their sizes.

`OptimizerPrompts` is the part of `Optimizer` that words a parameter, its feedback and
the update rules (how much may change, what to keep), and renders the prompts a
Trainer's estimate sizes (`estimated_calls`); a subclass shows more by overriding
`_value_parts` (TextGrad's momentum) or `estimated_calls` (SFA's two calls).
"""

from __future__ import annotations

import json

from plait.feedback import clip
from plait.optimization.training.updates import (
    WORD_FLOOR,
    UpdateRecord,
    allowed_change,
    as_text,
    clip_middle,
    kind_of,
    placeholders,
)
from plait.parameter import Parameter

__all__ = ["OptimizerPrompts"]


class OptimizerPrompts:
    """The prompts of an `Optimizer`'s updates (its mixin; the settings are `Optimizer`'s)."""

    conservatism: float
    max_feedback_shown: int
    feedback_item_chars: int

    def _value_prompt(
        self, param: Parameter, parts: list[str], upstream: list[UpdateRecord]
    ) -> str:
        """Returns the prompt asking for ``param``'s new value: ``parts``, then what changed
        upstream in this step, then the update instructions."""
        parts = list(parts)
        if upstream:
            parts.append(
                "Earlier parts of the program were already changed in this step:\n"
                + _upstream_lines(upstream)
            )
        parts.append(self._instructions(param))
        return "\n\n".join(parts)

    def _value_parts(self, name: str, param: Parameter, feedback: str, total: int) -> list[str]:
        """Returns the optimizer's account of a parameter and its feedback, for `_value_prompt`.

        The default: the parameter and its feedback. Subclasses that ask for the new value
        from what they show override it.
        """
        return [_header(name, param), _feedback_part(feedback, total, self.max_feedback_shown)]

    def estimated_calls(
        self, name: str, param: Parameter, feedback: list[str]
    ) -> list[tuple[int, int]]:
        """Returns the (prompt, reply) characters of each call one update of ``param`` makes
        on ``feedback`` (before any re-ask): the prompts it would send, rendered, and
        replies of about a sentence of reason around the new value. For cost estimates.

        The default is one call of `_value_parts`; an optimizer that makes other calls
        says so by overriding this.
        """
        text, total = self._feedback_lines(feedback)
        prompt = self._value_prompt(param, self._value_parts(name, param, text, total), [])
        return [(_sent(prompt), _value_reply_chars(param))]

    def _instructions(self, param: Parameter) -> str:
        """Returns the closing rules of an update prompt: how much to change, what to keep."""
        c = self.conservatism
        if c <= 0.2:
            how = "You may rewrite it completely if that serves the changes better."
        elif c < 0.7:
            how = "Keep what already works and most of the wording; change what the changes need."
        else:
            how = "Make the smallest edit that carries out the changes; keep every other word."
        floor = WORD_FLOOR * (1 - c)
        limit = f"At most {allowed_change(c):.0%} of the words, or {floor:.0f} words, may change."
        lines = [f"{how} ({limit})"]
        if isinstance(param.value, str):
            fields = sorted(placeholders(param.value))
            if fields:
                lines.append(f"Keep the placeholders {', '.join(fields)} exactly as written.")
            lines.append("Do not paste the feedback into it: say what the step should do.")
        elif param.value_type is not None:
            lines.append(f"The value is a {kind_of(param.value)}: give the whole new one.")
        else:
            lines.append(f"The value is a {kind_of(param.value)}: give new_value as JSON text.")
        lines.append(
            # No quotable phrase here: SmolLM2-135M copied "the complete improved
            # value" into new_value; the schema already fixes the keys.
            "Reply with JSON: your reason in rationale, then the whole rewritten text "
            f"of {'it' if isinstance(param.value, str) else 'the JSON'} in new_value."
        )
        return "\n".join(lines)

    def _feedback_lines(self, items: list[str], dropped: int = 0) -> tuple[str, int]:
        """Returns the newest feedback items, numbered and clipped, and how many there were
        (``dropped`` of them no longer held)."""
        total = len(items) + dropped
        shown = items[-self.max_feedback_shown :]
        text = "\n".join(
            f"{i}. {clip_middle(item, self.feedback_item_chars)}" for i, item in enumerate(shown, 1)
        )
        return text, total


_SYSTEM = (
    "You improve the prompts and instructions of a program made of LLM calls. "
    "Answer with one JSON object and nothing else."
)


def _upstream_lines(upstream: list[UpdateRecord]) -> str:
    return "\n".join(
        f"- {r.parameter} changed from {clip(as_text(r.old), 300)!r} to "
        f"{clip(as_text(r.new), 300)!r}" + (f" ({clip(r.rationale, 200)})" if r.rationale else "")
        for r in upstream
    )


def _header(name: str, param: Parameter) -> str:
    return (
        f"Part of the program: {name}\n"
        f"Its role: {param.description}\n"
        f"Current value:\n<<<\n{as_text(param.value)}\n>>>"
    )


def _feedback_part(feedback: str, total: int, most: int) -> str:
    return f"Feedback from {total} runs (the newest {min(total, most)} shown):\n{feedback}"


_REASON = "x" * 120
"""A stand-in of a sentence of reason (a rationale, a summary), for sizing replies."""


_CHANGES = ["x" * 60] * 2
"""Stand-ins of the changes an aggregation lists, for sizing its reply and the rewrite."""


def _sent(prompt: str) -> int:
    """Returns the characters of the messages an optimizer call with ``prompt`` sends."""
    return len(_SYSTEM) + len(prompt)


def _value_reply_chars(param: Parameter) -> int:
    """Returns the characters of a `ParameterUpdate` reply about as long as the value now."""
    return len(json.dumps({"rationale": _REASON, "new_value": as_text(param.value)}))
