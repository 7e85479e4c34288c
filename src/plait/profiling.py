"""Profiling: when did each node of a run start and finish, and what did it cost.

Wrap any execution in `profile()` and read the records afterwards::

    with profile() as prof:
        pipeline.run_sync("some text")
    print(prof.table())

The scheduler reports to the active profiler through a context variable, so
profiling costs nothing when it is off.
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass
from typing import Any

from plait import _context

__all__ = ["NodeTiming", "Profiler", "profile"]


@dataclass(frozen=True, slots=True)
class NodeTiming:
    """One node execution."""

    node_id: str
    module_path: str
    input_index: int | None
    start: float
    """Seconds since the profiler started."""
    end: float
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    cache_hit: bool = False
    finish_reason: str | None = None
    """Why the model stopped (``"length"``: cut off by the token limit); None for non-LLM nodes."""

    @property
    def duration(self) -> float:
        return self.end - self.start


class Profiler:
    """Collects a `NodeTiming` for every LLM call or async leaf run while active."""

    def __init__(self) -> None:
        self.records: list[NodeTiming] = []
        self._origin = time.perf_counter()
        self._token: contextvars.Token[Any] | None = None

    def now(self) -> float:
        """Returns seconds since this profiler started."""
        return time.perf_counter() - self._origin

    def record(
        self, node_id: str, module_path: str, index: int | None, start: float, meta: dict[str, Any]
    ) -> None:
        """Adds one finished node (called by the scheduler)."""
        self.records.append(
            NodeTiming(
                node_id=node_id,
                module_path=module_path,
                input_index=index,
                start=start,
                end=self.now(),
                input_tokens=meta.get("input_tokens", 0),
                output_tokens=meta.get("output_tokens", 0),
                cost=meta.get("cost", 0.0),
                cache_hit=bool(meta.get("cached", False)),
                finish_reason=meta.get("finish_reason"),
            )
        )

    @property
    def wall_time(self) -> float:
        """Seconds from the first node's start to the last node's end."""
        if not self.records:
            return 0.0
        return max(r.end for r in self.records) - min(r.start for r in self.records)

    def table(self) -> str:
        """Returns a plain-text table of the records, in start order."""
        rows = [f"{'node':<32} {'start':>8} {'end':>8} {'secs':>7} {'tokens in/out':>14}"]
        for r in sorted(self.records, key=lambda r: r.start):
            label = r.node_id if r.input_index is None else f"{r.node_id}[{r.input_index}]"
            tokens = f"{r.input_tokens}/{r.output_tokens}"
            rows.append(
                f"{label:<32} {r.start:8.2f} {r.end:8.2f} {r.duration:7.2f} {tokens:>14}"
                + ("  (cached)" if r.cache_hit else "")
            )
        total = sum(r.duration for r in self.records)
        rows.append(
            f"{len(self.records)} nodes; wall {self.wall_time:.2f} s; "
            f"sum of node times {total:.2f} s"
        )
        return "\n".join(rows)

    def __enter__(self) -> Profiler:
        self._token = _context.PROFILE.set(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _context.PROFILE.reset(self._token)
            self._token = None


def profile() -> Profiler:
    """Returns a profiler to use as ``with profile() as prof:``."""
    return Profiler()
