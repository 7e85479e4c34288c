"""TrainingStep: a program and its loss traced together, so backward sees both.

step = TrainingStep(pipeline, VerifierLoss(exact_match))
step.train()
loss = await step(question, target=answer)   # a Value holding Feedback, with a tape
await loss.backward()                         # feedback reaches pipeline's parameters
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plait.module import Module
from plait.optimization.losses import Loss, VerifierLoss

__all__ = ["TrainingStep"]


class TrainingStep(Module):
    """Runs ``module`` on the inputs, then ``loss_fn(output, target)``, as one graph.

    Args:
        module: the program being trained (reachable as ``step.module``).
        loss_fn: a `Loss` module, or a plain ``check(output, target)`` function,
            which is wrapped in a `VerifierLoss`.
    """

    def __init__(self, module: Module, loss_fn: Loss | Callable[[Any, Any], Any]) -> None:
        super().__init__()
        self.module = module
        self.loss = loss_fn if isinstance(loss_fn, Module) else VerifierLoss(loss_fn)

    def forward(self, *args: Any, target: Any = None, **kwargs: Any) -> Any:
        return self.loss(self.module(*args, **kwargs), target)
