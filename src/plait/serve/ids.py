"""Random ids for requests, runs and completions, without a system call for each.

An id is 32 hex digits (128 random bits, as ``uuid4().hex``), unguessable: a paused run's
id is what resumes it when the server checks no API key. They come from a pool of
``os.urandom`` bytes read 4 KiB at a time, so a request costs no ``getrandom`` call of its
own (one per 256 ids); the pool is emptied in a forked child, so two processes never
hand out the same bytes.
"""

from __future__ import annotations

import os
import threading

__all__ = ["random_id"]

_POOL_BYTES = 4096
_ID_BYTES = 16

_pool = b""
_at = 0
_lock = threading.Lock()  # ids are made on the event loop, but also by any thread's error


def random_id() -> str:
    """Returns a new id of 32 hex digits from the pool (refilled from ``os.urandom``)."""
    global _pool, _at
    with _lock:
        if _at + _ID_BYTES > len(_pool):
            _pool, _at = os.urandom(_POOL_BYTES), 0
        start = _at
        _at += _ID_BYTES
        return _pool[start:_at].hex()


def _forget_pool() -> None:
    global _pool, _at
    _pool, _at = b"", 0


os.register_at_fork(after_in_child=_forget_pool)
