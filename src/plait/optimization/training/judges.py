"""LLM losses: a judge asked for a verdict in a JSON schema, as `Feedback`.

`LLMJudge` (a score and what to improve), `LLMRubricLoss` (one verdict per criterion),
`LLMPreferenceLoss` (which of two outputs is better), `LLMRankingLoss` (an order of
several); each an ``async def forward`` module on `_JudgeLoss`, whose reply that does not
parse after one re-ask becomes a `Feedback` with score None (see
`plait.optimization.training.losses`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model

from plait.backends.types import Message, Request, Response, SamplingOptions
from plait.errors import StructuredOutputError
from plait.execution.llm_call import generate
from plait.execution.structured import ask_structured, output_type_for
from plait.feedback import BackwardContext, BackwardResult, Feedback, clip
from plait.optimization.training.losses import (
    _ASKED_ITEMS,
    _ITEM_CHARS,
    Loss,
    RankingFeedback,
    _check_scale,
    _items,
    _shown,
    _Unusable,
)

__all__ = ["LLMJudge", "LLMPreferenceLoss", "LLMRankingLoss", "LLMRubricLoss"]


def _improvements(description: str) -> Any:
    return Field(description=description, json_schema_extra={"maxItems": _ASKED_ITEMS})


class JudgeVerdict(BaseModel):
    critique: str = Field(description="What is right and wrong with the output, briefly.")
    score: float = Field(
        description="From 0 (worst) to the maximum named in the instructions.", allow_inf_nan=False
    )
    improvements: list[str] = _improvements(
        "Concrete changes that would make the output better; empty if none."
    )


class CriterionVerdict(BaseModel):
    comment: str = Field(description="How well the output meets this criterion, briefly.")
    score: float = Field(
        description="From 0 (not at all) to the maximum named in the instructions.",
        allow_inf_nan=False,
    )


class CandidateVerdict(BaseModel):
    comment: str = Field(description="Strengths and weaknesses of this candidate, briefly.")
    rank: int = Field(description="1 for the best candidate; equal ranks mean a tie.")


class _JudgeLoss(Loss):
    """Shared machinery of the LLM losses: one structured call, parsed or failed soft."""

    default_instructions = ""
    default_criteria = ""
    """What the judge weighs when ``criteria`` is not given (losses that take criteria)."""

    def __init__(
        self,
        alias: str,
        criteria: str | None = None,
        *,
        instructions: str | None = None,
        temperature: float = 0.0,
        max_tokens: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(alias, str) or not alias:
            raise ValueError(f"{type(self).__name__} needs a non-empty alias string, got {alias!r}")
        self.alias = alias
        self.criteria = self.default_criteria if criteria is None else criteria
        self.instructions = instructions or self.default_instructions
        self.temperature = temperature
        self.max_tokens = max_tokens

    async def _ask(self, user: str, verdict_type: Any) -> tuple[Any, _Unusable | None]:
        """Returns ``(verdict, None)``, or ``(None, feedback)`` when the reply is unusable."""
        output = output_type_for(verdict_type)
        request = Request(
            messages=(Message("system", self.instructions), Message("user", user)),
            options=SamplingOptions(temperature=self.temperature, max_tokens=self.max_tokens),
            response_schema=output.schema,
        )

        def complete(request: Request, accept: Callable[[Response], bool]) -> Awaitable[Response]:
            return generate(self.alias, request, accept=accept)

        try:
            reply = await ask_structured(
                complete,
                request,
                output.read,
                expected=output.expected,
                label=f"{type(self).__name__} (alias {self.alias!r})",
                target=output.name,
            )
        except StructuredOutputError as exc:
            text = f"The judge's reply was unusable: {clip(exc, 600)} Reply: {clip(exc.raw, 300)!r}"
            return None, _Unusable(text)
        return reply.value, None

    def extra_repr(self) -> str:
        return f"alias={self.alias!r}"


def _scaled(score: float, scale: float) -> float:
    return max(0.0, min(float(scale), float(score))) / float(scale)


class LLMJudge(_JudgeLoss):
    """An LLM grades the output against criteria: critique, score and improvements.

    Args:
        alias: the resource alias of the judge model.
        criteria: what a good output is, in words.
        scale: the judge scores from 0 to ``scale``; `Feedback.score` is that
            divided by ``scale``.
        instructions: replaces the judge's system prompt.
        temperature: sampling temperature of the judge (0: as repeatable as the
            provider allows).
        max_tokens: cap on the judge's reply.

    Example::

        judge = LLMJudge("judge", criteria="Answers the question in one correct sentence.")
        step = TrainingStep(program, judge)
        loss = await step(question, target=reference_answer)   # target is optional
    """

    default_instructions = (
        "You are a strict, fair evaluator. Judge the output against the criteria "
        "(and the reference answer, if one is given). Reply with a JSON object: "
        "critique (what is right and wrong, briefly), score (a number from 0, worst, "
        "to {scale}, best), improvements (concrete changes that would make the output "
        "better; empty if none)."
    )

    def __init__(
        self,
        alias: str,
        criteria: str = "The output is correct, complete and clear.",
        *,
        scale: float = 10,
        instructions: str | None = None,
        temperature: float = 0.0,
        max_tokens: int | None = None,
    ) -> None:
        _check_scale(scale)
        super().__init__(
            alias,
            criteria,
            instructions=instructions or self.default_instructions.format(scale=scale),
            temperature=temperature,
            max_tokens=max_tokens,
        )
        self.scale = scale

    async def forward(self, output: Any, target: Any = None) -> Feedback:
        parts = [f"Criteria: {self.criteria}", _shown("Output to judge", output)]
        if target is not None:
            parts.append(_shown("Reference answer", target))
        verdict, failed = await self._ask("\n\n".join(parts), JudgeVerdict)
        if failed is not None:
            return failed
        return Feedback(
            text=clip(verdict.critique.strip() or "The judge gave no critique.", 1000),
            score=_scaled(verdict.score, self.scale),
            items=_items(verdict.improvements),
        )


class LLMRubricLoss(_JudgeLoss):
    """An LLM scores the output on each criterion of a rubric; the score is their mean.

    The request's JSON schema has one required field per criterion (its
    description is the criterion's text), so the judge cannot skip one.

    Args:
        alias: the resource alias of the judge model.
        rubric: ``{name: what it means}``, a list of criteria, or one text.
        scale: each criterion is scored from 0 to ``scale``.
        instructions, temperature, max_tokens: as for `LLMJudge`.

    Example::

        loss = LLMRubricLoss("judge", {
            "accuracy": "Every fact in the summary is in the source.",
            "brevity": "At most three sentences.",
        })
    """

    default_instructions = (
        "You are a strict, fair evaluator. Score the output on every criterion of the "
        "rubric, from 0 (not met at all) to {scale} (fully met), with a short comment "
        "each, then list concrete improvements (empty if none). Reply with a JSON object."
    )

    def __init__(
        self,
        alias: str,
        rubric: str | Sequence[str] | Mapping[str, str],
        *,
        scale: float = 5,
        instructions: str | None = None,
        temperature: float = 0.0,
        max_tokens: int | None = None,
    ) -> None:
        _check_scale(scale)
        super().__init__(
            alias,
            instructions=instructions or self.default_instructions.format(scale=scale),
            temperature=temperature,
            max_tokens=max_tokens,
        )
        self.scale = scale
        self.rubric = _rubric_of(rubric)
        self._verdict_type = _rubric_model(tuple(self.rubric.items()))

    async def forward(self, output: Any, target: Any = None) -> Feedback:
        criteria = "\n".join(f"- {key}: {text}" for key, text in self.rubric.items())
        parts = [f"Rubric:\n{criteria}", _shown("Output to judge", output)]
        if target is not None:
            parts.append(_shown("Reference answer", target))
        verdict, failed = await self._ask("\n\n".join(parts), self._verdict_type)
        if failed is not None:
            return failed
        lines, scores, weak = [], [], []
        for key in self.rubric:
            each: CriterionVerdict = getattr(verdict, key)
            scores.append(_scaled(each.score, self.scale))
            lines.append(
                f"{key}: {each.score:g}/{self.scale:g} — {clip(each.comment.strip(), 300)}"
            )
            if scores[-1] < 1.0 and each.comment.strip():
                weak.append(f"{key}: {each.comment.strip()}")
        items = _items(verdict.improvements) or _items(weak)
        return Feedback("Rubric scores:\n" + "\n".join(lines), sum(scores) / len(scores), items)


def _rubric_of(rubric: Any) -> dict[str, str]:
    """Returns ``{field name: criterion}``; names are identifiers, unique, not ``improvements``."""
    if isinstance(rubric, str):
        pairs = [("rubric", rubric)]
    elif isinstance(rubric, Mapping):
        pairs = [(str(name), str(text)) for name, text in rubric.items()]
    elif isinstance(rubric, Sequence):
        pairs = [(f"criterion_{i + 1}", str(text)) for i, text in enumerate(rubric)]
    else:
        raise TypeError(
            f"rubric must be a text, a list of criteria or a mapping name -> criterion, "
            f"got {type(rubric).__name__}"
        )
    if not pairs:
        raise ValueError("LLMRubricLoss needs at least one criterion in its rubric")
    out: dict[str, str] = {}
    for i, (name, text) in enumerate(pairs):
        key = re.sub(r"\W+", "_", name).strip("_").lower() or f"criterion_{i + 1}"
        if key[0].isdigit() or key == "improvements":
            key = f"criterion_{key}"
        while key in out:
            key += "_"
        out[key] = text
    return out


@functools.lru_cache(maxsize=64)
def _rubric_model(rubric: tuple[tuple[str, str], ...]) -> Any:
    fields: dict[str, Any] = {
        key: (CriterionVerdict, Field(description=text)) for key, text in rubric
    }
    fields["improvements"] = (
        list[str],
        _improvements("Concrete changes that would make the output better; empty if none."),
    )
    return create_model("RubricVerdict", **fields)


class LLMPreferenceLoss(_JudgeLoss):
    """An LLM compares the output with a reference answer or with alternatives.

    ``target`` is the reference (any value), or a list of alternative outputs.
    The score is 1 when the judge prefers the output, 0.5 for a tie, 0 when
    it prefers the reference or an alternative.

    Args:
        alias: the resource alias of the judge model.
        criteria: what makes one answer better than another.
        instructions, temperature, max_tokens: as for `LLMJudge`.

    Example::

        loss = LLMPreferenceLoss("judge", criteria="More helpful and more accurate.")
        feedback = await loss(answer, [other_answer_1, other_answer_2])
    """

    default_instructions = (
        "You compare answers. Say how the candidate answer compares with the others on "
        "the criteria, which answer is better (or 'tie'), and what concrete changes would "
        "make the candidate better (empty if none). Reply with a JSON object."
    )

    default_criteria = "Which answer is more correct, complete and clear?"

    async def forward(self, output: Any, target: Any = None) -> Feedback:
        if target is None or (isinstance(target, list | tuple) and not target):
            raise ValueError(
                "LLMPreferenceLoss compares the output with something: pass a reference "
                "answer or a list of alternative outputs as target"
            )
        if isinstance(target, list | tuple):
            others = [(f"alternative {i + 1}", item) for i, item in enumerate(target)]
        else:
            others = [("reference", target)]
        labels = ("candidate", *(label for label, _ in others))
        parts = [f"Criteria: {self.criteria}", _shown("candidate", output)]
        parts.extend(_shown(label, item) for label, item in others)
        parts.append(f"Answer 'better' with one of: {', '.join(labels)}, tie.")
        verdict, failed = await self._ask("\n\n".join(parts), _preference_model(labels))
        if failed is not None:
            return failed
        better = verdict.better
        score = 1.0 if better == "candidate" else 0.5 if better == "tie" else 0.0
        verdict_line = {
            "candidate": "The judge preferred the output.",
            "tie": "The judge found the output as good as the best alternative.",
        }.get(better, f"The judge preferred the {better} over the output.")
        text = f"{verdict_line} {clip(verdict.comparison.strip(), 1000)}".strip()
        return Feedback(text, score, _items(verdict.improvements))


@functools.lru_cache(maxsize=32)
def _preference_model(labels: tuple[str, ...]) -> Any:
    choice = Literal[(*labels, "tie")]  # type: ignore[valid-type]
    return create_model(
        "PreferenceVerdict",
        comparison=(str, Field(description="How the candidate compares with the others.")),
        better=(choice, Field(description="The better answer, or 'tie'.")),
        improvements=(
            list[str],
            _improvements("Concrete changes that would make the candidate better."),
        ),
    )


class LLMRankingLoss(_JudgeLoss):
    """An LLM ranks several candidate outputs, given as a list, best first.

    Returns a `RankingFeedback` (``score`` None: a ranking is relative; see
    ``scores``). Backward tells each candidate's producer about its own
    place and the judge's comment on it, plus the general improvements.

    Args:
        alias: the resource alias of the judge model.
        criteria: what makes one candidate better than another.
        instructions, temperature, max_tokens: as for `LLMJudge`.

    Example::

        class Candidates(Module):
            def forward(self, q):
                return self.loss([self.a(q), self.b(q), self.c(q)], q)

    Called bound on its own, a list as first argument means a batch (as for
    every module): rank one set with ``(feedback,) = await loss([candidates])``.
    """

    default_instructions = (
        "You rank candidate answers. Give every candidate a rank (1 is best; equal "
        "ranks for equally good ones) and a short comment, then list concrete changes "
        "that would improve the weaker candidates (empty if none). Reply with a JSON object."
    )

    default_criteria = "Which candidate is the most correct, complete and clear?"

    async def forward(self, outputs: Sequence[Any], target: Any = None) -> Feedback:
        if isinstance(outputs, str | bytes) or not isinstance(outputs, Sequence):
            raise TypeError(
                f"LLMRankingLoss ranks a list of candidate outputs, got {type(outputs).__name__}"
            )
        count = len(outputs)
        if count < 2:
            raise ValueError(f"LLMRankingLoss needs at least 2 candidates to rank, got {count}")
        parts = [f"Criteria: {self.criteria}"]
        if target is not None:
            parts.append(_shown("What a good answer looks like", target))
        parts.extend(_shown(f"candidate_{i + 1}", item) for i, item in enumerate(outputs))
        verdict, failed = await self._ask("\n\n".join(parts), _ranking_model(count))
        if failed is not None:
            return failed
        each = [getattr(verdict, f"candidate_{i + 1}") for i in range(count)]
        ranks = [max(1, min(count, v.rank)) for v in each]
        ranking = sorted(range(count), key=lambda i: (ranks[i], i))
        scores = [sum(r > ranks[i] for r in ranks) / (count - 1) for i in range(count)]
        comments = [clip(v.comment.strip(), _ITEM_CHARS) for v in each]
        lines = [f"{place}. candidate {i + 1}: {comments[i]}" for place, i in enumerate(ranking, 1)]
        return RankingFeedback(
            text="Ranking, best first:\n" + "\n".join(lines),
            score=None,
            items=_items(verdict.improvements),
            ranking=ranking,
            scores=scores,
            comments=comments,
        )

    def backward(self, feedback: str, ctx: BackwardContext) -> BackwardResult:
        ranked = ctx.output
        if not isinstance(ranked, RankingFeedback) or not ranked.scores:
            return super().backward(feedback, ctx)
        count = len(ranked.scores)
        general = "\n".join(f"- {item}" for item in ranked.items)
        result = BackwardResult()
        for i in range(count):
            place = ranked.ranking.index(i) + 1
            text = (
                f"This output was candidate {i + 1} of {count} and was ranked {place} of "
                f"{count} by the judge: {ranked.comments[i]}"
            )
            result.input_feedback[f"outputs[{i}]"] = f"{text}\n{general}".strip()
        return result


@functools.lru_cache(maxsize=32)
def _ranking_model(count: int) -> Any:
    fields: dict[str, Any] = {f"candidate_{i + 1}": (CandidateVerdict, ...) for i in range(count)}
    fields["improvements"] = (
        list[str],
        _improvements("Concrete changes that would improve the weaker candidates."),
    )
    return create_model("RankingVerdict", **fields)
