"""What a program search found, and why it kept what it kept.

`Trial` (one candidate evaluated on the validation set) and `SearchReport` (the whole
search), the rule a candidate is chosen by (never below trial 0 on validation, a clear
winner on the sign test, then the balanced score: see `plait.optimization.search`), the
reason the report gives in words (`explain`), the decisions told to callbacks, and
`apply`, which loads a trial into a program.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from plait.module import Module
from plait.optimization.evaluation import (
    EvaluationResult,
    _sole_value,
)
from plait.optimization.events import tell_decision, updates_told

__all__ = ["SearchReport", "Trial", "apply", "balanced_score", "explain", "sign_test"]


@dataclass
class Trial:
    """One candidate program evaluated on the validation set."""

    number: int
    """0 is the program as it was; candidates count from 1."""
    params: dict[str, Any]
    """What distinguishes the candidate (settings, demo counts, an instruction …)."""
    score: float
    """Mean validation score."""
    selection: float
    """The score the choice is made on (balanced over target labels, or the mean)."""
    calls: int = 0
    """Model calls its evaluation made."""
    cost: float = 0.0
    seconds: float = 0.0
    """Wall time of its evaluation (candidates run concurrently, so these overlap)."""
    note: str = ""
    parameters: dict[str, Any] = field(default_factory=dict, repr=False)
    """The candidate's ``state_dict`` (what `apply` loads)."""
    settings: dict[str, Any] = field(default_factory=dict, repr=False)
    """Module settings by ``path.attribute`` (what `apply` sets)."""
    scores: list[float] = field(default_factory=list, repr=False)
    """Its score on each validation example, in order (a Pareto frontier needs them)."""
    answers: dict[str, int] = field(default_factory=dict, repr=False)
    """How often it answered each label, when the validation targets are labels."""
    unevaluated: int = 0
    """Validation examples the search's budget left undone; such a trial is never chosen."""
    undone: list[int] = field(default_factory=list, repr=False)
    """Their positions in the validation set (what a resumed search evaluates)."""

    def row(self) -> dict[str, Any]:
        """Returns the trial as one row of a trials table (no parameter values)."""
        return {
            "number": self.number,
            "params": self.params,
            "score": self.score,
            "selection": self.selection,
            "calls": self.calls,
            "cost": self.cost,
            "seconds": round(self.seconds, 3),
            "note": self.note,
        }


@dataclass
class SearchReport:
    """What one program search did."""

    optimizer: str
    trials: list[Trial]
    best: Trial
    """The trial the program holds now: the one applied, or trial 0 when the search
    kept the program (a candidate may score higher without winning clearly)."""
    start: Trial
    """Trial 0: the program as it was."""
    calls: int = 0
    """Model calls the whole search made (bootstrapping and proposals included)."""
    seconds: float = 0.0
    reason: str = ""
    """Why ``best`` was kept, in words a user can act on (see `explain`)."""
    stopped_by_budget: bool = False
    """Whether the budget (``max_calls``, ``max_tokens``, ``max_cost``) cut the search
    short; ``best`` is then the best of the trials evaluated in full."""
    spent: dict[str, Any] = field(default_factory=dict)
    """Calls, tokens and cost spent, when the search had a budget."""
    left_undone: str = ""
    """What the budget left undone, in words (empty when nothing was)."""
    resumed_calls: int = 0
    """Calls of the work taken from the checkpoint instead of being sent again."""

    @property
    def improved(self) -> bool:
        """Whether a candidate other than the start was applied."""
        return self.best.number != 0

    def rows(self) -> list[dict[str, Any]]:
        """Returns the trials as dicts (`Trial.row`), best score first; for code, and for
        ``pandas.DataFrame(report.rows())`` (what ``table()`` returned before it printed)."""
        return sorted((t.row() for t in self.trials), key=lambda r: (-r["score"], r["number"]))

    def table(self) -> str:
        """Returns the trials as a plain-text table to print, best score first, the kept one
        marked ``*``; `rows` gives the same as dicts."""
        header = ("trial", "score", "selection", "calls", "cost", "seconds", "params")
        lines = [_cells(header)]
        for row in self.rows():
            mark = "*" if row["number"] == self.best.number else " "
            params = ", ".join(f"{k}={_short(v)}" for k, v in row["params"].items()) or "-"
            note = f"  ({row['note']})" if row["note"] else ""
            lines.append(
                _cells(
                    (
                        f"{mark}{row['number']}",
                        f"{row['score']:.3f}",
                        f"{row['selection']:.3f}",
                        str(row["calls"]),
                        f"{row['cost']:.4f}",
                        f"{row['seconds']:.2f}",
                        params + note,
                    )
                )
            )
        return "\n".join(lines)


def _cells(values: Sequence[str]) -> str:
    """One line of the trials table: the numbers right-aligned, the params last."""
    *numbers, params = values
    widths = (6, 7, 9, 6, 8, 8)
    return " ".join(f"{v:>{w}}" for v, w in zip(numbers, widths, strict=True)) + f"  {params}"


def _short(value: Any, width: int = 40) -> str:
    """A parameter's value on one line of at most ``width`` characters."""
    text = " ".join(str(value).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def balanced_score(result: EvaluationResult) -> float:
    """Returns the mean over target values of each value's mean score (macro average)."""
    if not result.rows:
        return float(result)
    return _balanced([row.target for row in result.rows], result.scores)


def _balanced(targets: Sequence[Any], scores: Sequence[float]) -> float:
    """Returns the mean over target values of each value's mean score."""
    groups: dict[str, list[float]] = defaultdict(list)
    for target, score in zip(targets, scores, strict=True):
        groups[_label(target)].append(score)
    return sum(sum(g) / len(g) for g in groups.values()) / len(groups)


def _label(target: Any) -> str:
    """Returns a target as a label: text as it is, a row of one field by its value, else JSON."""
    if isinstance(target, Mapping) and len(target) == 1:
        target = next(iter(target.values()))
    if isinstance(target, str):
        return target
    return json.dumps(target, sort_keys=True, default=str)


def _label_like(pairs: Sequence[tuple[Any, Any]]) -> bool:
    """Whether targets repeat like labels (at most half as many values as examples)."""
    values = {_label(target) for _, target in pairs}
    return 1 < len(values) <= len(pairs) / 2


def sign_test(scores: Sequence[float], baseline: Sequence[float]) -> float:
    """Returns the one-sided sign-test p-value that ``scores`` beat ``baseline`` example by example.

    Ties are dropped; with ``w`` wins in ``n`` untied examples it is
    P(at least ``w`` heads in ``n`` fair coin flips). 1.0 when nothing differs.
    """
    wins = sum(a > b for a, b in zip(scores, baseline, strict=True))
    losses = sum(a < b for a, b in zip(scores, baseline, strict=True))
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


def explain(
    trials: Sequence[Trial], start: Trial, best: Trial, significance: float | None = None
) -> str:
    """Returns why a search kept ``best``, from the evidence, in words a user can act on.

    An applied candidate is explained by its wins and losses against trial 0.
    When the program was kept, the first of these that holds is the reason:
    no candidate differed from it; it was already right everywhere; it (and
    every candidate) answers one label for every example, which demos and
    settings do not fix; no candidate won more examples than it lost; the
    best one's lead could be noise (sign test); it scored lower; it gained
    only where the balanced score does not count it.
    """
    n = len(start.scores)
    if best is not start:
        wins, losses = _wins_losses(best, start)
        p = sign_test(best.scores, start.scores)
        return (
            f"trial {best.number} won on {wins} and lost on {losses} of {n} validation examples "
            f"(sign test p = {p:.2g}); validation {start.score:.3g} -> {best.score:.3g}"
        )
    if start.unevaluated:
        return (
            "the budget was spent before the program as it was (trial 0) was evaluated in "
            "full: no baseline to compare candidates with"
        )
    candidates = [t for t in trials if t is not start and not t.unevaluated]
    if not candidates:
        return (
            "the search found no candidate that differs from the program as it is (trial 0): "
            "nothing to compare"
        )
    if n and all(score >= 1.0 for score in start.scores):
        return (
            f"the program is already right on every validation example ({n} of {n}): "
            "nothing to improve on this validation set"
        )
    only = _one_label(start)
    if only is not None and all(_one_label(t) is not None for t in candidates):
        label, count = only
        return (
            f"the program predicts one label for every example ({label!r}, {count} of {n}), "
            "and so does every candidate: demos and settings cannot help until the model "
            "separates labels; try clearer instructions or a stronger model"
        )
    leader = max(candidates, key=lambda t: (_margin(t, start), t.score, -t.number))
    wins, losses = _wins_losses(leader, start)
    if wins <= losses:
        return (
            f"no candidate won on more validation examples than it lost (best +{wins}/-{losses} "
            f"of {n}); a larger validation set could decide"
        )
    p = sign_test(leader.scores, start.scores)
    if significance is not None and p > significance:
        return (
            f"no candidate won clearly: the best (trial {leader.number}) won on {wins} and lost "
            f"on {losses} of {n} validation examples (+{wins}/-{losses}, sign test p = {p:.2g} "
            f"> {significance:g}); a larger validation set could decide"
        )
    if leader.score < start.score:
        return (
            f"trial {leader.number} won on more validation examples (+{wins}/-{losses} of {n}) "
            f"but scored lower on the whole ({leader.score:.3g} < {start.score:.3g})"
        )
    return (
        f"trial {leader.number} won on more validation examples (+{wins}/-{losses} of {n}) but "
        f"its score balanced across labels was not higher ({leader.selection:.3g} vs "
        f"{start.selection:.3g}): it gained on the most common label only"
    )


def _tell_budget(report: SearchReport, budget: Any) -> None:
    """Notes on ``report`` what the search spent and, if its budget stopped it, what it left."""
    report.spent = budget.spent()
    if not budget.stopped:
        return
    report.stopped_by_budget = True
    partial = [t.number for t in report.trials if t.unevaluated]
    undone = (
        f"{len(partial)} trial(s) not evaluated in full (trials {', '.join(map(str, partial))}), "
        "never chosen"
        if partial
        else "no trial was left half-evaluated; the steps after the last one were not run"
    )
    report.left_undone = f"{budget.refused} call(s) refused ({budget.refusal}); {undone}"
    report.reason = f"stopped by the budget: {report.left_undone}; {report.reason}"


CHOICE_RULE = (
    "a candidate may replace the program if it scores at least as well on validation and "
    "beats it on the sign test (p <= significance); the highest balanced score among those wins"
)
"""The rule `ProgramSearch` decides by, as decisions tell it."""


def _tell_decisions(
    trials: Sequence[Trial], start: Trial, best: Trial, significance: float | None
) -> None:
    """Tells callbacks, for each candidate, whether it replaced the program and why."""
    for trial in trials:
        if trial is not start:
            tell_decision(trial, _verdict(trial, start, best, significance))


def _verdict(trial: Trial, start: Trial, best: Trial, significance: float | None) -> dict[str, Any]:
    """Returns the evidence of one candidate's decision against trial 0."""
    wins, losses = _wins_losses(trial, start)
    p = sign_test(trial.scores, start.scores)
    if trial is best:
        why = "chosen"
    elif trial.score < start.score - 1e-12:
        why = "scored below the program as it was"
    elif significance is not None and p > significance:
        why = f"not a clear winner: sign test p = {p:.2g} > {significance:g}"
    else:
        why = f"trial {best.number} was chosen: a higher balanced score, or as high and earlier"
    return {
        "candidate": trial.number,
        "against": start.number,
        "accepted": trial is best,
        "wins": wins,
        "losses": losses,
        "n": len(start.scores),
        "p_value": p,
        "significance": significance,
        "old_score": start.score,
        "new_score": trial.score,
        "rule": CHOICE_RULE,
        "reason": why,
    }


def _summary(report: SearchReport) -> dict[str, Any]:
    """Returns what a search's ``on_optimize_end`` gets: its outcome as data."""
    return {
        "start_score": report.start.score,
        "best_score": report.best.score,
        "best_trial": report.best.number,
        "improved": report.improved,
        "trials": len(report.trials),
        "calls": report.calls,
        "seconds": report.seconds,
        "reason": report.reason,
    }


def _wins_losses(trial: Trial, start: Trial) -> tuple[int, int]:
    """Returns on how many validation examples ``trial`` scored above and below ``start``."""
    pairs = list(zip(trial.scores, start.scores, strict=True))
    return sum(a > b for a, b in pairs), sum(a < b for a, b in pairs)


def _margin(trial: Trial, start: Trial) -> int:
    wins, losses = _wins_losses(trial, start)
    return wins - losses


def _one_label(trial: Trial) -> tuple[str, int] | None:
    """Returns ``(label, count)`` when the trial answered one label for every example."""
    if len(trial.answers) != 1:
        return None
    label, count = next(iter(trial.answers.items()))
    return (label, count) if count == len(trial.scores) else None


def _answer_counts(result: EvaluationResult) -> dict[str, int]:
    """Returns how often each label was answered (an output read as its target is)."""
    answers = Counter(
        _label(_read_as_target(row.output, row.target)) for row in result.rows if row.error is None
    )
    return dict(answers.most_common())


def _read_as_target(output: Any, target: Any) -> Any:
    """Returns the part of ``output`` its target holds: a row's fields, or a sole value."""
    if isinstance(output, Mapping) and isinstance(target, Mapping):
        return {key: output.get(key) for key in target}
    return _sole_value(output, target)


def apply(program: Module, trial: Trial) -> None:
    """Loads a trial's parameter values and settings into ``program`` (told as updates)."""
    with updates_told(program):
        program.load_state_dict(trial.parameters)
    for key, value in trial.settings.items():
        _set_setting(program, key, value)


def _set_setting(program: Module, key: str, value: Any) -> None:
    path, _, attribute = key.rpartition(".")
    setattr(dict(program.named_modules())[path], attribute, value)
