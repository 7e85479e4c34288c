"""A progress bar for batches: items done and failed, rate, ETA, and who is waiting.

Shown on stderr when it is a terminal (or when asked for with
``progress=True``); otherwise this is a no-op and rich is never imported.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

__all__ = ["BatchProgress", "progress_bar"]

_REFRESH_SECONDS = 0.25


def progress_bar(label: str, texts: Sequence[str], trailing: Sequence[str] = ()) -> Any:
    """Returns plait's rich progress layout on stderr (imports rich only when called).

    ``label | bar | done/total | texts… | elapsed | remaining | trailing…``;
    ``texts`` and ``trailing`` are rich column templates such as
    ``"{task.fields[failed]} failed"``. Stderr, because stdout belongs to the
    program's output.
    """
    # import time: rich loads only for a progress bar
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        *(TextColumn(text) for text in texts),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        *(TextColumn(text) for text in trailing),
        console=Console(stderr=True),
    )


class BatchProgress:
    """Context manager that shows batch progress; `advance` once per finished item."""

    def __init__(self, total: int, enabled: bool | None, manager: Any = None) -> None:
        if enabled is None:
            enabled = total > 1 and sys.stderr.isatty()
        self.total = total
        self.enabled = enabled
        self.manager = manager
        self.done = 0
        self.failed = 0
        self._progress: Any = None
        self._task: Any = None
        self._last_refresh = 0.0

    def __enter__(self) -> BatchProgress:
        if self.enabled:
            self._progress = progress_bar(
                "batch",
                ["{task.fields[failed]} failed", "{task.fields[rate]}"],
                trailing=["{task.fields[waiting]}"],
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "batch", total=self.total, failed=0, rate="", waiting=""
            )
            self._started = time.monotonic()
        return self

    def advance(self, ok: bool) -> None:
        """Counts one finished item."""
        self.done += 1
        if not ok:
            self.failed += 1
        if self._progress is None:
            return
        now = time.monotonic()
        if now - self._last_refresh < _REFRESH_SECONDS and self.done < self.total:
            self._progress.update(self._task, completed=self.done)
            return
        self._last_refresh = now
        rate = self.done / max(now - self._started, 1e-9)
        self._progress.update(
            self._task,
            completed=self.done,
            failed=self.failed,
            rate=f"{rate:.1f} items/s",
            waiting=self._waiting_text(),
        )

    def _waiting_text(self) -> str:
        """Returns queue depth, retries and pauses of the endpoints, when any are non-zero."""
        if self.manager is None:
            return ""
        parts = []
        for name, stats in self.manager.stats().items():
            bits = []
            if stats.queue_depth:
                bits.append(f"{stats.queue_depth} queued")
            if stats.retries:
                bits.append(f"{stats.retries} retries")
            if stats.paused_for > 0:
                bits.append(f"paused {stats.paused_for:.0f}s")
            if bits:
                parts.append(f"{name}: " + ", ".join(bits))
        return "; ".join(parts)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, failed=self.failed)
            self._progress.stop()
