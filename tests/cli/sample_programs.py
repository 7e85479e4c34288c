"""Programs the CLI tests name on the command line (as path/to/sample_programs.py:Name)."""

from __future__ import annotations

import dataclasses
import os
import types
from typing import Any

from pydantic import BaseModel

from plait import (
    Image,
    InputField,
    LLMInference,
    Module,
    OutputField,
    Parameter,
    Predict,
    Prediction,
    Signature,
)


class Summarize(Module):
    """One argument: rows fill ``text``."""

    def __init__(self) -> None:
        super().__init__()
        self.summary = LLMInference("llm", "Summarize.")

    def forward(self, text: str) -> str:
        return self.summary(text)


class Answer(Module):
    """Two arguments and a dict output: rows fill ``question`` and ``context``."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = LLMInference("llm", "Answer from the context.")

    def forward(self, question: str, context: str = "none") -> dict:
        return {"answer": self.answer(f"{question} | {context}"), "question_seen": question}


class Task(Module):
    """A learnable system prompt, for `plait train`."""

    def __init__(self) -> None:
        super().__init__()
        self.task = LLMInference(
            "task", system_prompt=Parameter("PLAIN", description="task instructions")
        )

    def forward(self, text: str) -> str:
        return self.task(text)


def build_summarize() -> Summarize:
    return Summarize()


not_a_program = 42


class Clashing(Module):
    """A dict output whose keys are the names of plait's own columns."""

    def __init__(self) -> None:
        super().__init__()
        self.tag = LLMInference("llm", "Tag.")

    def forward(self, text: str) -> dict:
        return {"row": self.tag(text), "error": "none", "score": text}


class NotFinite(Module):
    """An output holding NaN and infinities, which JSON cannot spell."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = LLMInference("llm", "Answer.")

    def forward(self, text: str) -> dict:
        return {"answer": self.answer(text), "ratio": float("nan"), "spread": [float("inf"), 1.5]}


def nan_metric(output: object, target: object) -> float:
    """A metric that returns NaN, which is no score."""
    return float("nan")


# ------------------------------------------------------------------ typed programs
class Order(Signature):
    """Read an order: who ordered, and how many items."""

    text: str = InputField()
    customer: str = OutputField()
    items: int = OutputField()


def order_reader() -> Predict:
    """The README's pattern: a `Predict` of a Signature, built by a function."""
    return Predict(Order, alias="llm")


class Describe(Signature):
    """Describe the picture."""

    picture: Image = InputField()
    shape: str = OutputField()


describe = Predict(Describe, alias="llm")
"""A `Predict` with an image input: a data file gives it as a data: URI."""

quote = Predict("product, quantity: int -> total: float", alias="llm")
"""A `Predict` instance whose signature has two inputs."""


def customer_matches(output: Prediction, target: str) -> bool:
    """Scores a read order by its customer."""
    return output.customer == target


@dataclasses.dataclass
class Receipt:
    customer: str
    items: int


class ReceiptModel(BaseModel):
    customer: str
    items: int


class Shapes(Module):
    """Returns one typed output per row, of the kind its ``kind`` column names."""

    async def forward(self, text: str, kind: str) -> Any:
        customer, items = text.split()[0], len(text.split())
        if kind == "dataclass":
            return Receipt(customer, items)
        if kind == "model":
            return ReceiptModel(customer=customer, items=items)
        if kind == "prediction":
            return Prediction(customer=customer, items=items)
        return types.MappingProxyType({"customer": customer, "items": items})


class CountsItsTraces(Module):
    """Appends a line to the file named by PLAIT_TEST_TRACE_LOG each time it is traced.

    Tracing changes a plain setting, so every lookup in the module-wide graph
    cache misses: the log counts the lookups a run makes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.summary = LLMInference("llm", "Summarize.")
        self.traced = 0

    def forward(self, text: str) -> str:
        self.traced += 1
        with open(os.environ["PLAIT_TEST_TRACE_LOG"], "a") as log:
            log.write("traced\n")
        return self.summary(text)
