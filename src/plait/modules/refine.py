"""Refine: retry a module with feedback on its previous attempt until it is good enough.

Each attempt is scored by a reward function, by requirements, or both. When
it falls short, the next attempt is told what the previous output was and
why it fell short: as conversation turns for modules that take ``history=``
(Predict, ChainOfThought, ReAct), or as a ``feedback=`` text for a module
of your own that takes one. Attempts run one after another, each under its
own rollout id (``refine:<i>``).
"""

from __future__ import annotations

import asyncio
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from plait.module import Module
from plait.modules._wrapping import (
    AttemptCaller,
    Retry,
    call_child,
    either,
    feedback_mode,
    maybe_await,
    to_text,
    valid_output,
)
from plait.modules._wrapping import rollout as rollout_scope
from plait.modules.best_of_n import AllAttemptsFailedError
from plait.modules.requirements import (
    Requirement,
    Requirements,
    RequirementsReport,
    as_requirements,
)

__all__ = ["Refine", "RefineAttempt"]

RewardFn = Callable[[dict[str, Any], Any], Any]
"""``reward_fn(inputs, output)`` → a float, or ``(float, "why")``; may be async."""


@dataclass(slots=True)
class RefineAttempt:
    """One attempt of a Refine: its output, how it scored, and the feedback it produced."""

    index: int
    output: Any = None
    reward: float | None = None
    reason: str = ""
    """The reward function's explanation, when it gave one."""
    report: RequirementsReport | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def score(self) -> tuple[float, float]:
        """How good the attempt is: requirements met first, then the reward."""
        met = self.report.score if self.report is not None else 1.0
        return (met, self.reward if self.reward is not None else 0.0)


class Refine(Module):
    """Runs ``module`` up to ``max_iters`` times, feeding back why each attempt fell short.

    Args:
        module: the module to refine. Its ``forward`` must accept ``history=``
            or ``feedback=`` (see the module docstring). ``base_module=`` is
            the same (an alias for ported code).
        max_iters: most attempts (default 3); ``max_iterations=`` is the same.
        reward_fn: ``reward_fn(inputs, output)`` → a float, or ``(float, reason)``
            whose reason is fed back; sync or async. With neither a reward
            nor requirements, an attempt passes when its output is valid (it
            parsed, and no field is missing).
        requirements: `Requirement` objects or strings (judged by the model);
            an attempt passes only when all hold.
        threshold: the reward an attempt needs to be accepted.
        judge_alias: the resource alias of the requirements' LLM judge.
        refinement_prompt: what the next attempt is told, as a template with
            ``{previous_output}``, ``{feedback}`` (why it fell short) and
            ``{score}`` (e.g. ``"Improve this response: {previous_output}"``);
            by default the reasons an attempt fell short (see `feedback`).

    Returns the first attempt that passes; when none does, the best one
    (most requirements met, then highest reward; the earlier on ties). A
    failed attempt (an exception) is skipped and the next one runs without
    new feedback; if all fail, `AllAttemptsFailedError` lists the errors.

    Example::

        concise = Refine(
            Predict("topic -> tweet"),
            max_iters=3,
            reward_fn=lambda inputs, pred: (len(pred.tweet) <= 280, "Keep it to 280 characters."),
        )
    """

    def __init__(
        self,
        module: Module | None = None,
        max_iters: int | None = None,
        reward_fn: RewardFn | None = None,
        requirements: Iterable[Requirement | str] | Requirements | None = None,
        threshold: float = 1.0,
        *,
        judge_alias: str = "llm",
        base_module: Module | None = None,
        max_iterations: int | None = None,
        refinement_prompt: str | None = None,
    ) -> None:
        super().__init__()
        module = either("Refine", "module", module, "base_module", base_module)
        max_iters = either("Refine", "max_iters", max_iters, "max_iterations", max_iterations, 3)
        if not isinstance(module, Module):
            raise TypeError(f"Refine wraps a Module, got {type(module).__name__}")
        if not isinstance(max_iters, int) or max_iters < 1:
            raise ValueError(f"Refine needs max_iters >= 1, got {max_iters!r}")
        if reward_fn is None and requirements is None:
            reward_fn = valid_output
        if reward_fn is not None and not callable(reward_fn):
            raise TypeError("Refine: reward_fn must be callable(inputs, output)")
        self._mode = feedback_mode(module, "Refine")
        self.module = module
        self.max_iters = max_iters
        self.reward_fn = reward_fn
        self.requirements = (
            as_requirements(requirements, judge_alias) if requirements is not None else None
        )
        self.threshold = threshold
        self.refinement_prompt = _checked_template(refinement_prompt)

    async def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Returns the output of the first passing attempt, or of the best one."""
        caller = AttemptCaller(self.module, self._mode, args, kwargs)
        attempts: list[RefineAttempt] = []
        retry: Retry | None = None
        for index in range(self.max_iters):
            attempt = RefineAttempt(index)
            attempts.append(attempt)
            try:
                with rollout_scope(f"refine:{index}"):
                    attempt.output = await caller(index, retry)
                    await self._score(attempt, caller.inputs)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                attempt.error = exc
                continue
            if self.passes(attempt):
                caller.commit(index)
                return attempt.output
            retry = Retry(attempt.output, self.feedback(attempt))
        best = self._best(attempts)
        caller.commit(best.index)
        return best.output

    # ------------------------------------------------------------ override points
    def passes(self, attempt: RefineAttempt) -> bool:
        """Whether an attempt is good enough. Override this to change the bar."""
        reward_ok = attempt.reward is None or attempt.reward >= self.threshold
        return reward_ok and (attempt.report is None or attempt.report.passed)

    def feedback(self, attempt: RefineAttempt) -> str:
        """Returns what the next attempt is told about ``attempt``. Override to reword it."""
        reasons = []
        if attempt.reward is not None and attempt.reward < self.threshold:
            line = f"It scored {attempt.reward:g}, below the {self.threshold:g} required."
            if attempt.reason:
                line += f" Why: {attempt.reason}"
            reasons.append(line)
        if attempt.report is not None and not attempt.report.passed:
            reasons.append(attempt.report.feedback())
        text = "\n".join(reasons) or "It was not accepted."
        if self.refinement_prompt is not None:
            return self.refinement_prompt.format(
                previous_output=to_text(attempt.output),
                feedback=text,
                score="none" if attempt.reward is None else f"{attempt.reward:g}",
            )
        return f"That answer fell short. {text}\nWrite an improved answer that fixes this."

    # ---------------------------------------------------------------- helpers
    async def _score(self, attempt: RefineAttempt, inputs: dict[str, Any]) -> None:
        if self.reward_fn is not None:
            reward = await maybe_await(self.reward_fn(inputs, attempt.output))
            if isinstance(reward, tuple):
                reward, attempt.reason = reward[0], str(reward[1])
            attempt.reward = float(reward)
        if self.requirements is not None:
            attempt.report = await call_child(self.requirements, (attempt.output, inputs), {})

    def _best(self, attempts: list[RefineAttempt]) -> RefineAttempt:
        done = [a for a in attempts if a.ok]
        if not done:
            raise AllAttemptsFailedError(
                "Refine", [a.error for a in attempts if a.error is not None]
            )
        return max(done, key=lambda a: (a.score(), -a.index))

    def extra_repr(self) -> str:
        return f"max_iters={self.max_iters}, threshold={self.threshold}"


_TEMPLATE_FIELDS = ("previous_output", "feedback", "score")


def _checked_template(template: str | None) -> str | None:
    """Returns a refinement prompt after checking it names only the fields Refine fills in.

    Raises:
        ValueError: it names another field, or is not a valid format string.
    """
    if template is None:
        return None
    if not isinstance(template, str):
        raise TypeError(f"refinement_prompt must be a str, got {type(template).__name__}")

    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ValueError(f"refinement_prompt {template!r} is not a valid template: {exc}") from None
    unknown = [name for name in names if name not in _TEMPLATE_FIELDS]
    if unknown:
        allowed = ", ".join("{" + name + "}" for name in _TEMPLATE_FIELDS)
        raise ValueError(
            f"refinement_prompt names {', '.join('{' + n + '}' for n in unknown)}; it may use "
            f"{allowed} (write {{{{ and }}}} for literal braces)"
        )
    return template
