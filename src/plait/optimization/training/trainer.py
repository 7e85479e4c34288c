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
With ``state=`` and no ``checkpoint_dir``, the checkpoint is one key of the state
store instead, and a `Trainer` on any machine with the same store continues.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
from pathlib import Path
from typing import Any

from plait import _context
from plait.errors import BudgetExceededError
from plait.execution import run
from plait.execution.run import awaitable_or_result
from plait.execution.settings import check_served
from plait.feedback import Feedback
from plait.module import Module
from plait.optimization.checkpoint_place import CheckpointPlace
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
from plait.optimization.training.report import (
    NOTHING_VALIDATED,
    TrainReport,
    _cut_short,
    _keep_best_evidence,
    _note_step,
    _Progress,
    _settle,
    _summary,
    _tell_budget,
)
from plait.optimization.training.step import PROGRAM_PATH, TrainingStep, on_examples
from plait.optimization.training.trainer_checkpoint import CheckpointedTrainer
from plait.optimization.training.trainer_estimate import EstimatedTrainer
from plait.resources.state import StateURL
from plait.resources.usage import Budget, active_budgets, budgeted
from plait.values import Value

__all__ = ["TrainReport", "Trainer"]

logger = logging.getLogger("plait.optimization")


class Trainer(CheckpointedTrainer, EstimatedTrainer):
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
        state: a state store URL (``postgresql://…`` or an SQLite path) that
            keeps the checkpoint when no ``checkpoint_dir`` is given (one key
            of its table ``learning``, named by the settings and data), so a
            rerun on any machine with the same store resumes.
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
        state: str | os.PathLike[str] | StateURL | None = None,
        progress: bool | None = None,
        shuffle: bool = True,
        seed: int = 0,
        max_concurrent: int | None = None,
        max_calls: int | None = None,
        max_tokens: int | None = None,
        max_cost: float | None = None,
    ) -> None:
        Budget.of(max_calls, max_tokens, max_cost)  # checks the limits now, not in fit()
        step, optimizer = _step_and_optimizer(
            step_or_module, loss_fn, optimizer, epochs, batch_size
        )
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
        self.state = StateURL.parse(state) if state is not None else None
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
        self._writing = CheckpointPlace()
        """Where the running `fit` writes its checkpoint (`_place`), held until it ends."""
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

    def fit(self) -> Any:
        """Trains for the remaining epochs and leaves the program with its best parameters.

        Returns the `TrainReport`: awaited inside a running event loop
        (``report = await trainer.fit()``), directly from a script with no
        loop running, as a module call does. Cancelled, it leaves the program
        with the best parameters validated so far and its report in `report`.
        """
        return awaitable_or_result(observed_run(self, self.module, self._fit(), _summary))

    async def _fit(self) -> TrainReport:
        """The body of `fit`: the training loop within the budget, if there is one."""
        profiler = _context.PROFILE.get()
        if profiler is not None:  # its report names the program's modules as validation does
            profiler.show_program_at(PROGRAM_PATH, type(self.module).__name__)
        self._check_optimizer_alias()
        budget = Budget.of(self.max_calls, self.max_tokens, self.max_cost)
        report = self.report = TrainReport(initial_score=0.0, best_score=0.0, best_epoch=0)
        self._reached = None
        self._writing = self._place()
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
        finally:
            await self._writing.aclose()  # the last checkpoint written, or told not
        if budget is not None:
            _tell_budget(report, budget, state, self._batches(), self._kept_in())
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


def _step_and_optimizer(
    step_or_module: TrainingStep | Module,
    loss_fn: Any,
    optimizer: Optimizer | None,
    epochs: int,
    batch_size: int,
) -> tuple[TrainingStep, Optimizer]:
    """Returns the `TrainingStep` a `Trainer` runs and its optimizer, checked.

    Raises:
        ValueError: both or neither of a step and a loss, no optimizer, or bad sizes.
    """
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
    return step, optimizer
