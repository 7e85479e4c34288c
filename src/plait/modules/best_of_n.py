"""BestOfN: run a module n times concurrently and keep the attempt a reward likes best.

The n attempts start together (each an asyncio task inside one
``async def forward``), so they overlap within the run's resource limits.
Each attempt has its own rollout id (``best_of_n:<i>``): the response cache
keeps their replies apart and the local backend samples each differently,
while a rerun of the program gets the same ids and so the same cached replies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plait.errors import PlaitError
from plait.module import Module
from plait.modules._wrapping import (
    call_child,
    either,
    maybe_await,
    named_inputs,
    rollout,
    valid_output,
)

__all__ = ["AllAttemptsFailedError", "Attempt", "BestOfN"]

RewardFn = Callable[[dict[str, Any], Any], Any]
"""``reward_fn(inputs, output) -> float`` (may be async); higher is better."""


class AllAttemptsFailedError(PlaitError):
    """Every attempt of a BestOfN (or every try of a Refine) failed.

    Attributes:
        errors: the exception of each attempt, in attempt order.
    """

    def __init__(self, owner: str, errors: list[BaseException], unit: str = "attempt") -> None:
        lines = "\n".join(f"  {unit} {i}: {type(e).__name__}: {e}" for i, e in enumerate(errors))
        super().__init__(f"{owner}: all {len(errors)} {unit}s failed:\n{lines}")
        self.errors = errors


@dataclass(slots=True)
class Attempt:
    """One attempt of a BestOfN: its output and reward, or why it failed."""

    index: int
    rollout_id: str
    output: Any = None
    reward: float | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class BestOfN(Module):
    """Runs ``module`` ``n`` times concurrently and returns the output with the best reward.

    Args:
        module: the module to sample (a `Predict`, a pipeline, another wrapper);
            ``base_module=`` is the same (an alias for ported code).
        n: how many attempts (default 3); ``N=`` is the same (an alias for ported code).
        reward_fn: ``reward_fn(inputs, output) -> float``, sync or async;
            ``inputs`` are the call's arguments by name. Without one, an
            attempt scores 1.0 when its output is valid (it parsed, and no
            field is missing) and the threshold defaults to 1.0: the first
            valid attempt in attempt order wins.
        threshold: when set, the first attempt *in attempt order* whose reward
            reaches it wins, and attempts after it that are still running are
            cancelled (the result does not depend on which finished first).

    Failed attempts (an exception from the module or the reward function) are
    skipped; if all fail, `AllAttemptsFailedError` lists every error. Ties go
    to the earlier attempt.

    Example::

        qa = Predict("question -> answer")
        best = BestOfN(qa, n=4, reward_fn=lambda inputs, pred: float(len(pred.answer) < 40))
        prediction = await best(question="Why is the sky blue?")
    """

    def __init__(
        self,
        module: Module | None = None,
        n: int | None = None,
        reward_fn: RewardFn | None = None,
        threshold: float | None = None,
        *,
        base_module: Module | None = None,
        N: int | None = None,
    ) -> None:
        super().__init__()
        module = either("BestOfN", "module", module, "base_module", base_module)
        n = either("BestOfN", "n", n, "N", N, default=3)
        if not isinstance(module, Module):
            raise TypeError(f"BestOfN wraps a Module, got {type(module).__name__}")
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"BestOfN needs n >= 1 attempts, got {n!r}")
        if reward_fn is None:
            reward_fn = valid_output
            threshold = 1.0 if threshold is None else threshold
        if not callable(reward_fn):
            raise TypeError("BestOfN needs reward_fn(inputs, output) -> float")
        self.module = module
        self.n = n
        self.reward_fn = reward_fn
        self.threshold = threshold

    async def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Returns the output of the best attempt (see the class docstring)."""
        attempts = await self.attempts(*args, **kwargs)
        return self.select(attempts).output

    async def attempts(self, *args: Any, **kwargs: Any) -> list[Attempt]:
        """Runs the attempts and returns them all, in attempt order.

        With a threshold, attempts cancelled after the winner was known are
        left out. Override `select` to change how the winner is picked.
        """
        inputs = named_inputs(self.module, args, kwargs)
        tasks = [asyncio.create_task(self._attempt(i, inputs, args, kwargs)) for i in range(self.n)]
        try:
            if self.threshold is None:
                return list(await asyncio.gather(*tasks))
            return await self._until_threshold(tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def select(self, attempts: list[Attempt]) -> Attempt:
        """Returns the winning attempt. Override this to change the choice.

        Raises:
            AllAttemptsFailedError: no attempt succeeded.
        """
        done = [a for a in attempts if a.ok]
        if not done:
            raise AllAttemptsFailedError(
                "BestOfN", [a.error for a in attempts if a.error is not None]
            )
        if self.threshold is not None:
            for attempt in done:
                if attempt.reward is not None and attempt.reward >= self.threshold:
                    return attempt
        return max(done, key=lambda a: (a.reward, -a.index))  # ties: the earlier attempt

    async def _attempt(
        self, index: int, inputs: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Attempt:
        with rollout(f"best_of_n:{index}") as rollout_id:
            attempt = Attempt(index, rollout_id)
            try:
                attempt.output = await call_child(self.module, args, kwargs)
                attempt.reward = float(await maybe_await(self.reward_fn(inputs, attempt.output)))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                attempt.error = exc
            return attempt

    async def _until_threshold(self, tasks: list[asyncio.Task[Attempt]]) -> list[Attempt]:
        """Waits until the first attempt in order that meets the threshold is known."""
        assert self.threshold is not None
        pending = set(tasks)
        while True:
            for task in tasks:
                if not task.done():
                    break
                attempt = task.result()
                if attempt.ok and attempt.reward is not None and attempt.reward >= self.threshold:
                    return [t.result() for t in tasks if t.done() and not t.cancelled()]
            else:
                return [t.result() for t in tasks]
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)

    def extra_repr(self) -> str:
        threshold = f", threshold={self.threshold}" if self.threshold is not None else ""
        return f"n={self.n}{threshold}"
