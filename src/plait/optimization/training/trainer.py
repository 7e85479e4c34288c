# size: the Trainer with its checkpoint and estimate; issue 35 moves those apart.
"""Trainer: epochs of minibatches, validation, keep-best, progress and resumable checkpoints.

    trainer = Trainer(program, VerifierLoss(exact_match), SFAOptimizer(program.named_parameters()),
                      resources=config, train_set=train, val_set=val, metric=exact_match,
                      epochs=3, batch_size=8, checkpoint_dir="runs/prompt")
    report = await trainer.fit()      # the program ends with its best validated parameters
    report.reason                     # which parameters were kept, and why, in words

Like a module call, ``fit()`` is awaited inside a running event loop and runs
to completion in a script with no loop running.

How a minibatch runs: its examples go through the `TrainingStep` as *one
batch* (one resource manager and one limit on calls in flight, every example
concurrently). A batch passes its list as the first argument and shares the
keyword arguments, so a per-example ``target=`` cannot ride along as a
keyword; instead each item is the ``(input, target)`` pair itself, and a small
wrapper module unpacks it into ``step(input, target=target)`` while tracing.
Then one backward over all the losses, and one ``optimizer.step()``.

Keep-best: the validation score is measured before training and after each
epoch; the initial parameters are a candidate like any other, the best
parameters (ties keep the earlier) are restored at the end, so the validation
score never ends below where it started (for a deterministic program). The
report then counts as *accepted* only the updates the program keeps (those of
the epochs up to the kept one); updates undone by keep-best are *discarded*.

Checkpoints: with ``checkpoint_dir``, ``trainer.json`` there is rewritten
(atomically) after every minibatch and every validation: parameters,
optimizer state, position (epoch, next minibatch), scores and the best
parameters. A new `Trainer` on the same directory continues from there. A
symbolic link planted as ``trainer.json`` is refused (`CheckpointError`), never
written through, and no fixed temporary name is used that a link could take.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait import _context, _files
from plait.execution.checkpoint_codec import CheckpointError
from plait.execution.progress import progress_bar
from plait.execution.settings import check_served
from plait.feedback import Feedback
from plait.module import Module
from plait.optimization.evaluation import Metric, evaluate, examples_of
from plait.optimization.events import (
    learning_step,
    observed_run,
    rounds_of,
    tell_decision,
    updates_told,
)
from plait.optimization.training.backward import backward
from plait.optimization.training.optimizer import Optimizer, StepReport
from plait.optimization.training.step import PROGRAM_PATH, TrainingStep, on_examples
from plait.resources.usage import active_budgets
from plait.values import Value

__all__ = ["TrainReport", "Trainer"]

logger = logging.getLogger("plait.optimization")

CHECKPOINT_FILE = "trainer.json"
CHECKPOINT_FORMAT = "plait.trainer/1"


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
    reason: str = ""
    """Which parameters the program ends with, and why, in words (also logged)."""
    stopped_by_budget: bool = False
    """Whether the budget (``max_calls``, ``max_tokens``, ``max_cost``) stopped training
    early; the program then holds the best parameters validated before it did."""
    spent: dict[str, Any] = field(default_factory=dict)
    """Calls, tokens and cost this call spent, when it had a budget."""
    left_undone: str = ""
    """What the budget left undone, in words: a rerun on the same ``checkpoint_dir``
    with a larger budget starts there."""


# size: epochs, validation, checkpoints and estimates of one training; split in issue 35.
class Trainer:
    """Trains a program's parameters on a dataset with a loss and an optimizer.

    Args:
        step_or_module: a `TrainingStep`, or the program (then ``loss_fn`` is required).
        loss_fn: a `Loss` or a ``check(output, target)`` function (see `TrainingStep`);
            None when a `TrainingStep` is given.
        optimizer: the optimizer of the program's parameters; bound to
            ``resources`` if it has none.
        resources: ResourceConfig / ResourceManager / mapping for every call.
        train_set: ``(input, target)`` pairs or mappings with ``input``/``target``.
        val_set: the same, for validation.
        metric: ``metric(output, target)`` → bool, number or Feedback; default exact match.
        epochs: passes over ``train_set``.
        batch_size: examples per optimizer step (run concurrently).
        checkpoint_dir: directory that makes training resumable.
        progress: show a progress bar (None: when stderr is a terminal).
        shuffle: shuffle the training set each epoch (reproducibly, from ``seed``).
        seed: the shuffling seed.
        max_concurrent: most LLM calls in flight at once (None: the default).
        max_calls, max_tokens, max_cost: a hard budget for each `fit` call
            (`plait.resources.usage.Budget`): requests are held against it
            before they are sent, so training never passes it. The minibatch
            or validation it cuts short is dropped (not applied, not saved),
            training stops, and the program ends with its best validated
            parameters; the checkpoint resumes from the last finished step.

    Raises:
        ValueError: empty datasets, bad sizes, or both/neither of a step and a loss.
    """

    def __init__(
        self,
        step_or_module: TrainingStep | Module,
        loss_fn: Any = None,
        optimizer: Optimizer | None = None,
        *,
        resources: Any,
        train_set: Any,
        val_set: Any,
        metric: Metric | None = None,
        epochs: int = 1,
        batch_size: int = 8,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        progress: bool | None = None,
        shuffle: bool = True,
        seed: int = 0,
        max_concurrent: int | None = None,
        max_calls: int | None = None,
        max_tokens: int | None = None,
        max_cost: float | None = None,
    ) -> None:
        from plait.resources.usage import Budget

        Budget.of(max_calls, max_tokens, max_cost)  # checks the limits now, not in fit()
        if isinstance(step_or_module, TrainingStep):
            if loss_fn is not None:
                raise ValueError(
                    "Trainer got a TrainingStep and a loss_fn, but the step has its loss: "
                    "Trainer(step, None, optimizer, ...) or Trainer(program, loss, optimizer, ...)"
                )
            step = step_or_module
        elif loss_fn is None:
            raise ValueError("Trainer(program, loss_fn, optimizer, ...) needs a loss_fn")
        else:
            step = TrainingStep(step_or_module, loss_fn)
        if optimizer is None:
            raise ValueError(
                "Trainer needs an optimizer, e.g. SFAOptimizer(program.named_parameters())"
            )
        if epochs < 1 or batch_size < 1:
            raise ValueError(f"epochs and batch_size must be >= 1; got {epochs} and {batch_size}")
        self.step = step
        self.module: Module = step.module
        self.optimizer = optimizer
        if optimizer.resources is None:
            optimizer.bind(resources)
        self.resources = resources
        self.train_set = examples_of(train_set)
        self.val_set = examples_of(val_set)
        if not self.train_set or not self.val_set:
            raise ValueError("Trainer needs a non-empty train_set and val_set")
        self.metric = metric
        self.epochs = epochs
        self.batch_size = batch_size
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.progress = progress
        self.shuffle = shuffle
        self.seed = seed
        self.max_concurrent = max_concurrent
        self.max_calls = max_calls
        self.max_tokens = max_tokens
        self.max_cost = max_cost
        self._examples = on_examples(step)
        self._data_digests: tuple[str, str] | None = None
        self.report: TrainReport | None = None
        """The `TrainReport` of the last `fit`, also of one that was cancelled: the program
        then holds the best parameters validated before the cancel, and ``reason`` says so."""
        self._reached: dict[str, Any] | None = None
        """The training state the running `fit` has reached (None before its first
        validation ended)."""

    def _check_optimizer_alias(self) -> None:
        """Raises before any call when the optimizer's resources do not serve its alias."""
        resources = self.optimizer.resources or self.resources
        alias = getattr(self.optimizer, "alias", None)
        if resources is not None and isinstance(alias, str):
            name = type(self.optimizer).__name__
            who = f"{name}'s updates (the Trainer's optimizer)"
            check_served(resources, alias, who=who, setting=f"{name}(alias=...)")

    # ------------------------------------------------------------------ public
    async def evaluate(self) -> float:
        """Returns the program's validation score with its current parameters.

        A plain float (the mean of the `EvaluationResult`), because scores go
        into the report and the JSON checkpoint.
        """
        result = await evaluate(
            self.module,
            self.val_set,
            self.metric,
            resources=self.resources,
            max_concurrent=self.max_concurrent,
            progress=False,
        )
        return float(result)

    def estimate(self, sample: int = 2) -> Any:
        """Estimates the calls, tokens and dollars `fit` would spend, before it runs.

        From the schedule (validations, epochs of minibatches, one optimizer
        step per minibatch, and a call per example for an LLM-judged loss) and
        one run of the program measured on ``sample`` validation examples,
        which run for real (`plait.optimization.costs`). An optimizer step
        is sized by one made for real on copies of the program and the
        optimizer (`Optimizer.copy_for`), the copy run in training mode on
        ``sample`` training examples and its feedback repeated to a minibatch's
        worth, and by a second step on the values the first gave: their calls,
        tokens and re-asks, and what the updates add to the prompts of the runs
        after them (these calls count in ``sample_calls``). With ``sample=0``,
        it makes the calls `Optimizer.estimated_calls` renders. A checkpoint
        to resume from shortens the schedule. Awaited inside a running event loop, run to
        completion in a script, like `fit`.

        Returns:
            A `CostEstimate`; ``print(estimate)`` shows the table.
        """
        from plait.execution.run import awaitable_or_result
        from plait.optimization.costs import check_sample

        check_sample(sample)
        return awaitable_or_result(self._estimate(sample))

    def _minibatch_sizes_left(self, position: tuple[int, int]) -> list[int]:
        """The sizes of the minibatches still to train on from ``position`` (epoch, batch)."""
        batches, m = self._batches(), len(self.train_set)
        return [
            min(self.batch_size, m - batch * self.batch_size)
            for epoch in range(position[0], self.epochs)
            for batch in range(position[1] if epoch == position[0] else 0, batches)
        ]

    async def _estimate(self, sample: int) -> Any:
        from plait.optimization import costs
        from plait.optimization.costs import Phase, Range
        from plait.resources import ResourceManager
        from plait.resources.usage import Budget, metered

        self._check_optimizer_alias()
        size, spent = await costs.measure(
            self.module, self.val_set, self.resources, sample, self.train_set
        )
        resumed = self._position()
        position = resumed or (0, 0)
        batches = self._batches()
        n = len(self.val_set)
        left = self._minibatch_sizes_left(position)
        steps_left, examples_left = len(left), sum(left)
        feedback = costs.feedback_items(self.train_set[: self.batch_size], size)
        step_calls = [
            call
            for name, param in self.optimizer.named_parameters()
            if param.requires_grad
            for call in self.optimizer.estimated_calls(name, param, feedback)
        ]
        updates = steps_left * len(step_calls)
        proposal = None
        if sample > 0 and steps_left:
            with metered() as meter, costs.quiet():  # the copy's warnings are not the run's
                first, then = await self._sampled_step(sample, len(step_calls))
            spent += meter.calls
            # the first step meets the parameters as they are, later ones what it made them
            proposal = first.blend(then, 1 - 1 / steps_left) if first is not None else None
        validations = self.epochs - position[0]
        judge = getattr(self.step.loss, "alias", None)
        grown = 0.0  # characters the updates add to the prompts of the runs after them
        if proposal is not None:  # counted in updates of a parameter, each as the sampled one
            learnable = sum(p.requires_grad for _, p in self.optimizer.named_parameters())
            other = Range(0, steps_left * learnable, steps_left * learnable)
            grown = proposal.grown * learnable
        else:  # low: no update asked for; high: every call re-asked as often as allowed
            other = Range(0, updates, (1 + self.optimizer.max_retries) * updates)
        after_first = (examples_left - left[0]) / examples_left if left else 0.0
        phases = [
            Phase("validation before training", runs=Range(*(0 if resumed else n,) * 3)),
            Phase(
                f"{steps_left} training minibatches",
                runs=Range(*(examples_left,) * 3),
                added_chars=grown * after_first,
            ),
            Phase(
                f"{steps_left} optimizer steps",
                other=other,
                other_chars=costs.mean_call(step_calls),
                other_alias=self.optimizer.alias,
                proposal=proposal,
            ),
            Phase(
                f"{validations} validations after an epoch",
                runs=Range(*(validations * n,) * 3),
                added_chars=grown,
            ),
        ]
        if isinstance(judge, str):
            phases.append(
                Phase(
                    f"the loss's judge on {examples_left} examples",
                    other=Range(*(examples_left,) * 3),
                    other_alias=judge,
                )
            )
        return costs.from_schedule(
            f"Trainer of {type(self.module).__name__}: {self.epochs} epoch(s) of {batches} "
            f"minibatches, {n} validation examples",
            phases,
            size,
            ResourceManager.shared(self.resources),
            sample_calls=spent,
            budget=Budget.of(self.max_calls, self.max_tokens, self.max_cost),
        )

    async def _sampled_step(self, sample: int, least_calls: int) -> tuple[Any, Any]:
        """Makes an optimizer step for real on a copy of the program, for the estimate, and
        returns what one update of a parameter spent (a `costs.Proposal`, None when it asked
        nothing), and what one spent in a second step on the values the first gave, when it
        changed them (`costs.sample_twice`).

        The copy runs ``sample`` training examples in training mode, backward brings
        their feedback, repeated to a minibatch's worth, and a copy of the optimizer
        (`Optimizer.copy_for`, without its ``validate`` hook) steps on the copy's
        parameters: the program and the optimizer are left as they are. ``least_calls``
        is the calls of all the updates of a step when no reply is asked again.
        """
        from plait.execution import run
        from plait.optimization.costs import Proposal, repeat_feedback, sample_twice
        from plait.optimization.training.updates import as_text
        from plait.resources.usage import metered

        twin = self.step.copy()
        paths = {id(p): path for path, p in self.step.named_parameters()}
        twins = dict(twin.named_parameters())
        params = [
            (name, twins[paths[id(p)]])
            for name, p in self.optimizer.named_parameters()
            if id(p) in paths and p.requires_grad
        ]
        if not params:
            return None, None
        optimizer = self.optimizer.copy_for(params).bind(self.resources)
        batch = self.train_set[: max(1, min(sample, self.batch_size))]
        examples = on_examples(twin)
        examples.train()
        try:
            losses = await run(
                examples, list(batch), resources=self.resources,
                max_concurrent=self.max_concurrent, on_error="collect", progress=False,
            )  # fmt: skip
        finally:
            examples.eval()
        taped = [loss for loss in losses if isinstance(loss, Value)]
        if taped:
            await backward(taped, resources=self.resources)
        shown = [p for _, p in params]
        repeat_feedback(shown, min(self.batch_size, len(self.train_set)) / len(batch))
        least = max(round(least_calls / len(params)), 1)

        async def update() -> tuple[Any, bool]:
            before = sum(len(as_text(p.value)) for p in shown)
            with metered() as meter:
                report = await optimizer.step()
            grown = sum(len(as_text(p.value)) for p in shown) - before
            most = least * (1 + optimizer.max_retries)
            proposal = Proposal.of(meter, len(report.updates), least=least, most=most, grown=grown)
            return proposal, bool(report.accepted)

        return await sample_twice(shown, update)

    def _position(self) -> tuple[int, int] | None:
        """(epoch, minibatch) the checkpoint would resume from; None without one.

        Read without restoring anything: `fit` checks the checkpoint in full.
        """
        if self.checkpoint_dir is None:
            return None
        path = self.checkpoint_dir / CHECKPOINT_FILE
        remedy = "delete it to start over, or use another checkpoint_dir"
        data = _files.read_json(path, error=CheckpointError, remedy=remedy)
        if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
            return None
        epoch, batch = data.get("epoch"), data.get("batch")
        if not (isinstance(epoch, int) and isinstance(batch, int)):
            return None
        return (epoch, batch)

    def fit(self) -> Any:
        """Trains for the remaining epochs and leaves the program with its best parameters.

        Returns the `TrainReport`: awaited inside a running event loop
        (``report = await trainer.fit()``), directly from a script with no
        loop running, as a module call does. Cancelled, it leaves the program
        with the best parameters validated so far and its report in `report`.
        """
        from plait.execution.run import awaitable_or_result

        return awaitable_or_result(observed_run(self, self.module, self._fit(), _summary))

    async def _fit(self) -> TrainReport:
        """The body of `fit`: the training loop within the budget, if there is one."""
        from plait.resources.usage import Budget, budgeted

        profiler = _context.PROFILE.get()
        if profiler is not None:  # its report names the program's modules as validation does
            profiler.show_program_at(PROGRAM_PATH, type(self.module).__name__)
        self._check_optimizer_alias()
        budget = Budget.of(self.max_calls, self.max_tokens, self.max_cost)
        report = self.report = TrainReport(initial_score=0.0, best_score=0.0, best_epoch=0)
        self._reached = None
        try:
            with budgeted(budget):
                state = await self._train(report, budget)
        except asyncio.CancelledError:
            # Cancelled (Ctrl-C in `plait train`): the step cut short is dropped as a
            # budget's would be, and the program keeps the best it validated.
            self._keep_best(report, self._reached)
            report.reason = f"cancelled: {report.reason}"
            logger.info("Trainer: %s", report.reason)
            raise
        if budget is not None:
            _tell_budget(report, budget, state, self._batches(), self.checkpoint_dir is not None)
        self._keep_best(report, state)
        if report.stopped_by_budget:
            report.reason = f"stopped by the budget: {report.left_undone}; {report.reason}"
        logger.info("Trainer: %s", report.reason)
        return report

    def _keep_best(self, report: TrainReport, state: dict[str, Any] | None) -> None:
        """Gives the program the best parameters ``state`` validated; says so in ``report``."""
        if state is None:
            report.reason = NOTHING_VALIDATED
            return
        with updates_told(self.module):
            self.module.load_state_dict(state["best"]["parameters"])
        _settle(report)

    async def _train(self, report: TrainReport, budget: Any) -> dict[str, Any] | None:
        """Runs the remaining epochs into ``report``; returns the state reached.

        With a budget, a phase (the first validation, a minibatch, an epoch's
        validation) that the budget cut short is dropped and training stops:
        None when even the first validation was cut short.
        """
        from plait.errors import BudgetExceededError

        state = self._load()
        resumed = None
        if state is None:
            initial = await self._validated(0)
            if _cut_short(budget):
                return None
            logger.info("Trainer: validation score before training: %.4g", initial)
            state = {
                "epoch": 0,
                "batch": 0,
                "initial_score": initial,
                "scores": [],
                "best": {"score": initial, "epoch": 0, "parameters": self.module.state_dict()},
            }
            self._save(state)
        else:
            resumed = (state["epoch"], state["batch"])
        self._reached = state  # updated in place as training goes
        report.initial_score = state["initial_score"]
        report.best_score, report.best_epoch = state["best"]["score"], state["best"]["epoch"]
        report.scores, report.resumed_from = state["scores"], resumed
        batches = self._batches()
        with _Progress(self.progress, self.epochs * batches) as progress, rounds_of(self) as rounds:
            progress.advance_to(state["epoch"] * batches + state["batch"], report)
            while state["epoch"] < self.epochs:
                order = self._order(state["epoch"])
                while state["batch"] < batches:
                    start = state["batch"] * self.batch_size
                    batch = [self.train_set[i] for i in order[start : start + self.batch_size]]
                    rounds.start(
                        round=report.steps + 1, epoch=state["epoch"] + 1, batch=state["batch"] + 1
                    )
                    try:
                        step, train_score = await self._train_batch(batch)
                    except BudgetExceededError:
                        if not _cut_short(budget):
                            raise  # an endpoint's own budget, not this run's
                        return state
                    if _cut_short(budget):
                        return state
                    _note_step(report, step, train_score, state["epoch"] + 1)
                    rounds.end(**report.history[-1])
                    state["batch"] += 1
                    self._save(state)
                    progress.advance(report, train_score)
                if not await self._end_epoch(state, report, budget):
                    return state
        return state

    def _batches(self) -> int:
        """Minibatches per epoch."""
        return math.ceil(len(self.train_set) / self.batch_size)

    # ---------------------------------------------------------------- epochs
    async def _train_batch(self, batch: list[tuple[Any, Any]]) -> tuple[StepReport, float | None]:
        """Runs one minibatch, its backward and one optimizer step; returns the step and the
        minibatch's mean loss score (None when no loss gave a score)."""
        from plait.execution import run

        self._examples.train()
        self.optimizer.zero_feedback()
        try:
            losses = await run(
                self._examples,
                list(batch),
                resources=self.resources,
                max_concurrent=self.max_concurrent,
                on_error="collect",
                progress=False,
            )
        finally:
            self._examples.eval()
        taped = [loss for loss in losses if isinstance(loss, Value)]
        refused = any(budget.stopped for budget in active_budgets())
        if len(taped) < len(losses) and not refused:  # a refusal ends the step: told once
            logger.warning(
                "Trainer: %d of %d examples of a minibatch failed; training on the rest",
                len(losses) - len(taped),
                len(losses),
            )
        if taped:
            await backward(taped, resources=self.resources)
        step: StepReport = await self.optimizer.step()
        scores = [
            loss.payload.score
            for loss in taped
            if isinstance(loss.payload, Feedback) and loss.payload.score is not None
        ]
        return step, (sum(scores) / len(scores) if scores else None)

    async def _end_epoch(self, state: dict[str, Any], report: TrainReport, budget: Any) -> bool:
        """Validates the epoch's parameters; False when the budget cut validation short."""
        epoch = state["epoch"] + 1
        score = await self._validated(epoch)
        if _cut_short(budget):
            return False
        state["scores"].append(score)
        logger.info("Trainer: validation score after epoch %d: %.4g", epoch, score)
        tell_decision(self, _keep_best_evidence(epoch, score, state["best"]["score"]))
        if score > state["best"]["score"]:
            state["best"] = {"score": score, "epoch": epoch, "parameters": self.module.state_dict()}
        report.best_score, report.best_epoch = state["best"]["score"], state["best"]["epoch"]
        state["epoch"], state["batch"] = epoch, 0
        self._save(state)
        return True

    async def _validated(self, epoch: int) -> float:
        """`evaluate` told to callbacks as candidate ``epoch`` (0: before training)."""
        told = {"candidate": epoch, "note": f"after epoch {epoch}" if epoch else "before training"}
        with learning_step("candidate", self.module, told) as step:
            score = await self.evaluate()
            step.outputs = {"score": score, "n": len(self.val_set)}
        return score

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.train_set)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    # ----------------------------------------------------------- checkpoint
    def _settings(self) -> dict[str, Any]:
        """What a checkpoint must have been written for to be resumed by this Trainer (the
        data digested once: every minibatch's checkpoint writes them)."""
        from plait.optimization.search.checkpoint import digest

        if self._data_digests is None:
            self._data_digests = (digest(self.train_set), digest(self.val_set))
        train, val = self._data_digests
        return {
            "train_size": len(self.train_set),
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "train_set": train,
            "val_set": val,
        }

    def _other_settings(self, written: Any) -> list[str]:
        """Returns what differs between the settings a checkpoint was ``written`` for and
        this Trainer's, in words; a file written before the data were digested is checked
        on the settings it has."""
        mine = self._settings()
        if not isinstance(written, dict):
            return [f"settings {written!r}"]
        words = {"train_set": "another training set", "val_set": "another validation set"}
        return [
            words.get(key, f"{key}={written[key]!r} (this Trainer has {mine[key]!r})")
            for key in mine
            if key in written and written[key] != mine[key]
        ] + [f"the setting {key!r}" for key in written if key not in mine]

    def _save(self, state: dict[str, Any]) -> None:
        if self.checkpoint_dir is None:
            return
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        data = {
            "format": CHECKPOINT_FORMAT,
            "settings": self._settings(),
            **state,
            "parameters": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        path = self.checkpoint_dir / CHECKPOINT_FILE
        with _files.replacing(path, error=CheckpointError) as file:
            json.dump(data, file, ensure_ascii=False, indent=1)

    def _load(self) -> dict[str, Any] | None:
        data = self._read_checkpoint()
        if data is None:
            return None
        assert self.checkpoint_dir is not None  # a checkpoint was read from it
        path = self.checkpoint_dir / CHECKPOINT_FILE
        remedy = "delete it to start over, or use another checkpoint_dir"
        try:
            self.module.load_state_dict(data["parameters"])
            self.optimizer.load_state_dict(data["optimizer"])
        except (KeyError, TypeError, ValueError) as exc:
            text = exc.args[0] if exc.args else exc
            raise CheckpointError(f"{path} cannot be restored ({text}): {remedy}") from None
        logger.info(
            "Trainer: resuming from %s at epoch %d, minibatch %d",
            path,
            data["epoch"],
            data["batch"],
        )
        return {key: data[key] for key in _PROGRESS_KEYS}

    def _read_checkpoint(self) -> dict[str, Any] | None:
        """Reads and checks the checkpoint, changing nothing (`plait train` asks before it
        runs); None when there is none.

        Raises:
            ValueError: a file of another kind, or written for other settings or data.
            CheckpointError: unreadable, or without a field a resume needs.
        """
        if self.checkpoint_dir is None:
            return None
        path = self.checkpoint_dir / CHECKPOINT_FILE
        remedy = "delete it to start over, or use another checkpoint_dir"
        data = _files.read_json(path, error=CheckpointError, remedy=remedy)
        if data is None:
            return None
        if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path} is not a plait Trainer checkpoint: {remedy}")
        missing = [key for key in _CHECKPOINT_KEYS if key not in data]
        if missing:
            raise CheckpointError(f"{path} has no {', '.join(missing)}: {remedy}")
        other = self._other_settings(data["settings"])
        if other:
            raise ValueError(
                f"{path} was written for {', '.join(other)}; use another checkpoint_dir, or "
                "delete the file to start over"
            )
        return data


_PROGRESS_KEYS = ("epoch", "batch", "initial_score", "scores", "best")
"""Where a training run was, as its checkpoint keeps it."""
_CHECKPOINT_KEYS = ("settings", "parameters", "optimizer", *_PROGRESS_KEYS)
"""What a Trainer checkpoint holds; a file without one of them cannot resume."""


def _note_step(
    report: TrainReport, step: StepReport, train_score: float | None, epoch: int
) -> None:
    """Adds one finished optimizer step to the report (its counts and a history entry)."""
    applied = len(step.accepted)  # kept by the step; keep-best may still undo them
    rejected = sum(r.status in ("rejected", "reverted") for r in step.updates)
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
    checkpointed: bool,
) -> None:
    """Notes on ``report`` what the budget let training spend and what it left undone."""
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
        "which a rerun on the same checkpoint_dir with a larger budget starts from"
        if checkpointed
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
            f"({report.rejected} rejected); see optimizer.history for why"
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
