"""Runs that wait for a person's approval, kept until someone answers them.

A run that pauses for confirmation is answered with its pending calls and a run id; what is
needed to resume it later (the program's name, the request's inputs and the sealed pause) is a
`PendingRun` put in the server's `PendingStore`. The store is an interface: the server uses
`MemoryPendingStore` unless it is given another (a store that survives restarts implements the
same four methods). The pause itself is sealed (`plait.confirmation`), so a store holds data a
client could not forge; ``take`` hands a run out once, so a pause is resumed at most once.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["MemoryPendingStore", "PendingRun", "PendingStore"]

logger = logging.getLogger("plait.serve")


@dataclass(frozen=True)
class PendingRun:
    """A paused run, as stored until it is resumed.

    Attributes:
        run_id: the id the client was given.
        program: the name the program is served under.
        inputs: the request's inputs (JSON data, as validated), which a resume must repeat.
        pause: the sealed pause (`ConfirmationRequired.to_dict`).
        created: when it paused (``time.time()``).
    """

    run_id: str
    program: str
    inputs: dict[str, Any]
    pause: dict[str, Any]
    created: float = field(default_factory=time.time)


class PendingStore(Protocol):
    """Where paused runs wait. Implement it to keep them elsewhere (a database, a file)."""

    async def put(self, run: PendingRun) -> None:
        """Keeps ``run`` under its ``run_id``."""

    async def get(self, run_id: str) -> PendingRun | None:
        """Returns the run, or None when there is none (never paused, or already taken)."""

    async def take(self, run_id: str) -> PendingRun | None:
        """Removes and returns the run; of concurrent callers, exactly one gets it."""

    async def aclose(self) -> None:
        """Releases what the store holds open (called when the server stops)."""


class MemoryPendingStore:
    """Paused runs in this process's memory: lost when it stops, bounded in number.

    Args:
        max_runs: runs kept; past it the oldest is forgotten (and logged), so a flood of
            paused runs no one answers cannot grow the server without bound.
    """

    def __init__(self, max_runs: int = 10_000) -> None:
        if max_runs < 1:
            raise ValueError(f"max_runs must be at least 1, got {max_runs}")
        self.max_runs = max_runs
        self._runs: OrderedDict[str, PendingRun] = OrderedDict()

    async def put(self, run: PendingRun) -> None:
        self._runs[run.run_id] = run
        while len(self._runs) > self.max_runs:
            forgotten, _ = self._runs.popitem(last=False)
            logger.warning(
                "pending run %s forgotten: more than %d runs wait for approval",
                forgotten,
                self.max_runs,
            )

    async def get(self, run_id: str) -> PendingRun | None:
        return self._runs.get(run_id)

    async def take(self, run_id: str) -> PendingRun | None:
        return self._runs.pop(run_id, None)

    async def aclose(self) -> None:
        self._runs.clear()

    def __len__(self) -> int:
        return len(self._runs)
