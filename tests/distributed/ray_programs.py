"""Programs the Ray Data tests map (imported by their full path on the workers)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from plait import LLMInference, Module


class Brief(Module):
    """One model call of at most 3 tokens, answered with the id of the worker process.

    Given ``meet`` (a folder), a worker's first trace waits there until ``workers``
    workers have come (at most a minute), so that on a busy machine a worker that
    started late still calls before the first has spent a shared limit alone.
    """

    def __init__(self, meet: str | None = None, workers: int = 2) -> None:
        super().__init__()
        self.llm = LLMInference("llm", "Echo.", max_tokens=3)
        self.meet = meet
        self.workers = workers

    def forward(self, text: str) -> str:
        if self.meet is not None:
            _meet(Path(self.meet), self.workers)
        return f"{os.getpid()} {self.llm(text)}"


def _meet(folder: Path, workers: int) -> None:
    (folder / str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(list(folder.iterdir())) < workers and time.monotonic() < deadline:
        time.sleep(0.05)
