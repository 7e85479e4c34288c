"""Feedback: the textual "gradient" that flows backward from a loss to parameters.

A loss produces a `Feedback` (a score and actionable items). Backward hands
each node a `BackwardContext` (what the node really received and produced,
and the feedback on its output) and expects a `BackwardResult` saying what
each input and each parameter should hear. Text is kept bounded everywhere,
so a long training run never builds a prompt that overflows a context window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BackwardContext", "BackwardResult", "Feedback", "FeedbackText", "clip"]

MAX_TEXT = 1500
"""Characters of any one input, output or feedback shown in a backward message."""


def clip(text: Any, limit: int = MAX_TEXT) -> str:
    """Returns ``str(text)`` cut to ``limit`` characters, saying how much was cut."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters]"


@dataclass
class Feedback:
    """What a loss says about one output.

    Attributes:
        text: the verdict in words.
        score: a number in [0, 1] where higher is better, when the loss has one.
        items: concrete, actionable suggestions.
    """

    text: str
    score: float | None = None
    items: list[str] = field(default_factory=list)

    async def backward(self, grad: Any = None, **options: Any) -> Any:
        """Refuses: this feedback was computed in eval mode, so there is nothing to go back through.

        A loss computed in training mode (``step.train()``) is a `Value` that
        carries the record of its forward pass; in eval mode the loss comes
        back as this bare `Feedback`. ``await loss.backward()`` then raises
        the same ``ValueError`` as any output without a record, telling the
        caller to call ``.train()`` before the forward pass.
        """
        # late-bound upward call (ARCHITECTURE.md): the learning layer
        from plait.optimization.training.backward import backward

        return await backward(self, grad, **options)

    def __str__(self) -> str:
        lines = [self.text] if self.text else []
        if self.score is not None:
            lines.append(f"Score: {self.score:.2f}")
        lines.extend(f"- {item}" for item in self.items)
        return "\n".join(lines)


class FeedbackText(str):
    """The feedback a ``backward`` method receives: text, also readable as ``feedback.payload``.

    Overrides written against `Value` take ``feedback: Value`` and read ``feedback.payload``;
    others treat it as the string it is. Both work.
    """

    __slots__ = ()

    @property
    def payload(self) -> str:
        """Returns the text itself (what a feedback Value's payload would hold)."""
        return str(self)


@dataclass
class BackwardContext:
    """Everything one node's backward may look at.

    Attributes:
        node_id: the node in the graph (``stage3.synthesizer``).
        module_path: the module's dotted path.
        args: the real positional inputs the node received.
        kwargs: the real keyword inputs the node received.
        input_names: the ``forward`` parameter name of each positional input.
        output: what the node produced (raw payload).
        feedback: the feedback on that output, combined into one text.
        inner_calls: calls made inside an ``async def forward`` node, each a
            mapping with ``module``, ``path``, ``input`` and ``output``.
    """

    node_id: str
    module_path: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    input_names: tuple[str, ...]
    output: Any
    feedback: str
    inner_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def inputs(self) -> dict[str, Any]:
        """Returns every input by parameter name."""
        named = dict(zip(self.input_names, self.args, strict=False))
        named.update(self.kwargs)
        return named


@dataclass
class BackwardResult:
    """What backward of one node sends on.

    Attributes:
        input_feedback: input name (a ``forward`` parameter) → feedback for
            whatever produced that input.
        parameter_feedback: parameter name (an attribute of the module, or a
            dotted path below it) → feedback for that parameter.

    Feedback is text, or anything that becomes text (a `Feedback`, a Value, or
    an awaitable of one, awaited concurrently): an override may start its LLM
    calls and return them unawaited. Backward makes every entry text before
    sending it on.
    """

    input_feedback: dict[str, Any] = field(default_factory=dict)
    parameter_feedback: dict[str, Any] = field(default_factory=dict)
