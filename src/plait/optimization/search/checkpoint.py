"""A program search's checkpoint: one JSON document of what it finished, so a rerun resumes.

Every `ProgramSearch` takes ``checkpoint=`` (a file path) or ``state=`` (a
state store: the document is then one key of its table ``learning``, see
`plait.optimization.checkpoint_place`). What it finishes is written there at
once, a file atomically through `plait._files` (never through a link): each
trial (trial 0 included; of one the budget cut short, the validation
examples it evaluated), and the steps a search keeps of its own (a bootstrap
pass, as far as it went; instruction proposals; ReflectiveSearch's
pool and rounds). A rerun with the same file takes those instead of sending
their calls again and does the rest, so a search its budget stopped ends,
when rerun with a larger budget, where a run without a budget ends. A
proposal or a ReflectiveSearch round the budget cut short is not kept: it
runs again in full.

The file says what it is for: the search's class, and digests of the program
as it was, the training and validation sets and the search's settings. A file
of other work is refused with a `ValueError` naming what differs, before any
call; a file that is not what plait writes (truncated, edited, another
format) is a `CheckpointError` naming the file and the line or field.

The program given to a rerun may also be the one the search left (it applies
the best it found, even when its budget stopped it): the file notes that
program's digest, and the rerun takes it back to trial 0's parameters and
settings before searching again.

Format ``plait.search/1``::

    {"format": "plait.search/1", "search": "BootstrapFewShot",
     "of": {"program": …, "trainset": …, "valset": …, "settings": …},
     "left": digest of the program as the search left it,
     "trials": [Trial fields …],
     "state": {"steps": {"bootstrap": {"value": …, "calls": 8}}, "rounds": …}}
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from typing import Any, NoReturn

from plait.execution.checkpoint_codec import CheckpointError
from plait.module import Module
from plait.optimization.checkpoint_place import CheckpointPlace
from plait.optimization.search.report import Trial

FORMAT = "plait.search/1"
REMEDY = "delete it to start over, or use another checkpoint file"

_DIFFERENT = {
    "program": "another program",
    "trainset": "another trainset",
    "valset": "another valset",
    "settings": "other settings",
}
"""How a refusal names each part of the work a checkpoint is for."""


def digest(value: Any) -> str:
    """Returns a short digest of JSON-like data (the same data, the same digest)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def program_digest(program: Module) -> str:
    """Returns a digest of a program as it is: its class, parameter values and plain settings."""
    settings = {
        f"{path}.{name}": value
        for path, module in program.named_modules()
        for name, value in vars(module).items()
        if not name.startswith("_") and isinstance(value, str | int | float | bool | type(None))
    }
    return digest([type(program).__name__, program.state_dict(), settings])


def trial_key(parameters: dict[str, Any], settings: dict[str, Any]) -> str:
    """Returns what identifies a candidate: its parameter values and settings."""
    return digest([parameters, settings])


class Reader:
    """Checks the parts of a checkpoint file; every complaint names the file and the field."""

    def __init__(self, name: str, examples: int | None = None, remedy: str = REMEDY) -> None:
        self.name = name
        """The checkpoint in messages: its file, or its state store and key."""
        self.examples = examples
        self.remedy = remedy
        """How many validation examples a trial's scores cover (None: not checked)."""

    def fail(self, where: str, what: str) -> NoReturn:
        raise CheckpointError(f"{self.name}: {where} {what}; {self.remedy}")

    def mapping(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, f"is {type(value).__name__}, not an object")
        return value

    def sequence(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            self.fail(where, f"is {type(value).__name__}, not a list")
        return value

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(where, f"is {value!r:.40}, not a number")
        return float(value)

    def integer(self, value: Any, where: str, *, optional: bool = False) -> int | None:
        if optional and value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.fail(where, f"is {value!r:.40}, not a count")
        return value

    def text(self, value: Any, where: str, *, optional: bool = False) -> str | None:
        if optional and value is None:
            return None
        if not isinstance(value, str):
            self.fail(where, f"is {value!r:.40}, not text")
        return value

    def field(self, data: dict[str, Any], key: str, where: str) -> Any:
        if key not in data:
            self.fail(f"{where}.{key}", "is missing")
        return data[key]

    def numbers(self, value: Any, where: str) -> list[float]:
        return [self.number(x, f"{where}[{i}]") for i, x in enumerate(self.sequence(value, where))]

    def counts(self, value: Any, where: str) -> dict[str, int | None]:
        return {k: self.integer(n, f"{where}.{k}") for k, n in self.mapping(value, where).items()}

    def positions(self, value: Any, where: str) -> list[int]:
        items = self.sequence(value, where)
        return [self.integer(x, f"{where}[{i}]") or 0 for i, x in enumerate(items)]

    def trial_number(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(where, f"is {value!r:.40}, not a trial number")
        return value

    def trial(self, value: Any, where: str) -> Trial:
        """Returns a `Trial` from its fields as plait wrote them (every field is checked)."""
        data = self.mapping(value, where)
        checks: dict[str, Callable[[Any, str], Any]] = {
            "number": self.trial_number,
            "params": self.mapping,
            "score": self.number,
            "selection": self.number,
            "calls": self.integer,
            "cost": self.number,
            "seconds": self.number,
            "note": self.text,
            "parameters": self.mapping,
            "settings": self.mapping,
            "scores": self.numbers,
            "answers": self.counts,
            "unevaluated": self.integer,
            "undone": self.positions,
        }
        unknown = sorted(set(data) - {f.name for f in fields(Trial)})
        if unknown:
            self.fail(f"{where}.{unknown[0]}", "is not a field of a trial")
        values = {
            name: check(self.field(data, name, where), f"{where}.{name}")
            for name, check in checks.items()
        }
        trial = Trial(**values)
        n = len(trial.scores)
        if self.examples is not None and n != self.examples:
            self.fail(f"{where}.scores", f"holds {n} scores, not one per example ({self.examples})")
        if len(set(trial.undone)) != trial.unevaluated or any(i >= n for i in trial.undone):
            self.fail(f"{where}.undone", f"does not name {trial.unevaluated} of {n} examples")
        return trial


class SearchCheckpoint:
    """The checkpoint of one search run: what the file held, and what this run adds to it.

    Kept nowhere (no file, no state store) it keeps nothing and reuses nothing, so a
    search has one code path.
    """

    def __init__(self, place: CheckpointPlace, search: str, of: dict[str, str]) -> None:
        self.place = place
        """Where it is kept: a file, or a key of a state store (`CheckpointPlace`)."""
        self.remedy = place.remedy("another checkpoint file")
        self.search = search
        self.of = of
        self.trials: list[Trial] = []
        """Trials evaluated in full (written to the file)."""
        self.state: dict[str, Any] = {"steps": {}}
        """The search's own steps and progress (written to the file)."""
        self.reusable: dict[str, list[Trial]] = {}
        """Trials the file held that this run has not taken yet, by `trial_key` (a candidate
        evaluated twice, as identical candidates are, is there twice)."""
        self.saved_steps: dict[str, dict[str, Any]] = {}
        """Steps the file held that this run has not taken yet."""
        self.resumed_calls = 0
        """Calls of the work taken from the file instead of being sent again."""
        self.left: str | None = None
        """The digest of the program as the search left it (the best it applied)."""
        self.start: Trial | None = None
        """Trial 0, when the program given is the one this checkpoint's search left: the
        caller takes it back to this start before searching again."""

    @classmethod
    def open(
        cls,
        place: CheckpointPlace,
        search: str,
        of: dict[str, str],
        read_state: Callable[[dict[str, Any], Reader], None],
        examples: int,
    ) -> SearchCheckpoint:
        """Reads and checks the whole checkpoint (before any call); an empty one without one.

        Raises:
            CheckpointError: the file is a link, not a regular file, not JSON,
                or not a search checkpoint as plait writes it.
            ValueError: it holds another search, or the same search of other work.
        """
        checkpoint = cls(place, search, of)
        remedy, path = checkpoint.remedy, place.name
        data = place.read(remedy)
        if data is None:
            return checkpoint
        read = checkpoint.reader(examples)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CheckpointError(f"{path} is not a plait search checkpoint ({FORMAT}): {remedy}")
        if data.get("search") != search:
            raise ValueError(
                f"{path} holds a {data.get('search')!s:.40} checkpoint, not a {search} one: "
                f"{remedy}"
            )
        held = read.mapping(data.get("of"), "of")
        checkpoint.left = read.text(data.get("left"), "left", optional=True)
        left_by_it = held.get("program") != of["program"] == checkpoint.left
        differ = [
            _DIFFERENT[part]
            for part in of
            if held.get(part) != of[part] and not (part == "program" and left_by_it)
        ]
        if differ:
            raise ValueError(f"{path} holds a {search} search of {' and '.join(differ)}; {remedy}")
        for i, item in enumerate(read.sequence(read.field(data, "trials", ""), "trials")):
            trial = read.trial(item, f"trials[{i}]")
            checkpoint.trials.append(trial)
            key = trial_key(trial.parameters, trial.settings)
            checkpoint.reusable.setdefault(key, []).append(trial)
        state = read.mapping(read.field(data, "state", ""), "state")
        steps = read.mapping(state.get("steps", {}), "state.steps")
        for key, step in steps.items():
            where = f"state.steps.{key}"
            read.mapping(step, where)
            read.integer(read.field(step, "calls", where), f"{where}.calls")
            read.field(step, "value", where)
        read_state(state, read)  # the search checks its own steps and progress
        if left_by_it:
            checkpoint.start = next((t for t in checkpoint.trials if t.number == 0), None)
            if checkpoint.start is None:
                raise ValueError(f"{path} holds no trial 0 to take the program back to: {remedy}")
            checkpoint.of = {**of, "program": held["program"]}
        checkpoint.state = {**state, "steps": dict(steps)}
        checkpoint.saved_steps = dict(steps)
        return checkpoint

    # ------------------------------------------------------------- trials
    def reuse(self, key: str, number: int, params: dict[str, Any], note: str) -> Trial | None:
        """Returns the file's trial of this candidate (once), renumbered; None if it has none.

        It may be one the budget cut short (``unevaluated``): the caller finishes it, and
        the finished trial takes its place in the file.
        """
        held = self.reusable.get(key)
        if not held:
            return None
        saved = held.pop(0)
        self.resumed_calls += saved.calls
        if saved.unevaluated:
            self.trials.remove(saved)
        return replace(saved, number=number, params=params, note=note or saved.note)

    def add(self, trial: Trial) -> None:
        """Keeps a trial, and writes the file: of one the budget cut short, the examples it
        evaluated, so that a rerun evaluates only the others."""
        self.trials.append(trial)
        self.save()

    # -------------------------------------------------------------- steps
    def step(self, key: str) -> dict[str, Any] | None:
        """Returns a step the file held (once), as ``{"value", "calls"}``; None if it has none."""
        saved = self.saved_steps.pop(key, None)
        if saved is not None:
            self.resumed_calls += saved["calls"]
        return saved

    def reader(self, examples: int | None = None) -> Reader:
        """Returns a `Reader` of this checkpoint, for complaints about what it held."""
        return Reader(self.place.name, examples, self.remedy)

    def add_step(self, key: str, value: Any, calls: int) -> None:
        """Keeps a finished step's JSON result and the calls it took, and writes the file."""
        self.state["steps"][key] = {"value": value, "calls": calls}
        self.save()

    def leave(self, program: Module) -> None:
        """Notes the program as the search left it, so a rerun given it is known as this
        search's start, changed by the search (see `start`)."""
        if not self.place.kept:
            return
        self.left = program_digest(program)
        self.save()

    def save(self) -> None:
        """Writes everything kept so far (a no-op where nothing is kept)."""
        if not self.place.kept:
            return
        data = {
            "format": FORMAT,
            "search": self.search,
            "of": self.of,
            "left": self.left,
            "trials": [asdict(t) for t in self.trials],
            "state": self.state,
        }
        self.place.write(json.dumps(data, default=str, indent=1))
