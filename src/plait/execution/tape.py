"""Tapes: what a training-mode forward pass recorded, kept until backward uses it.

In training mode every executed graph leaves a `Tape`: the graph, each
node's result, and the calls made inside ``async def forward`` nodes. The
output Value carries the tape's id in ``meta["_tape_ids"]``; backward looks
the tape up, walks it in reverse, and releases it. A tape is also released
when its output Value is garbage collected, so forgetting to call backward
(or `detach_tape`) cannot leak memory over a long run.
"""

from __future__ import annotations

import contextvars
import itertools
import weakref
from dataclasses import dataclass
from typing import Any

from plait.tracing.graph import InferenceGraph
from plait.values import Value

__all__ = ["INNER_CALLS", "Tape", "attach_tape", "get_tape", "live_tapes", "release_tape"]

INNER_CALLS: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "plait_inner_calls", default=None
)
"""While an ``async def forward`` node runs in training mode: where its inner calls are noted."""


@dataclass(eq=False)
class Tape:
    """The record of one training-mode execution of a graph."""

    id: str
    graph: InferenceGraph
    results: dict[str, Value]
    """Each node's result Value, by node id; an ``async def forward`` node's result
    lists the calls it made in ``meta["_inner_calls"]``."""
    parameters: dict[str, Any]
    """``param:<name>`` → Parameter, for the graph's root module."""
    index: int | None = None
    """Batch index of the input, if any."""
    manager: Any = None
    """The ResourceManager the forward pass ran on (backward's default resources)."""


_tapes: dict[str, Tape] = {}
_ids = itertools.count(1)


def attach_tape(output: Value, tape: Tape) -> None:
    """Registers ``tape`` and notes its id on ``output`` (released with the Value)."""
    _tapes[tape.id] = tape
    output.meta.setdefault("_tape_ids", []).append(tape.id)
    weakref.finalize(output, _tapes.pop, tape.id, None)


def new_tape_id() -> str:
    """Returns a fresh, process-unique tape id."""
    return f"tape-{next(_ids)}"


def get_tape(tape_id: str) -> Tape:
    """Returns a live tape.

    Raises:
        KeyError: the tape was released (after a backward, or by `detach_tape`).
    """
    tape = _tapes.get(tape_id)
    if tape is None:
        raise KeyError(
            f"tape {tape_id!r} is gone: it was released by a previous backward() or "
            "detach_tape(); run the forward pass again (pass retain_tape=True to backward "
            "to keep a tape for a second pass)"
        )
    return tape


def release_tape(tape_id: str) -> None:
    """Forgets a tape (no error if it is already gone)."""
    _tapes.pop(tape_id, None)


def live_tapes() -> int:
    """Returns how many tapes are held right now (for leak checks)."""
    return len(_tapes)
