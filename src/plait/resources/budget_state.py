"""Budgets shared by processes on any machines, kept in the state store's ``budgets`` table.

A `SharedBudget` (`plait.resources.shared_budget`) over `StateBooks` asks the store for
every hold: a budget's books are one row (its limits, what was spent, what each holder's
requests in flight hold, and the line of holders waiting for room), read and written in one
transaction (`StateStore.update`), and the decision is `Budget.try_hold`'s on those books,
so together the processes never pass the budget. Settles and releases are written
together, once per turn of the event loop (or with the next hold), off the loop on a
PostgreSQL store (its threads), so a request costs about one transaction.

A holder is a process (its host, pid and a random tag: pids mean nothing across machines).
It stamps its holds with the time of each transaction, and while it holds room it renews
that stamp every third of the ``lease`` (30 s). Holds stamped longer ago than a lease belong
to a process that died: the next transaction charges them as spent, at their worst case
(its requests may well have been billed), so the budget stays a hard limit.

The books of a budget are found by its name and limits: processes serving the same
budgets share them, and books go on from what was spent across restarts (``plait state
prune --table budgets`` starts them again); changed limits start new books.

A hold is decided on the event loop: a SQLite store answers inline (bounded by its busy
timeout, 2 s), a PostgreSQL one in a round trip bounded by the store's timeout. A store
that cannot answer refuses the request (the budget cannot be checked), never lets it pass.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from plait import _jsontext as jsontext
from plait.backends.types import Usage
from plait.resources.budget import WAIT, Budget, Claim
from plait.resources.budget_file import books
from plait.resources.shared_budget import SharedBudget
from plait.resources.state import StateStore
from plait.resources.state.on_loop import send

__all__ = ["StateBooks"]

logger = logging.getLogger("plait.resources")

_TABLE = "budgets"

End = tuple[Claim | None, tuple[int, int, float] | None]
"""A settle ``(claim, (calls, tokens, cost))``, a release ``(claim, None)`` or usage spent
without a hold ``(None, (0, tokens, cost))``."""


class StateBooks:
    """The books of budgets in a state store, shared by every process using it (see the
    module doc): the keeper (`plait.resources.shared_budget.Books`) of `SharedBudget`s.

    Args:
        store: the state store (from `open_store`; the caller releases it).
        poll: seconds between looks while a request waits for room.
        lease: seconds after its last stamp at which a holder counts as dead.
        clock: wall-clock seconds (holders on several machines compare them).
    """

    def __init__(
        self,
        store: StateStore,
        *,
        poll: float = 0.02,
        lease: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.poll = poll
        self.lease = lease
        self._clock = clock
        self.holder = f"{socket.gethostname()}-{os.getpid()}-{os.urandom(4).hex()}"
        self._keys: dict[str, str] = {}
        self._ends: dict[str, list[End]] = {}
        self._lock = threading.Lock()
        self._in_flight: Counter[str] = Counter()
        """Holds of this process in flight, per store key (renewed while any)."""
        self._renewer: asyncio.TimerHandle | None = None
        self.transactions = 0
        """Transactions this process made (a hold per request; settles go together)."""
        self.charged = 0
        """Holds of dead holders this process charged as spent."""

    def open(self, name: str, budget: SharedBudget | Budget) -> None:
        """Notes budget ``name``: its books are the store's row of its name and limits."""
        limits = [budget.max_calls, budget.max_tokens, budget.max_cost, budget.unpriced_free]
        self._keys[name] = f"{name} {json.dumps(limits, separators=(',', ':'))}"

    def try_hold(self, name: str, claim: Claim, waiting: int = 0) -> object | str | None:
        """Holds ``claim`` in budget ``name`` if the books of every process leave room now;
        as `plait.resources.budget_file.BudgetFile.try_hold` (the same line of waiting
        holders), or a refusal when the store cannot answer."""
        key = self._keys[name]
        ends = self._take_ends(key)
        verdict: dict[str, Any] = {}

        def decide(old: bytes | None) -> bytes:
            record = self._record(old, key)
            now = self._clock()
            _apply(record, self.holder, ends)
            charged = self._charge_the_dead(record, now)
            outcome = _books(record).try_hold(claim)
            lines = record["waiting"]
            rivals = [since for h, (since, seen) in lines.items()
                      if h != self.holder and seen > now - max(1.0, 5 * self.poll)]  # fmt: skip
            mine = lines.get(self.holder)
            if outcome is None and rivals and (mine is None or min(rivals) < mine[0]):
                outcome = WAIT  # another holder has waited longer: its turn first
            if outcome is WAIT:
                lines[self.holder] = [mine[0] if mine else now, now]
            else:
                if outcome is None:
                    held = record["holds"].setdefault(self.holder, [0, 0, 0.0, now])
                    held[0] += 1
                    held[1] += claim.tokens
                    held[2] += claim.cost or 0.0
                if mine is not None and waiting:  # its turn is over: to the back of the line
                    lines[self.holder] = [now, now]
                elif mine is not None:
                    del lines[self.holder]
            if self.holder in record["holds"]:
                record["holds"][self.holder][3] = now
            verdict.update(outcome=outcome, charged=charged)
            return _dumps(record)

        self.transactions += 1
        try:
            done = self.store.update(_TABLE, key, decide)
        except ValueError as exc:  # books this plait cannot read: never passed unchecked
            self._put_back(key, ends)
            return f"the budget's books in {self.store.url} are unreadable ({exc})"
        if not done:
            self._put_back(key, ends)
            return f"the budget's books in {self.store.url} cannot be reached"
        outcome = verdict["outcome"]
        self.charged += verdict["charged"]
        if outcome is None:
            self._in_flight[key] += 1
            self._renew_soon()
        return outcome

    def settle(self, name: str, claim: Claim, usage: Usage | None) -> None:
        """Replaces a hold by what its request spent (None: failed, nothing billed; the call
        counts either way), written with the next transaction or at the end of this turn
        of the event loop."""
        spent = (
            (0, 0.0) if usage is None else (usage.input_tokens + usage.output_tokens, usage.cost)
        )
        self._end(name, (claim, (1, *spent)))

    def release(self, name: str, claim: Claim) -> None:
        """Gives back the hold of a request that was never sent (written as `settle` is)."""
        self._end(name, (claim, None))

    def add(self, name: str, usage: Usage) -> None:
        """Counts usage spent without a hold (a provider batch job)."""
        self._end(name, (None, (0, usage.input_tokens + usage.output_tokens, usage.cost)))

    def totals(self, name: str) -> Budget:
        """Returns the books of budget ``name`` across every process (with this process's
        settles not written yet)."""
        key = self._keys[name]
        record = self._record(self.store.get(_TABLE, key), key)
        with self._lock:
            _apply(record, self.holder, list(self._ends.get(key, ())))
        return _books(record)

    def flush(self) -> None:
        """Writes the settles and releases not written yet (on a PostgreSQL store, on its
        threads; ones the store did not take are kept for the next try)."""
        with self._lock:
            keys = list(self._ends)
        for key in keys:
            ends = self._take_ends(key)
            if ends:
                self._send(key, ends)

    def _send(self, key: str, ends: list[End]) -> None:
        def write() -> None:
            now = self._clock()

            def change(old: bytes | None) -> bytes:
                record = self._record(old, key)
                _apply(record, self.holder, ends)
                if self.holder in record["holds"]:
                    record["holds"][self.holder][3] = now
                return _dumps(record)

            try:
                done = self.store.update(_TABLE, key, change)
            except ValueError:
                done = False
            if not done:
                self._put_back(key, ends)

        self.transactions += 1
        try:
            send(self.store, write)
        except RuntimeError:  # no running loop: write it now
            write()

    def _end(self, name: str, end: End) -> None:
        key = self._keys[name]
        if end[0] is not None:
            self._in_flight[key] -= 1
            if self._in_flight[key] <= 0:
                del self._in_flight[key]
        with self._lock:
            first = not self._ends
            self._ends.setdefault(key, []).append(end)
        if first:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop: write it now
                self.flush()

    def _take_ends(self, key: str) -> list[End]:
        with self._lock:
            return self._ends.pop(key, [])

    def _put_back(self, key: str, ends: list[End]) -> None:
        if ends:
            with self._lock:
                self._ends.setdefault(key, [])[:0] = ends

    def _renew_soon(self) -> None:
        """While this process holds room, stamps its holds every third of the lease."""
        if self._renewer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._renewer = loop.call_later(self.lease / 3, self._renew)

    def _renew(self) -> None:
        self._renewer = None
        for key in list(self._in_flight):
            self._send(key, [])  # a write that only stamps this holder's holds
        if self._in_flight:
            self._renew_soon()

    def _charge_the_dead(self, record: dict[str, Any], now: float) -> int:
        """Charges the holds of holders unstamped for a lease as spent; returns how many."""
        charged = 0
        for holder, (calls, tokens, cost, seen) in list(record["holds"].items()):
            if holder != self.holder and seen < now - self.lease:
                spent = record["spent"]
                spent[0] += calls
                spent[1] += tokens
                spent[2] += cost
                del record["holds"][holder]
                record["waiting"].pop(holder, None)
                charged += calls
        for holder, (_, seen) in list(record["waiting"].items()):
            if seen < now - self.lease:
                del record["waiting"][holder]
        return charged

    def _record(self, value: bytes | None, key: str) -> dict[str, Any]:
        """Reads a budget's books (data only, checked), or new books of the key's limits.

        Raises:
            ValueError: the row is not books this plait wrote.
        """
        if value is None:
            limits = jsontext.loads(key.partition(" ")[2])
            return {"limits": limits, "spent": [0, 0, 0.0], "holds": {}, "waiting": {}}
        record = jsontext.loads(value)
        if not (
            isinstance(record, dict)
            and _numbers(record.get("spent"), 3)
            and isinstance(record.get("limits"), list)
            and len(record["limits"]) == 4
            and isinstance(record.get("holds"), dict)
            and all(_numbers(h, 4) for h in record["holds"].values())
            and isinstance(record.get("waiting"), dict)
            and all(_numbers(w, 2) for w in record["waiting"].values())
        ):
            raise ValueError(f"budget {key!r} does not hold budget books")
        return record


def _numbers(value: Any, length: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == length
        and all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in value)
    )


def _apply(record: dict[str, Any], holder: str, ends: list[End]) -> None:
    """Applies this holder's settles, releases and usage to the books. A hold that is not
    there any more was charged as a dead holder's: it is not counted twice."""
    spent = record["spent"]
    for claim, used in ends:
        if claim is not None:
            held = record["holds"].get(holder)
            if held is None or held[0] <= 0:
                continue
            held[0] -= 1
            held[1] -= claim.tokens
            held[2] -= claim.cost or 0.0
            if held[0] <= 0:
                del record["holds"][holder]  # no float dust once nothing is in flight
        if used is not None:
            spent[0] += used[0]
            spent[1] += used[1]
            spent[2] += used[2]


def _books(record: dict[str, Any]) -> Budget:
    held = [0, 0, 0.0]
    for calls, tokens, cost, _ in record["holds"].values():
        held[0] += calls
        held[1] += tokens
        held[2] += cost
    max_calls, max_tokens, max_cost, unpriced_free = record["limits"]
    spent = record["spent"]
    return books(
        (max_calls, max_tokens, max_cost, bool(unpriced_free)),
        (int(spent[0]), int(spent[1]), float(spent[2])),
        (int(held[0]), int(held[1]), float(held[2])),
    )


def _dumps(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()
