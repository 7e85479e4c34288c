"""ChainOfThought: a Predict that writes its reasoning before its answer."""

from __future__ import annotations

from typing import Any

from plait.modules.predict import Predict
from plait.signatures.signature import OutputField, Signature, as_signature

__all__ = ["REASONING_DESCRIPTION", "ChainOfThought"]

REASONING_DESCRIPTION = "Think step by step to work out the answer, briefly."
"""The default description of the added ``reasoning`` field."""


class ChainOfThought(Predict):
    """Adds an output field ``reasoning`` before the signature's outputs.

    With the JSON adapter the reasoning is the first key of the reply
    object, so the model writes it before the answer it supports. The
    result is a `Prediction` with ``.reasoning`` and every original output.

    Args:
        signature: a `Signature` subclass or a string like ``"question -> answer"``.
        reasoning: the description of the reasoning field.
        reasoning_type: its type; e.g. ``Annotated[str, Field(max_length=200)]``
            keeps a small model's reasoning short enough to finish.
        **predict_kwargs: ``alias``, ``adapter``, ``temperature``, ``max_tokens``, ``demos``.

    ``original_signature`` is the signature as given; ``signature`` is the
    one with the reasoning field, which the calls use. Under ``astream`` the
    reasoning streams as `ThoughtStreamChunk` events, the answer as
    `OutputStreamChunk`.

    Example::

        cot = ChainOfThought("question -> answer: int").bind(config)
        pred = await cot(question="Tom has 3 apples and eats one. How many are left?")
        pred.reasoning, pred.answer
    """

    thought_fields = frozenset({"reasoning"})

    def __init__(
        self,
        signature: type[Signature] | str,
        *,
        reasoning: str = REASONING_DESCRIPTION,
        reasoning_type: Any = str,
        **predict_kwargs: Any,
    ) -> None:
        original = as_signature(signature)
        if "reasoning" in original.fields:
            raise ValueError(
                f"ChainOfThought adds a field 'reasoning', but {original!r} already has one; "
                "rename that field or use Predict"
            )
        extended = original.prepend("reasoning", OutputField(reasoning), reasoning_type)
        super().__init__(extended, **predict_kwargs)
        self.original_signature = original
