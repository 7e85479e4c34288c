"""Trying a write again until the store takes it: the pause between tries, and what is said.

A run checkpoint's rows (`plait.execution.checkpoint_store`) and a search's or a
Trainer's document (`plait.optimization.checkpoint_place`) are written off the work's
path, and a write the store did not take (down, restarting, too slow) is kept and tried
again until it does, so a database restart loses nothing. `Backoff` is that rhythm,
for both: a pause that doubles from 0.2 s up to `RETRY_AFTER`, one warning when the
store first refuses, and one when it takes a write again, rather than a line per try.
"""

from __future__ import annotations

import asyncio
import logging

__all__ = ["RETRY_AFTER", "Backoff"]

RETRY_AFTER = 2.0
"""Longest pause between two tries of a write the store did not take."""


class Backoff:
    """The tries of one writer (its own logger; ``where`` names it in the log lines)."""

    def __init__(self, logger: logging.Logger, where: str) -> None:
        self.logger = logger
        self.where = where
        self.failures = 0
        """Tries the store did not take since it last took one."""

    def took(self, what: str) -> None:
        """The store took a write; says so when it had refused the tries before."""
        if self.failures:
            self.logger.warning("%s: the store takes %s again", self.where, what)
        self.failures = 0

    async def failed(self, first: str, *args: object) -> None:
        """The store did not take a write: warns the first time (``first`` and its
        ``args``, a log message after ``where``), then waits before the next try."""
        self.failures += 1
        if self.failures == 1:
            self.logger.warning("%s: " + first, self.where, *args)
        await asyncio.sleep(min(0.1 * 2**self.failures, RETRY_AFTER))
