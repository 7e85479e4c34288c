"""MultiChainComparison: several reasoning chains, then one call that compares them.

``m`` `ChainOfThought` attempts run concurrently, each under its own rollout
id (``multi_chain:<i>``, so they are distinct samples and cached apart).
Their reasoning and answers are then shown to one comparison call, a
`ChainOfThought` over the signature plus ``attempt_1`` … ``attempt_m`` inputs,
which weighs them and produces the final outputs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from plait.backends.types import Usage
from plait.module import Module
from plait.modules._wrapping import bind_signature_inputs, call_child, rollout
from plait.modules.best_of_n import AllAttemptsFailedError
from plait.modules.chain_of_thought import ChainOfThought
from plait.modules.prediction import Prediction
from plait.signatures.adapters import format_value
from plait.signatures.signature import InputField, Signature, as_signature

__all__ = ["COMPARE_INSTRUCTIONS", "MultiChainComparison"]

COMPARE_INSTRUCTIONS = (
    "Several independent attempts at this task are given, each with its reasoning and "
    "answer. Compare them: where they agree, where they differ, which reasoning holds up. "
    "Then give the single best final answer."
)
"""Appended to the signature's instructions for the comparison call."""


class MultiChainComparison(Module):
    """Runs ``m`` reasoning chains concurrently and compares them into one answer.

    Args:
        signature: a `Signature` subclass or a string like ``"question -> answer"``.
        m: how many chains.
        alias: the resource alias of every call.
        **predict_kwargs: ``adapter``, ``temperature``, ``max_tokens`` for
            both the chains and the comparison.

    Children: ``chain`` (the `ChainOfThought` sampled ``m`` times) and
    ``compare`` (the comparison); both have learnable instructions and demos.

    Returns the comparison's `Prediction`: the signature's outputs plus its
    ``reasoning`` (the comparison), with the usage of all ``m + 1`` calls.
    A chain that fails is shown to the comparison as failed; if all fail,
    `AllAttemptsFailedError` lists the errors.

    Example::

        solve = MultiChainComparison("question -> answer: int", m=3).bind(config)
        pred = await solve(question="A bat and a ball cost 1.10 in total ...")
        pred.answer, pred.reasoning
    """

    def __init__(
        self,
        signature: type[Signature] | str,
        m: int = 3,
        *,
        alias: str = "llm",
        **predict_kwargs: Any,
    ) -> None:
        super().__init__()
        sig = as_signature(signature)
        if not isinstance(m, int) or m < 1:
            raise ValueError(f"MultiChainComparison needs m >= 1 chains, got {m!r}")
        taken = [f"attempt_{i}" for i in range(1, m + 1) if f"attempt_{i}" in sig.fields]
        if taken or "reasoning" in sig.fields:
            clash = ", ".join([*taken, *(["reasoning"] if "reasoning" in sig.fields else [])])
            raise ValueError(
                f"MultiChainComparison adds fields attempt_1 … attempt_{m} and reasoning, but "
                f"{sig!r} already has {clash}; rename them"
            )
        self.signature = sig
        self.m = m
        self.chain = ChainOfThought(sig, alias=alias, **predict_kwargs)
        compare = sig
        for i in range(1, m + 1):
            compare = compare.append(
                f"attempt_{i}", InputField(f"Attempt {i}: its reasoning and answer.")
            )
        task = sig.instructions
        compare = compare.with_instructions(
            f"{task}\n\n{COMPARE_INSTRUCTIONS}" if task else COMPARE_INSTRUCTIONS
        )
        self.compare = ChainOfThought(
            compare,
            reasoning="Compare the attempts and decide which answer is right, briefly.",
            alias=alias,
            **predict_kwargs,
        )

    async def forward(self, *args: Any, **inputs: Any) -> Prediction:
        """Returns the compared outputs (see the class docstring)."""
        label = f"MultiChainComparison ({self.signature.signature_text()})"
        values = bind_signature_inputs(self.signature, args, inputs, label)
        results = await asyncio.gather(
            *(self._chain(i, values) for i in range(self.m)), return_exceptions=True
        )
        for result in results:
            if isinstance(result, asyncio.CancelledError):
                raise result
        errors = [r for r in results if isinstance(r, BaseException)]
        if len(errors) == len(results):
            raise AllAttemptsFailedError("MultiChainComparison", errors, unit="chain")
        attempts = {f"attempt_{i}": _describe(result) for i, result in enumerate(results, start=1)}
        final = await call_child(self.compare, (), {**values, **attempts})
        usage = Usage()
        for result in (*results, final):
            if isinstance(result, Prediction):
                usage += result.usage
        return Prediction(final.to_dict(), usage=usage, raw=final.raw, messages=final.messages)

    async def _chain(self, index: int, values: dict[str, Any]) -> Prediction:
        with rollout(f"multi_chain:{index}"):
            return await call_child(self.chain, (), values)

    def extra_repr(self) -> str:
        return f"{self.signature!r}, m={self.m}"


def _describe(result: Prediction | BaseException) -> str:
    """Returns one attempt as the comparison sees it: reasoning first, then the outputs."""
    if isinstance(result, BaseException):
        return f"(this attempt failed: {type(result).__name__}: {result})"
    lines = [f"{name}: {format_value(value)}" for name, value in result.items()]
    return "\n".join(lines)
