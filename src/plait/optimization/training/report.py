"""What `Trainer.fit` did, and why the program ends with the parameters it has.

`TrainReport`, keep-best's accounting (an update counts as accepted only if the kept
epoch has it: `_settle`), the reason in words, what a budget left undone, the
decisions told to callbacks, and the progress bar over minibatches.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from plait.execution.progress import progress_bar
from plait.optimization.training.optimizer import StepReport


@dataclass
class TrainReport:
    """What `Trainer.fit` did."""

    initial_score: float
    """Validation score of the parameters training started from."""
    best_score: float
    """Validation score of the parameters the program holds now."""
    best_epoch: int
    """Epoch whose parameters were kept (0: the initial ones)."""
    scores: list[float] = field(default_factory=list)
    """Validation score after each epoch."""
    steps: int = 0
    """Optimizer steps taken by this call (a resumed run counts only its own)."""
    accepted: int = 0
    """Updates of those steps that the program keeps: applied in the kept epoch or before."""
    discarded: int = 0
    """Updates those steps applied that keep-best undid (applied after the kept epoch)."""
    rejected: int = 0
    """Updates rejected or reverted by those steps."""
    resumed_from: tuple[int, int] | None = None
    """(epoch, minibatch) a checkpoint resumed from, if one did."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """One entry per optimizer step of this call: ``epoch`` (from 1), ``accepted``,
    ``discarded``, ``rejected`` (as above, per step) and ``train_score`` (the
    minibatch's mean loss score, or None)."""
    not_applied: dict[str, int] = field(default_factory=dict)
    """Why the optimizer did not apply updates (rejected, reverted or skipped), each reason
    as it gave it, with how many updates it held back; the same as in ``optimizer.history``,
    for a reader of the report (``plait train``'s user) who cannot reach that."""
    reason: str = ""
    """Which parameters the program ends with, and why, in words (also logged)."""
    stopped_by_budget: bool = False
    """Whether the budget (``max_calls``, ``max_tokens``, ``max_cost``) stopped training
    early; the program then holds the best parameters validated before it did."""
    spent: dict[str, Any] = field(default_factory=dict)
    """Calls, tokens and cost this call spent, when it had a budget."""
    left_undone: str = ""
    """What the budget left undone, in words: a rerun on the same ``checkpoint_dir`` (or
    ``state``) with a larger budget starts there."""


def _note_step(
    report: TrainReport, step: StepReport, train_score: float | None, epoch: int
) -> None:
    """Adds one finished optimizer step to the report (its counts and a history entry)."""
    applied = len(step.accepted)  # kept by the step; keep-best may still undo them
    rejected = sum(r.status in ("rejected", "reverted") for r in step.updates)
    for record in step.updates:
        if record.status != "accepted":
            why = " ".join(record.reason.split()) or f"{record.status} without a reason"
            report.not_applied[why] = report.not_applied.get(why, 0) + 1
    report.steps += 1
    report.rejected += rejected
    report.history.append(
        {"applied": applied, "rejected": rejected, "train_score": train_score, "epoch": epoch}
    )


def _cut_short(budget: Any) -> bool:
    """Whether the run's budget has refused a call (the phase that ran is then incomplete)."""
    return budget is not None and budget.stopped


def _tell_budget(
    report: TrainReport,
    budget: Any,
    state: dict[str, Any] | None,
    batches: int,
    kept_in: str | None,
) -> None:
    """Notes on ``report`` what the budget let training spend and what it left undone;
    ``kept_in`` names where the checkpoint is kept (``checkpoint_dir``, ``state``), if
    anywhere."""
    report.spent = budget.spent()
    if not budget.stopped:
        return
    report.stopped_by_budget = True
    if state is None:
        where = "the validation before training"
    elif state["batch"] < batches:
        where = f"epoch {state['epoch'] + 1}, minibatch {state['batch'] + 1} of {batches}"
    else:
        where = f"the validation after epoch {state['epoch'] + 1}"
    rerun = (
        f"which a rerun on the same {kept_in} with a larger budget starts from"
        if kept_in is not None
        else "and nothing was checkpointed (give checkpoint_dir to make it resumable)"
    )
    report.left_undone = (
        f"{budget.refused} call(s) refused ({budget.refusal}); training stopped at {where}, "
        + rerun
    )


NOTHING_VALIDATED = "kept the program as it was: nothing was validated"
"""The reason of a run stopped before its first validation ended (its scores are 0, unmeasured)."""


KEEP_BEST_RULE = "keep-best: an epoch's parameters are kept if they score above the best so far"
"""The rule the Trainer keeps parameters by, as its decisions tell it."""


def _keep_best_evidence(epoch: int, score: float, best: float) -> dict[str, Any]:
    """Returns the evidence of keep-best's decision on one epoch."""
    return {
        "candidate": epoch,
        "accepted": score > best,
        "old_score": best,
        "new_score": score,
        "rule": KEEP_BEST_RULE,
    }


def _summary(report: TrainReport) -> dict[str, Any]:
    """Returns what a Trainer's ``on_optimize_end`` gets: its outcome as data."""
    return {
        "start_score": report.initial_score,
        "best_score": report.best_score,
        "best_epoch": report.best_epoch,
        "improved": report.best_epoch != 0,
        "steps": report.steps,
        "accepted": report.accepted,
        "rejected": report.rejected,
        "reason": report.reason,
    }


def _settle(report: TrainReport) -> None:
    """Counts each step's applied updates as accepted or discarded by keep-best; says why.

    An update is kept when its epoch is at most the kept one: later epochs'
    parameters were replaced by the best ones.
    """
    for entry in report.history:
        applied = entry.pop("applied")
        kept = applied if entry["epoch"] <= report.best_epoch else 0
        entry["accepted"], entry["discarded"] = kept, applied - kept
    report.accepted = sum(entry["accepted"] for entry in report.history)
    report.discarded = sum(entry["discarded"] for entry in report.history)
    report.reason = _reason(report)


def _reason(report: TrainReport) -> str:
    if report.best_epoch:
        reason = (
            f"kept the parameters of epoch {report.best_epoch}: validation "
            f"{report.initial_score:.3g} -> {report.best_score:.3g}"
        )
        if report.discarded:
            reason += f"; {report.discarded} later updates discarded (validation fell)"
        return reason
    if not report.discarded:
        return (
            f"kept the initial parameters: the optimizer applied no update "
            f"({report.rejected} rejected){_why_not_applied(report.not_applied)}"
        )
    applied = f"{report.discarded} update(s) applied during training"
    if not report.scores:  # the budget stopped training within its first epoch
        return (
            f"kept the initial parameters (validation {report.initial_score:.3g}): no epoch "
            f"ended, so the {applied} were never validated"
        )
    scores = ", ".join(f"{score:.3g}" for score in report.scores)
    return (
        f"kept the initial parameters: validation after each epoch ({scores}) never beat the "
        f"start ({report.initial_score:.3g}); the {applied} were discarded"
    )


def _why_not_applied(reasons: dict[str, int], shown: int = 2, width: int = 160) -> str:
    """Returns the commonest reasons updates were not applied, as ``: why (N times); ...``
    (each cut at ``width`` characters), or "" when the optimizer gave none."""
    if not reasons:
        return ""
    common = sorted(reasons.items(), key=lambda item: -item[1])
    told = [
        (why if len(why) <= width else why[: width - 1] + "…") + (f" ({n} times)" if n > 1 else "")
        for why, n in common[:shown]
    ]
    more = len(common) - shown
    rest = f"; and {more} other reason{'s' if more > 1 else ''} in the report" if more > 0 else ""
    return ": " + "; ".join(told) + rest


class _Progress:
    """A rich progress bar over minibatches on stderr (a no-op when disabled)."""

    def __init__(self, enabled: bool | None, total: int) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.total = total
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            self._bar = progress_bar("training", ["{task.fields[scores]}"])
            self._bar.start()
            self._task = self._bar.add_task("training", total=self.total, scores="")
        return self

    def advance_to(self, done: int, report: TrainReport, train_score: float | None = None) -> None:
        if self._bar is None:
            return
        scores = f"val best {report.best_score:.3f}"
        if train_score is not None:
            scores = f"train {train_score:.3f} · {scores}"
        self._bar.update(self._task, completed=done, scores=scores)

    def advance(self, report: TrainReport, train_score: float | None) -> None:
        if self._bar is None:
            return
        done = self._bar.tasks[0].completed + 1
        self.advance_to(int(done), report, train_score)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
