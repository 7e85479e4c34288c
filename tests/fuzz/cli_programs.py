"""A program the CLI fuzz tests name on the command line (path/to/cli_programs.py:Summarize)."""

from __future__ import annotations

from plait import LLMInference, Module


class Summarize(Module):
    """One argument: each row's ``text`` column fills it."""

    def __init__(self) -> None:
        super().__init__()
        self.summary = LLMInference("llm", "Summarize.")

    def forward(self, text: str) -> str:
        return self.summary(text)
