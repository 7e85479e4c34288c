"""Requirements and instruct-validate-repair: ask, check, ask again with what failed.

A `Requirement` is one thing an output must satisfy, said in words. It is
checked by a Python validator when it has one (``validator(output)`` returns
True, False, or a text saying what is wrong), and otherwise by an LLM judge
that answers ``{"passed": bool, "reason": str}`` through the JSON schema of
`JudgeRequirement`. `Requirements` is the module that checks a list of them,
all concurrently, and returns a `RequirementsReport`.

`ValidateAndRepair` wraps a module: it runs it, checks every requirement, and
while some fail re-runs it with the failures listed as repair feedback (at
most ``max_repairs`` times). It returns a `Validated`: the output and the
report of which requirements pass; or, with ``raise_on_failure=True``, raises
`RequirementsNotMetError` when the last repair still fails.

Example::

    short = Requirement("At most 20 words", lambda out: len(out.answer.split()) <= 20)
    polite = Requirement("The answer is polite")                # judged by the model
    qa = ValidateAndRepair(Predict("question -> answer"), [short, polite]).bind(config)
    result = await qa(question="Why is the sky blue?")
    result.output.answer, result.passed, [r.reason for r in result.report.failures]
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from plait.errors import PlaitError
from plait.module import Module
from plait.modules._wrapping import (
    AttemptCaller,
    Retry,
    call_child,
    feedback_mode,
    maybe_await,
    rollout,
    to_text,
)
from plait.modules.predict import Predict
from plait.signatures.signature import InputField, OutputField, Signature

__all__ = [
    "JudgeRequirement",
    "Requirement",
    "RequirementResult",
    "Requirements",
    "RequirementsNotMetError",
    "RequirementsReport",
    "ValidateAndRepair",
    "Validated",
    "as_requirements",
]

Validator = Callable[[Any], "bool | str | Awaitable[bool | str | None] | None"]
"""``validator(output)``: True (met), False (not met), or a text saying why it is not met."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One thing an output must satisfy.

    Args:
        description: the requirement in words; shown to the judge and, when it
            fails, to the model in the repair feedback.
        validator: optional ``validator(output)`` (sync or async) returning
            True when met, False when not, or a string explaining the failure.
            Without one, an LLM judge decides. A validator that raises counts
            as a failure, with the exception as the reason.
    """

    description: str
    validator: Validator | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.description, str) or not self.description.strip():
            raise ValueError("a Requirement needs a non-empty description of what it demands")
        if self.validator is not None and not callable(self.validator):
            raise TypeError(
                f"Requirement {self.description!r}: validator must be callable(output), "
                f"got {type(self.validator).__name__}"
            )


@dataclass(frozen=True, slots=True)
class RequirementResult:
    """Whether one requirement holds for an output, and why."""

    requirement: Requirement
    passed: bool
    reason: str = ""
    """The judge's or validator's explanation ("" when a validator just said True/False)."""
    judged: bool = False
    """True when an LLM judge decided (no validator)."""


@dataclass(frozen=True, slots=True)
class RequirementsReport:
    """The results of checking every requirement against one output, in requirement order."""

    results: tuple[RequirementResult, ...] = ()

    @property
    def passed(self) -> bool:
        """Whether every requirement holds."""
        return all(result.passed for result in self.results)

    @property
    def failures(self) -> list[RequirementResult]:
        """The requirements that do not hold."""
        return [result for result in self.results if not result.passed]

    @property
    def score(self) -> float:
        """The fraction of requirements that hold (1.0 when there are none)."""
        if not self.results:
            return 1.0
        return sum(result.passed for result in self.results) / len(self.results)

    def feedback(self) -> str:
        """Returns the repair feedback: each failed requirement with the reason it failed."""
        lines = [
            f"- {r.requirement.description}" + (f" (why: {r.reason})" if r.reason else "")
            for r in self.failures
        ]
        if not lines:
            return "Every requirement is met."
        return "The output does not meet these requirements:\n" + "\n".join(lines)

    def __str__(self) -> str:
        marks = [
            f"[{'pass' if r.passed else 'FAIL'}] {r.requirement.description}"
            + (f": {r.reason}" if r.reason and not r.passed else "")
            for r in self.results
        ]
        return "\n".join(marks)


class RequirementsNotMetError(PlaitError):
    """Some requirements still fail after every repair.

    Attributes:
        report: the report of the output that came closest.
        output: that output.
    """

    def __init__(self, message: str, report: RequirementsReport, output: Any) -> None:
        super().__init__(message)
        self.report = report
        self.output = output


class JudgeRequirement(Signature):
    """Decide whether the output meets the requirement. Judge only this requirement, strictly."""

    requirement: str = InputField(description="The requirement the output must meet.")
    task_inputs: str = InputField(description="The inputs of the task that produced the output.")
    output: str = InputField(description="The output to judge.")
    reason: str = OutputField(description="Why it does or does not meet it, in one sentence.")
    passed: bool = OutputField(description="true if the output meets the requirement.")


class Requirements(Module):
    """Checks an output against requirements, all concurrently; returns a `RequirementsReport`.

    Args:
        requirements: `Requirement` objects, or plain strings (judged by the model).
        judge_alias: the resource alias of the LLM judge.

    The judge is a child `Predict` (``judge``, made only when some requirement
    has no validator), so its instructions are a learnable parameter and its
    calls appear in `Module.traces`.

    ``forward(output, inputs=None)``: ``inputs`` (the task's inputs by name)
    are shown to the judge as context.
    """

    def __init__(
        self, requirements: Iterable[Requirement | str], *, judge_alias: str = "llm"
    ) -> None:
        super().__init__()
        items = [requirements] if isinstance(requirements, Requirement | str) else requirements
        self.requirements: tuple[Requirement, ...] = tuple(
            item if isinstance(item, Requirement) else Requirement(item) for item in items
        )
        if not self.requirements:
            raise ValueError("Requirements needs at least one requirement")
        # Only requirements without a validator need the judge; with none, no
        # judge parameters are offered to optimizers.
        needs_judge = any(req.validator is None for req in self.requirements)
        self.judge = (
            Predict(JudgeRequirement, alias=judge_alias, temperature=0.0) if needs_judge else None
        )

    async def forward(
        self, output: Any, inputs: dict[str, Any] | None = None
    ) -> RequirementsReport:
        """Returns the report for ``output``; a judge call that fails raises its error."""
        context = to_text(inputs or {})
        checks = [self._check(req, output, context) for req in self.requirements]
        results: list[RequirementResult] = []
        for result in await asyncio.gather(*checks, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result
            results.append(result)
        return RequirementsReport(tuple(results))

    async def _check(
        self, requirement: Requirement, output: Any, context: str
    ) -> RequirementResult:
        if requirement.validator is None:
            assert self.judge is not None  # made in __init__ when a requirement needs it
            verdict = await call_child(
                self.judge,
                (),
                {
                    "requirement": requirement.description,
                    "task_inputs": context,
                    "output": to_text(output),
                },
            )
            return RequirementResult(requirement, bool(verdict.passed), verdict.reason, True)
        try:
            answer = await maybe_await(requirement.validator(output))
        except Exception as exc:
            return RequirementResult(
                requirement, False, f"the validator raised {type(exc).__name__}: {exc}"
            )
        if isinstance(answer, str):
            return RequirementResult(requirement, False, answer)
        return RequirementResult(requirement, answer is None or bool(answer))

    def extra_repr(self) -> str:
        return f"{len(self.requirements)} requirement(s)"


@dataclass(slots=True)
class Validated:
    """What `ValidateAndRepair` returns: the output and which requirements it meets."""

    output: Any
    report: RequirementsReport
    repairs: int = 0
    """How many repair attempts were made (0: the first output was kept)."""
    history: list[RequirementsReport] = field(default_factory=list)
    """The report of every attempt, in order."""

    @property
    def passed(self) -> bool:
        """Whether the output meets every requirement."""
        return self.report.passed


class ValidateAndRepair(Module):
    """Runs a module, checks requirements, and re-runs it with the failures until they pass.

    Args:
        module: the module to run; its ``forward`` must accept ``history=``
            (Predict, ChainOfThought, ReAct) or ``feedback=`` (your own module),
            through which each repair is told what failed.
        requirements: `Requirement` objects or strings (see `Requirements`).
        max_repairs: most re-runs after the first attempt.
        judge_alias: the resource alias of the LLM judge.
        raise_on_failure: raise `RequirementsNotMetError` when requirements
            still fail after the last repair, instead of returning the
            best-effort `Validated` (the attempt meeting the most requirements,
            the later one on ties).

    Each attempt runs under its own rollout id (``repair:<i>``).
    """

    def __init__(
        self,
        module: Module,
        requirements: Iterable[Requirement | str] | Requirements,
        max_repairs: int = 2,
        *,
        judge_alias: str = "llm",
        raise_on_failure: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"ValidateAndRepair wraps a Module, got {type(module).__name__}")
        if not isinstance(max_repairs, int) or max_repairs < 0:
            raise ValueError(f"ValidateAndRepair needs max_repairs >= 0, got {max_repairs!r}")
        self._mode = feedback_mode(module, "ValidateAndRepair")
        self.module = module
        self.requirements = as_requirements(requirements, judge_alias)
        self.max_repairs = max_repairs
        self.raise_on_failure = raise_on_failure

    async def forward(self, *args: Any, **kwargs: Any) -> Validated:
        """Returns the first output meeting every requirement, or the best effort.

        Raises:
            RequirementsNotMetError: with ``raise_on_failure``, when the last repair fails.
        """
        caller = AttemptCaller(self.module, self._mode, args, kwargs)
        reports: list[RequirementsReport] = []
        best: tuple[int, Any, RequirementsReport] | None = None
        retry: Retry | None = None
        for attempt in range(self.max_repairs + 1):
            with rollout(f"repair:{attempt}"):
                output = await caller(attempt, retry)
                report = await call_child(self.requirements, (output, caller.inputs), {})
            reports.append(report)
            if best is None or report.score >= best[2].score:
                best = (attempt, output, report)
            if report.passed:
                break
            retry = Retry(output, report.feedback() + "\nFix these problems and answer again.")
        assert best is not None
        attempt, output, report = best
        if not report.passed and self.raise_on_failure:
            raise RequirementsNotMetError(
                f"ValidateAndRepair: requirements still fail after {self.max_repairs} "
                f"repair(s):\n{report}",
                report,
                output,
            )
        caller.commit(attempt)
        return Validated(output, report, repairs=len(reports) - 1, history=reports)

    def extra_repr(self) -> str:
        return f"max_repairs={self.max_repairs}"


def as_requirements(
    requirements: Iterable[Requirement | str] | Requirements, judge_alias: str
) -> Requirements:
    """Returns a `Requirements` module for what a wrapper was given."""
    if isinstance(requirements, Requirements):
        return requirements
    return Requirements(requirements, judge_alias=judge_alias)
