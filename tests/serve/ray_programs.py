"""Programs the Ray Serve tests deploy (importable on the replicas, which unpickle them)."""

from __future__ import annotations

import os

from plait import LLMInference, Module


class Process(Module):
    """Answers with the id of the process that runs it: which replica served a request."""

    def forward(self, reply: str) -> int:
        return os.getpid()


class WhoAnswers(Module):
    """One model call on ``text``, and the process (replica) that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.reply = LLMInference("llm", "Echo.")
        self.process = Process()

    def forward(self, text: str) -> dict:
        reply = self.reply(text)
        return {"reply": reply, "pid": self.process(reply)}


class WhoAnswersBriefly(WhoAnswers):
    """`WhoAnswers` whose model call may answer 2 tokens at most (what a budget holds)."""

    def __init__(self) -> None:
        super().__init__()
        self.reply = LLMInference("llm", "Echo.", max_tokens=2)
