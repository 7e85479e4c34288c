"""A Trainer's cost estimate: what `Trainer.fit` would spend, before it runs.

From the schedule (validations, epochs of minibatches, one optimizer step per
minibatch, a judge's call per example) and one run of the program measured on a
sample; an optimizer step is sized by one made for real on copies (`_sampled_step`).
See `plait.optimization.costs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plait.execution import run
from plait.execution.run import awaitable_or_result
from plait.optimization import costs
from plait.optimization.costs import Phase, Proposal, Range, check_sample
from plait.optimization.costs.parts import repeat_feedback, sample_twice
from plait.optimization.training.backward import backward
from plait.optimization.training.step import on_examples
from plait.resources import ResourceManager
from plait.resources.usage import Budget, metered
from plait.values import Value

if TYPE_CHECKING:
    from plait.optimization.training.trainer_parts import TrainerParts


class EstimatedTrainer:
    """The estimate of a `Trainer` (its mixin: what it uses of the Trainer is `TrainerParts`)."""

    def estimate(self: TrainerParts, sample: int = 2) -> Any:
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
        check_sample(sample)
        return awaitable_or_result(self._estimate(sample))

    def _minibatch_sizes_left(self: TrainerParts, position: tuple[int, int]) -> list[int]:
        """The sizes of the minibatches still to train on from ``position`` (epoch, batch)."""
        batches, m = self._batches(), len(self.train_set)
        return [
            min(self.batch_size, m - batch * self.batch_size)
            for epoch in range(position[0], self.epochs)
            for batch in range(position[1] if epoch == position[0] else 0, batches)
        ]

    async def _estimate(self: TrainerParts, sample: int) -> Any:
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
        step_calls = _step_calls(self.optimizer, feedback)
        proposal = None
        if sample > 0 and steps_left:
            with metered() as meter, costs.quiet():  # the copy's warnings are not the run's
                first, then = await self._sampled_step(sample, len(step_calls))
            spent += meter.calls
            # the first step meets the parameters as they are, later ones what it made them
            proposal = first.blend(then, 1 - 1 / steps_left) if first is not None else None
        validations = self.epochs - position[0]
        judge = getattr(self.step.loss, "alias", None)
        other, grown = _optimizer_calls(self.optimizer, steps_left, len(step_calls), proposal)
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
            *_judged(judge, examples_left),
        ]
        return costs.from_schedule(
            f"Trainer of {type(self.module).__name__}: {self.epochs} epoch(s) of {batches} "
            f"minibatches, {n} validation examples",
            phases,
            size,
            ResourceManager.shared(self.resources),
            sample_calls=spent,
            budget=Budget.of(self.max_calls, self.max_tokens, self.max_cost),
        )

    async def _sampled_step(self: TrainerParts, sample: int, least_calls: int) -> tuple[Any, Any]:
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
        # import time: only an estimate that samples a step
        from plait.optimization.training.updates import as_text

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


def _optimizer_calls(
    optimizer: Any, steps_left: int, calls_per_step: int, proposal: Any
) -> tuple[Range, float]:
    """Returns the calls outside the program of the optimizer steps left, and the characters
    their updates add to the prompts of the runs after them.

    With a sampled ``proposal``, counted in updates of a parameter, each as the sampled
    one; without, in calls: low no update asked for, high every call re-asked as often as
    allowed.
    """
    updates = steps_left * calls_per_step
    grown = 0.0
    if proposal is not None:
        learnable = sum(p.requires_grad for _, p in optimizer.named_parameters())
        other = Range(0, steps_left * learnable, steps_left * learnable)
        grown = proposal.grown * learnable
    else:
        other = Range(0, updates, (1 + optimizer.max_retries) * updates)
    return other, grown


def _judged(judge: Any, examples: int) -> list[Phase]:
    """Returns the phase of the loss's judge (a call per example), when the loss has one."""
    if not isinstance(judge, str):
        return []
    return [
        Phase(
            f"the loss's judge on {examples} examples",
            other=Range(*(examples,) * 3),
            other_alias=judge,
        )
    ]


def _step_calls(optimizer: Any, feedback: list[str]) -> list[tuple[int, int]]:
    """Returns the (prompt, reply) characters of the calls one optimizer step makes, shown
    ``feedback`` on each learnable parameter (`Optimizer.estimated_calls`)."""
    return [
        call
        for name, param in optimizer.named_parameters()
        if param.requires_grad
        for call in optimizer.estimated_calls(name, param, feedback)
    ]
