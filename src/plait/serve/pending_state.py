"""Paused runs in the state store, so every process and replica sharing it resumes any of them.

`StatePendingStore` is the `PendingStore` of a server given a state store
(``plait.serve.app(..., state=URL)``, ``plait serve --state URL``, a resources file's
``[state] url``): the same paused runs as `SQLitePendingStore`'s file, kept in the store's
``pauses`` table instead, so two ``plait serve`` processes on two machines, or two Ray Serve
replicas, share them. Its keys:

- ``run/ID``: a waiting run (its program, owner and time as a JSON line, then its inputs and
  its sealed pause as JSON text, each on a line of its own: JSON text holds no raw newline).
  Taking it replaces it by a note of why it is gone and whose it was (``gone`` and a JSON
  line), in one transaction of the store (`StateStore.update`), so a run is resumed exactly
  once: of two replicas resuming it at once one gets it, and the other reads the note and
  answers that it was resumed (409). A note is believed for a ttl after it was written.
- ``ledger``: the waiting runs' ids with their owner and time, which a pause reads and
  writes in one transaction (`StateStore.update`), so ``max_runs`` and ``max_per_owner`` are
  counted across every process. A ledger row left behind by a process that died between
  its two writes expires with the run's ttl.
- ``used/ID``: the approval ledger (`use`), so an approval used on one replica is refused on
  every other.

The size limit, the room check and the reading of a stored run are `plait.serve.pending`'s, so
the two homes of a paused run keep one set of rules. A store that does not answer refuses a
new pause (`PendingStoreFull`: retry later) rather than lose it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from plait import _jsontext as jsontext
from plait.resources.state import (
    StateError,
    StateStore,
    StateUnavailable,
    StateURL,
    open_store,
    release_store,
)
from plait.resources.state.on_loop import call
from plait.serve.pending import (
    DEFAULT_MAX_PER_OWNER,
    DEFAULT_MAX_RUNS,
    DEFAULT_MAX_STATE_BYTES,
    DEFAULT_TTL,
    GoneRun,
    PendingRun,
    PendingStoreFull,
    PendingStoreUnavailable,
    _Bounds,
    _check_room,
    _check_size,
    read_run,
)

__all__ = ["StatePendingStore"]

logger = logging.getLogger("plait.serve")

_TABLE = "pauses"
_LEDGER = "ledger"
_GONE = b"gone\n"
"""What starts the value of a run that was resumed or expired (a note of why, and whose)."""

Ledger = dict[str, list[Any]]
"""Waiting run id -> ``[owner, created]``."""


class StatePendingStore:
    """Paused runs in a state store's ``pauses`` table, shared by every process using it.

    Args:
        state: the state store's URL (or a store from `open_store`, which stays the caller's).
        ttl: seconds a run waits before it expires; why a run is gone is remembered as long.
        max_state_bytes: largest state of one run.
        max_runs: runs kept at once, of every owner and process; a pause past it is refused.
        max_per_owner: runs of one API key kept at once.

    Raises:
        StateError: the store cannot be reached at start, or is newer than this plait.
    """

    def __init__(
        self,
        state: str | StateURL | StateStore,
        *,
        ttl: float = DEFAULT_TTL,
        max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
        max_runs: int = DEFAULT_MAX_RUNS,
        max_per_owner: int = DEFAULT_MAX_PER_OWNER,
    ) -> None:
        self._bounds = _Bounds(ttl, max_state_bytes, max_runs, max_per_owner)
        self.ttl = ttl
        self.max_state_bytes = max_state_bytes
        self.max_runs = max_runs
        self.max_per_owner = max_per_owner
        self._owned = isinstance(state, (str, StateURL))
        self._late: set[asyncio.Task[None]] = set()
        """Runs being put back after a take that committed too late (see `_take_row`)."""
        self.store: StateStore = open_store(state) if isinstance(state, (str, StateURL)) else state

    # -- the store ------------------------------------------------------------------------

    async def put(self, run: PendingRun) -> None:
        inputs, pause = _check_size(run, self.max_state_bytes)
        head = json.dumps({"program": run.program, "owner": run.owner, "created": run.created})
        value = "\n".join((head, inputs, pause)).encode()
        expired: list[str] = []

        def count_in(old: bytes | None) -> bytes:
            ledger = self._ledger(old)
            limit = time.time() - self.ttl
            expired[:] = [run_id for run_id, (_, created) in ledger.items() if created < limit]
            for run_id in expired:
                del ledger[run_id]
            if run.run_id not in ledger:  # a run kept again takes its own place
                of_owner = sum(owner == run.owner for owner, _ in ledger.values())
                _check_room(len(ledger), of_owner, run.owner, self._bounds)
            ledger[run.run_id] = [run.owner, run.created]
            return _dumps(ledger)

        if not await self._call(self.store.update, _TABLE, _LEDGER, count_in, default=False):
            raise self._unavailable()
        if not await self._call(self.store.put, _TABLE, f"run/{run.run_id}", value, default=False):
            await self._unlist(run.run_id)
            raise self._unavailable()
        for run_id in expired:  # their rows are marked expired too
            await self.take(run_id)

    async def get(self, run_id: str) -> PendingRun | None:
        value = await self._value(run_id)
        if value is None or value.startswith(_GONE):
            return None
        run = self._read(run_id, value)
        if self._expired(run):
            await self.take(run_id)  # marked expired
            return None
        return run

    async def take(self, run_id: str) -> PendingRun | None:
        """Replaces the run by a note of why it is gone, in one transaction: of processes
        taking it at once one gets the run, and the others then read the note (409), never
        a moment with neither (404)."""
        taken: list[PendingRun] = []

        def mark(old: bytes | None) -> bytes | None:
            taken.clear()
            if old is None or old.startswith(_GONE):
                return old
            run = self._read(run_id, old)  # one this store refuses stays (rolled back)
            taken.append(run)
            why = "expired" if self._expired(run) else "resumed"
            return _GONE + json.dumps({"why": why, "owner": run.owner, "at": time.time()}).encode()

        if not await self._take_row(f"run/{run_id}", mark, taken):
            raise self._down()
        if not taken:
            return None
        await self._unlist(run_id)
        return None if self._expired(taken[0]) else taken[0]

    async def restore(self, run: PendingRun) -> None:
        inputs, pause = run.state_text()
        head = json.dumps({"program": run.program, "owner": run.owner, "created": run.created})
        value = "\n".join((head, inputs, pause)).encode()

        def relist(old: bytes | None) -> bytes:
            ledger = self._ledger(old)
            ledger[run.run_id] = [run.owner, run.created]
            return _dumps(ledger)

        await self._call(self.store.update, _TABLE, _LEDGER, relist, default=False)
        if not await self._call(self.store.put, _TABLE, f"run/{run.run_id}", value, default=False):
            raise self._unavailable()

    async def gone(self, run_id: str) -> GoneRun | None:
        value = await self._value(run_id)
        if value is None or not value.startswith(_GONE):
            return None
        try:
            note = jsontext.loads(value[len(_GONE) :].decode())
        except (ValueError, UnicodeDecodeError):
            note = None
        if not isinstance(note, dict) or note.get("why") not in ("resumed", "expired"):
            return None
        at, owner = note.get("at"), note.get("owner")
        if not isinstance(at, (int, float)) or time.time() - at > self.ttl:
            return None
        return GoneRun(note["why"], owner if isinstance(owner, str) else None)

    async def aclose(self) -> None:
        await asyncio.gather(*self._late, return_exceptions=True)
        if self._owned:
            release_store(self.store)

    # -- the approval ledger --------------------------------------------------------------

    def use(self, approval_id: str) -> bool:
        """Records an approval as used; False when it was used before (by any process
        sharing the store), or the store cannot say it was not (refused, never run twice).
        Called on the event loop: a PostgreSQL store waits at most its timeout."""
        return self.store.add(_TABLE, f"used/{approval_id}", str(time.time()).encode())

    def is_used(self, approval_id: str) -> bool:
        """Whether an approval was used (by any process), so its run may not be restored."""
        return self.store.get(_TABLE, f"used/{approval_id}") is not None

    # -- helpers --------------------------------------------------------------------------

    async def _call(self, method: Any, *args: Any, default: Any) -> Any:
        return await call(self.store, method, *args, default=default)

    async def _take_row(
        self, key: str, mark: Callable[[bytes | None], bytes | None], taken: list[PendingRun]
    ) -> bool:
        """Runs `take`'s transaction; False when the store did not answer in its timeout.

        A transaction the caller stopped waiting for may still commit later (a server
        that froze and went on): the run it took is then put back, so a run whose
        resume was answered "unavailable" is never lost to a take nobody saw.
        """
        store = self.store
        if not store.blocking:
            return store.update(_TABLE, key, mark)
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(
                getattr(store, "executor", None), store.update, _TABLE, key, mark
            )
        except RuntimeError:  # the store's threads are closed
            return False
        try:
            return await asyncio.wait_for(asyncio.shield(future), getattr(store, "timeout", None))
        except TimeoutError:

            def late(done: asyncio.Future[bool]) -> None:
                if done.cancelled() or done.exception() is not None or not done.result():
                    return
                if taken:
                    logger.warning("%s: a run taken after its resume gave up is put back", key)
                    self._late.add(loop.create_task(self.restore(taken[0])))
                    self._late = {task for task in self._late if not task.done()}

            future.add_done_callback(late)
            return False

    async def _value(self, run_id: str) -> bytes | None:
        """Returns what ``run/ID`` holds, or None when nothing.

        Raises:
            PendingStoreUnavailable: the store does not answer (a miss would tell a client
                that its waiting run is unknown).
        """
        key = f"run/{run_id}"
        try:  # the least key under a prefix is the prefix itself: one row, or a failure
            page = await self._call(partial(self.store.scan, limit=1), _TABLE, key, default=None)
        except StateUnavailable:
            page = None
        if page is None:
            raise self._down()
        return page[0][1] if page and page[0][0] == key else None

    def _down(self) -> PendingStoreUnavailable:
        return PendingStoreUnavailable(
            f"the state store {self.store.url} keeping paused runs does not answer now"
        )

    async def _unlist(self, run_id: str) -> None:
        def unlist(old: bytes | None) -> bytes | None:
            ledger = self._ledger(old)
            if ledger.pop(run_id, None) is None:
                return old  # not listed: nothing to write
            return _dumps(ledger)

        await self._call(self.store.update, _TABLE, _LEDGER, unlist, default=False)

    def _expired(self, run: PendingRun) -> bool:
        return time.time() - run.created > self.ttl

    def _read(self, run_id: str, value: bytes) -> PendingRun:
        """Reads a stored run by `read_run`'s rules (sizes measured before parsing).

        Raises:
            StateError: naming the store and the run, and what is wrong.
        """
        parts = value.split(b"\n")
        try:
            if len(parts) != 3:
                raise ValueError(f"the run {run_id} is not a paused run plait wrote")
            head = jsontext.loads(parts[0].decode())
            if not isinstance(head, dict):
                raise ValueError(f"the run {run_id} is not a paused run plait wrote")
            size = len(parts[1]) + len(parts[2])
            owner, created = head.get("owner"), head.get("created")
            return read_run(
                run_id,
                str(head.get("program")),
                owner if isinstance(owner, str) else None,
                float(created) if isinstance(created, (int, float)) else 0.0,
                size,
                parts[1].decode() if size <= self.max_state_bytes else None,
                parts[2].decode() if size <= self.max_state_bytes else None,
                limit=self.max_state_bytes,
            )
        except (ValueError, UnicodeDecodeError) as exc:
            raise StateError(f"state store {self.store.url}, paused runs: {exc}") from None

    def _ledger(self, value: bytes | None) -> Ledger:
        """Reads the ledger of waiting runs; one that is not plait's reads as empty (so
        the bounds restart from the runs paused next, rather than refuse them all)."""
        if value is None:
            return {}
        try:
            ledger = jsontext.loads(value.decode())
        except (ValueError, UnicodeDecodeError):
            ledger = None
        if not isinstance(ledger, dict):
            logger.warning(
                "state store %s: the ledger of paused runs is unreadable", self.store.url
            )
            return {}
        return {
            str(run_id): [entry[0], float(entry[1])]
            for run_id, entry in ledger.items()
            if isinstance(entry, list)
            and len(entry) == 2
            and (entry[0] is None or isinstance(entry[0], str))
            and isinstance(entry[1], (int, float))
        }

    def _unavailable(self) -> PendingStoreFull:
        return PendingStoreFull(
            f"the state store {self.store.url} does not answer, so this paused run cannot be "
            "kept; retry later",
            per_owner=False,
        )

    def __len__(self) -> int:
        """The runs waiting, as the ledger counts them."""
        return len(self._ledger(self.store.get(_TABLE, _LEDGER)))


def _dumps(ledger: Ledger) -> bytes:
    return json.dumps(ledger, separators=(",", ":")).encode()
