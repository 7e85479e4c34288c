"""Instruction proposals: the optimizer model asked for new instructions of one step.

RandomSearch's proposals (`propose_instruction`), one structured call each, checked by
`check_update` before a candidate may carry them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, Field

from plait.backends.types import Message, Request, Response, SamplingOptions
from plait.errors import BudgetExceededError, StructuredOutputError
from plait.execution.structured import ask_structured, output_type_for
from plait.module import Module
from plait.optimization.events import learning_step
from plait.optimization.search.demos import (
    Example,
)
from plait.optimization.training.updates import as_text, check_update
from plait.parameter import Parameter
from plait.resources import ResourceManager
from plait.resources.usage import active_budgets

__all__ = ["propose_instruction"]


class InstructionProposal(BaseModel):
    """What an instruction-proposal call returns."""

    rationale: str = Field(max_length=300)
    instruction: str = Field(max_length=600)


async def propose_instruction(
    module: Module,
    train: Sequence[Example],
    resources: Any,
    alias: str = "optimizer",
    *,
    seed: int = 0,
    shown: int = 4,
) -> str | None:
    """Asks the optimizer model for new instructions of one step; None when none is usable.

    The model sees the current instructions and a few training examples
    (input and expected output) and answers ``{"rationale", "instruction"}``
    through `ask_structured`. A proposal that is empty, the same, too long,
    or pastes an example is refused (`check_update` at conservatism 0).
    Callbacks hear it as one proposal, the model's call inside it.
    """
    parameter: Parameter = module.instructions  # type: ignore[attr-defined]
    told = {"parameter": parameter.path, "method": "instruction proposal", "alias": alias}
    with learning_step("proposal", module, told) as step:
        proposed = await _proposed_instruction(module, train, resources, alias, seed, shown)
        step.outputs = {"accepted": proposed is not None, "proposed": proposed}
    return proposed


async def _proposed_instruction(
    module: Module, train: Sequence[Example], resources: Any, alias: str, seed: int, shown: int
) -> str | None:
    """The body of `propose_instruction`."""
    manager = ResourceManager.shared(resources)
    current = str(module.instructions.value)  # type: ignore[attr-defined]
    rng = random.Random(seed)
    examples = rng.sample(list(train), min(shown, len(train)))
    lines = "\n".join(
        f"- input: {as_text(x)[:300]!s}\n  expected output: {as_text(t)[:100]!s}"
        for x, t in examples
    )
    prompt = (
        "Write better instructions for one step of an LLM program.\n\n"
        f"Current instructions:\n<<<\n{current}\n>>>\n\n"
        f"Examples of the step's input and the output it should give:\n{lines}\n\n"
        "The instructions must say what to do with any input like these and what to answer. "
        "Do not copy the examples. Reply with JSON: a short rationale, then the instruction."
    )
    output = output_type_for(InstructionProposal)
    request = Request(
        messages=(
            Message("system", "You write instructions for LLM programs."),
            Message("user", prompt),
        ),
        options=SamplingOptions(temperature=0.9, max_tokens=400, seed=seed),
        response_schema=output.schema,
    )
    sources = [f"{as_text(x)} {as_text(t)}" for x, t in examples]

    def parse(response: Response) -> str:
        proposal = output.read(response)
        value, reason = check_update(current, proposal.instruction, 0.0, sources=sources)
        if reason is not None:
            raise StructuredOutputError(reason, raw=response.text, target=output.name)
        return value

    def complete(request: Request, accept: Callable[[Response], bool]) -> Any:
        return manager.complete(alias, request, accept=accept)

    try:
        reply = await ask_structured(
            complete,
            request,
            parse,
            expected=output.expected,
            label=f"RandomSearch (alias {alias!r})",
        )
    except StructuredOutputError:
        return None
    except BudgetExceededError:
        if not any(budget.stopped for budget in active_budgets()):
            raise  # an endpoint's own budget: the configuration's limit, not the search's
        return None  # the search's budget is spent: no proposal, and the search winds down
    return reply.value
