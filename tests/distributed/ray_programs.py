"""Programs the Ray Data tests map (imported by their full path on the workers)."""

from __future__ import annotations

import os

from plait import LLMInference, Module


class Brief(Module):
    """One model call of at most 3 tokens, answered with the id of the worker process."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm", "Echo.", max_tokens=3)

    def forward(self, text: str) -> str:
        return f"{os.getpid()} {self.llm(text)}"
