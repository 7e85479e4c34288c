"""ReflectiveSearch's pool and rounds: its members, their lineage, and where the rounds are.

`_Rounds` is what the search's checkpoint keeps between two steps (the pool, the
children awaiting validation, the random generator's state, the calls spent);
`_check_lineage` and `_Rounds.check` check it before any call. The lineage helpers
find a common ancestor for a merge.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from plait.module import Module
from plait.optimization.search.checkpoint import Reader
from plait.optimization.search.report import Trial


@dataclass
class _Member:
    """A candidate in the pool: its program, its trial, and where it came from."""

    program: Module
    trial: Trial
    parent: int | None = None
    """Pool index of the parent (None for the start)."""
    other_parent: int | None = None
    """The second parent of a merge."""
    changed: set[str] = field(default_factory=set)
    """Parameter names this member changed relative to its parent."""


@dataclass
class _Child:
    """A program proposed (or merged) and waiting for its validation in the next step."""

    program: Module
    params: dict[str, Any]
    note: str
    parent: int
    other_parent: int | None = None
    changed: set[str] = field(default_factory=set)

    def as_json(self) -> dict[str, Any]:
        return {
            "parameters": self.program.state_dict(),
            "params": self.params,
            "note": self.note,
            "parent": self.parent,
            "other_parent": self.other_parent,
            "changed": sorted(self.changed),
        }


@dataclass
class _Rounds:
    """Where a search's rounds are: what its checkpoint keeps between two steps."""

    pool: list[_Member]
    rng: random.Random
    spent: int
    """Calls the search has spent at this step boundary (trial 0's included)."""
    pending: list[_Child] = field(default_factory=list)
    round: int = 0
    turn: int = 0
    """Proposals made so far (which parameter the next one rewrites)."""
    log: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {
            "round": self.round,
            "turn": self.turn,
            "spent": self.spent,
            "rng": [version, list(internal), gauss],
            "log": list(self.log),
            "pool": [
                {
                    "trial": asdict(m.trial),
                    "parent": m.parent,
                    "other_parent": m.other_parent,
                    "changed": sorted(m.changed),
                }
                for m in self.pool
            ],
            "pending": [child.as_json() for child in self.pending],
        }

    @staticmethod
    def check(data: Any, read: Any, where: str) -> None:
        """Checks rounds as a checkpoint holds them (a `checkpoint.Reader` complains)."""
        data = read.mapping(data, where)
        for key in ("round", "turn", "spent"):
            read.integer(read.field(data, key, where), f"{where}.{key}")
        rng = read.field(data, "rng", where)
        try:
            random.Random().setstate((rng[0], tuple(rng[1]), rng[2]))
        except (TypeError, ValueError, IndexError, KeyError, OverflowError):
            read.fail(f"{where}.rng", "is not a random generator's state")
        for i, line in enumerate(read.sequence(read.field(data, "log", where), f"{where}.log")):
            read.text(line, f"{where}.log[{i}]")
        pool = read.sequence(read.field(data, "pool", where), f"{where}.pool")
        if not pool:
            read.fail(f"{where}.pool", "is empty: it always holds trial 0")
        for i, member in enumerate(pool):
            at = f"{where}.pool[{i}]"
            read.trial(read.field(read.mapping(member, at), "trial", at), f"{at}.trial")
            _check_lineage(member, read, at, i)
        for i, child in enumerate(
            read.sequence(read.field(data, "pending", where), f"{where}.pending")
        ):
            at = f"{where}.pending[{i}]"
            read.mapping(read.field(read.mapping(child, at), "parameters", at), f"{at}.parameters")
            read.mapping(read.field(child, "params", at), f"{at}.params")
            read.text(read.field(child, "note", at), f"{at}.note")
            _check_lineage(child, read, at, len(pool))

    @staticmethod
    def restore(data: dict[str, Any], program: Module, start: Trial, read: Reader) -> _Rounds:
        """Rebuilds checked rounds on copies of ``program`` (trial 0 is ``start``; ``read``
        complains, naming the checkpoint)."""

        def copy_with(parameters: dict[str, Any], where: str) -> Module:
            copy = program.copy()
            try:
                copy.load_state_dict(parameters)
            except (KeyError, TypeError, ValueError) as exc:
                text = str(exc.args[0] if exc.args else exc).replace("\n", " ")
                read.fail(where, f"cannot be loaded ({text})")
            return copy

        pool = []
        for i, member in enumerate(data["pool"]):
            where = f"state.rounds.pool[{i}]"
            trial = start if i == 0 else read.trial(member["trial"], f"{where}.trial")
            copy = program.copy() if i == 0 else copy_with(trial.parameters, where)
            changed = set(member.get("changed") or ())
            pool.append(_Member(copy, trial, member["parent"], member["other_parent"], changed))
        pending = [
            _Child(
                copy_with(child["parameters"], f"state.rounds.pending[{i}].parameters"),
                child["params"],
                child["note"],
                child["parent"],
                child["other_parent"],
                set(child.get("changed") or ()),
            )
            for i, child in enumerate(data["pending"])
        ]
        rng = random.Random()
        version, internal, gauss = data["rng"]
        rng.setstate((version, tuple(internal), gauss))
        return _Rounds(
            pool, rng, data["spent"], pending, data["round"], data["turn"], list(data["log"])
        )


def _check_lineage(member: Any, read: Any, where: str, below: int) -> None:
    """Checks a member's parents: earlier members of the pool (so lineages never loop)."""
    for key in ("parent", "other_parent"):
        parent = read.field(member, key, where)
        if parent is not None and (
            isinstance(parent, bool) or not isinstance(parent, int) or not 0 <= parent < below
        ):
            read.fail(f"{where}.{key}", f"is {parent!r:.40}, not an earlier member of the pool")
    changed = read.sequence(member.get("changed", []), f"{where}.changed")
    for i, name in enumerate(changed):
        read.text(name, f"{where}.changed[{i}]")


def _ancestors(pool: list[_Member], index: int) -> list[int]:
    seen: list[int] = []
    frontier = [index]
    while frontier:
        current = frontier.pop()
        member = pool[current]
        for parent in (member.parent, member.other_parent):
            if parent is not None and parent not in seen:
                seen.append(parent)
                frontier.append(parent)
    return seen


def _descends(pool: list[_Member], child: int, ancestor: int) -> bool:
    return ancestor in _ancestors(pool, child)


def _common_ancestor(pool: list[_Member], a: int, b: int) -> int | None:
    mine = set(_ancestors(pool, a))
    for candidate in _ancestors(pool, b):
        if candidate in mine:
            return candidate
    return None
