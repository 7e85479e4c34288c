"""ChainOfThought on the embedded model: the reasoning comes before the typed answer.

Also shows a learnable parameter at work: changing ``instructions.value`` (what
an optimizer does) changes the next request, while the signature itself stays
the same immutable contract.

    python examples/chain_of_thought.py
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from plait import ChainOfThought, ResourceConfig


def main() -> None:
    cot = ChainOfThought(
        "question -> answer: int",
        # A 135M model can ramble: a length limit in the schema keeps the
        # reasoning short enough to finish within max_tokens.
        reasoning_type=Annotated[str, Field(max_length=120)],
        temperature=0.0,
        max_tokens=64,
    ).bind(ResourceConfig({"llm": {"provider": "local"}}))

    question = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    pred = cot.run_sync(question=question)
    print(f"{question}\n  reasoning: {pred.reasoning}\n  answer:    {pred.answer}")

    cot.instructions.value = "Solve the arithmetic word problem. Show the sum you compute."
    pred = cot.run_sync(question=question)
    print(f"\nWith new instructions:\n  reasoning: {pred.reasoning}\n  answer:    {pred.answer}")
    print(f"\nThe signature is unchanged: {cot.original_signature!r}")

    print("\nTraces:")
    for record in cot.traces():
        system = record.messages[0]["content"].splitlines()[0]
        print(f"  {record.latency:5.2f}s  {record.output_tokens:3} tokens  system: {system[:60]}")


if __name__ == "__main__":
    main()
