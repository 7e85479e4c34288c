"""TrainingStep: a program and its loss traced together, so backward sees both.

step = TrainingStep(pipeline, VerifierLoss(exact_match))
step.train()
loss = await step(question, answer)           # or step(question, target=answer)
await loss.backward()                         # feedback reaches pipeline's parameters
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from plait.module import Module
from plait.optimization.training.losses import Loss, VerifierLoss

__all__ = ["PROGRAM_PATH", "TrainingStep", "on_examples"]

_NO_TARGET: Any = object()


class TrainingStep(Module):
    """Runs ``module`` on the inputs, then ``loss_fn(output, target)``, as one graph.

    The target is ``target=`` or, as in ``await step(input, target)``, the
    last positional argument when there are more positional arguments than
    the program's ``forward`` requires (a program taking one input gets
    ``step(x, t)``; one taking two gets ``step(a, b, t)``). A loss without a
    reference (an LLM judge) needs no target: ``step(x)``.

    A step that is not bound finds the resources of the program it wraps
    (``TrainingStep(program.bind(config), loss)``), or those of ``ExecutionSettings``.

    Args:
        module: the program being trained (reachable as ``step.module``).
        loss_fn: a `Loss` module, or a plain ``check(output, target)`` function,
            which is wrapped in a `VerifierLoss`.
    """

    def __init__(self, module: Module, loss_fn: Loss | Callable[[Any, Any], Any]) -> None:
        super().__init__()
        self.module = module
        self.loss = loss_fn if isinstance(loss_fn, Module) else VerifierLoss(loss_fn)
        self._required = _required_positional(module)

    def forward(self, *args: Any, target: Any = _NO_TARGET, **kwargs: Any) -> Any:
        if target is _NO_TARGET:
            target = None
            if len(args) >= 2 and len(args) > self._required:
                *args, target = args  # type: ignore[assignment]
        return self.loss(self.module(*args, **kwargs), target)


def _required_positional(module: Module) -> int:
    """Returns how many positional arguments ``module.forward`` requires."""
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        for p in parameters
    )


class _OnExample(Module):
    """Runs a training step on an ``(input, target)`` pair, so a batch carries its targets."""

    def __init__(self, step: TrainingStep) -> None:
        super().__init__()
        self.step = step

    def forward(self, example: Any) -> Any:
        inputs, target = example
        return self.step(inputs, target=target)


PROGRAM_PATH = "step.module"
"""Where the module of `on_examples` holds the program: the path its modules have under it."""


def on_examples(step: TrainingStep) -> Module:
    """Returns a module that runs ``step`` on one ``(input, target)`` pair.

    A batch passes its list as the first argument and shares keyword
    arguments, so a per-example ``target=`` cannot ride along; with this
    wrapper each batch item is the pair itself: ``await run(on_examples(step),
    pairs)`` gives one loss per example, in one batch under one set of limits.
    """
    return _OnExample(step)
