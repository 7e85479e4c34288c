"""TextGradOptimizer: textual gradient descent, one structured call per parameter."""

from __future__ import annotations

from typing import Any

from plait.feedback import clip
from plait.optimization.training.optimizer import Optimizer, ParamsArg
from plait.optimization.training.updates import (
    UpdateRecord,
    as_text,
    clip_middle,
)
from plait.parameter import Parameter

__all__ = ["TextGradOptimizer"]


class TextGradOptimizer(Optimizer):
    """Textual gradient descent: one structured call per parameter, feedback as the gradient.

    The call shows the description, the current value, the (bounded)
    feedback and what changed upstream in this step, and asks for
    ``{"new_value", "rationale"}``. With ``momentum=k`` it also shows the
    parameter's last ``k`` past values, the feedback each got and whether its
    update was kept, so the model does not walk back into an old mistake.

    Args:
        params, alias, max_retries, conservatism, validate: as `Optimizer`.
        momentum: past values shown per parameter (0: none).
    """

    def __init__(self, params: ParamsArg, *, momentum: int = 0, **options: Any) -> None:
        super().__init__(params, **options)
        if not isinstance(momentum, int) or momentum < 0:
            raise ValueError(f"momentum must be an int >= 0 (past values shown), got {momentum!r}")
        self.momentum = momentum

    def _settings(self) -> dict[str, Any]:
        return {**super()._settings(), "momentum": self.momentum}

    async def _propose(
        self,
        manager: Any,
        name: str,
        param: Parameter,
        upstream: list[UpdateRecord],
        record: UpdateRecord,
    ) -> None:
        items = param.get_accumulated_feedback()
        feedback, total = self._feedback_lines(items, param.dropped_feedback)
        record.feedback = f"{total} item(s); newest: {clip_middle(items[-1], 300)}"
        parts = self._value_parts(name, param, feedback, total)
        await self._ask_for_value(manager, param, parts, upstream, record)

    def _value_parts(self, name: str, param: Parameter, feedback: str, total: int) -> list[str]:
        """The feedback as a gradient, and with ``momentum`` the parameter's past values."""
        parts = [
            "Improve this part of an LLM program. The feedback below is its gradient: "
            "change the value in the direction the feedback points.",
            *super()._value_parts(name, param, feedback, total),
        ]
        past = self.history.get(name, [])[-self.momentum :] if self.momentum else []
        if past:
            parts.append(
                "Earlier values of this part and the feedback they got (oldest first):\n"
                + "\n".join(
                    f"{i}. value {clip(as_text(r.old), 400)!r}; feedback: "
                    f"{clip(r.feedback, 300)}; its update was {r.status}"
                    for i, r in enumerate(past, 1)
                )
            )
        return parts
