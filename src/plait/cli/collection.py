"""The garbage collector's pace while a command runs: young collections far apart.

A run keeps a hundred or so items in flight, each with its coroutines, futures,
requests and replies, and almost all of it is freed by reference counting when
the item ends. At Python's default pace (a young collection every 700 new
container objects) the collector still walks the live part of it every few
rows, and those walks took 6–10 % of ``plait run``'s CPU
(``benchmarks/cli_bench.py``). Collecting every `YOUNG_OBJECTS` new objects
costs a tenth of that; cyclic garbage still goes, a little later, and memory
stays bounded (by ``--chunk-size`` as before, plus at most that many objects).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["YOUNG_OBJECTS", "fewer_collections"]

YOUNG_OBJECTS = 20_000
"""New container objects between two young collections while a command runs."""


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Inside the block, young collections come every `YOUNG_OBJECTS` new objects (the
    older generations keep their pace; a threshold of 0, collection off, stays off); the
    thresholds are restored after it."""
    young, middle, old = gc.get_threshold()
    if young:
        gc.set_threshold(max(young, YOUNG_OBJECTS), middle, old)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, old)
