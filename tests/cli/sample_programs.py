"""Programs the CLI tests name on the command line (as path/to/sample_programs.py:Name)."""

from __future__ import annotations

from plait import LLMInference, Module, Parameter


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
