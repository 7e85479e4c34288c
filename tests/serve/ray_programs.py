"""Programs the Ray Serve tests deploy (importable on the replicas, which unpickle them)."""

from __future__ import annotations

import os
from typing import Any

from plait import LLMInference, Module, ReAct, tool


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


@tool(require_confirmation=True)
def delete_file(path: str) -> str:
    """Deletes a file."""
    return "deleted " + path


class NoteProcess(Module):
    """Notes ``request`` and the process running it in the file ``PLAIT_TEST_RUNS_LOG``: a
    paused run notes the replica that paused it, and again the one that resumed it."""

    def forward(self, request: str) -> str:
        with open(os.environ["PLAIT_TEST_RUNS_LOG"], "a") as log:
            log.write(f"{request} {os.getpid()}\n")
        return request


class ApprovedAgent(Module):
    """A ReAct agent whose one tool waits for a person's yes, noting where it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.note = NoteProcess()
        self.agent = ReAct("request -> reply", tools=[delete_file], max_iters=3)

    def forward(self, request: str) -> Any:
        return self.agent(request=self.note(request))


def approved_agents() -> dict[str, Module]:
    """Builds `ApprovedAgent` on each replica (a ReAct's signature class is not pickled)."""
    return {"agent": ApprovedAgent()}
