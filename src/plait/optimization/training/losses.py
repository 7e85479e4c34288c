"""Losses: modules that judge an output and return `Feedback`.

A loss is the last node of a `TrainingStep`'s graph. Its backward sends its
feedback to the output it judged, never to the target.

LLM losses (`LLMJudge`, `LLMRubricLoss`, `LLMPreferenceLoss`,
`LLMRankingLoss`) are ``async def forward`` modules that ask their alias for a
reply in a JSON schema (grammar-constrained on llama.cpp, ``json_schema`` on
OpenAI), so even a 135M model's verdict parses. A reply that still does not
parse after one re-ask becomes a `Feedback` with score None saying so: a
training step never crashes on a confused judge, and backward sends nothing
from such a verdict (there is nothing to learn from it).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model

from plait._together import together
from plait.backends.types import Message, Request, Response, SamplingOptions
from plait.containers import ModuleList
from plait.errors import StructuredOutputError
from plait.execution.llm_call import generate
from plait.execution.structured import ask_structured, output_type_for
from plait.feedback import BackwardContext, BackwardResult, Feedback, clip
from plait.module import Module
from plait.optimization.evaluation import as_metric

__all__ = [
    "CompositeLoss",
    "HumanFeedbackLoss",
    "LLMJudge",
    "LLMPreferenceLoss",
    "LLMRankingLoss",
    "LLMRubricLoss",
    "Loss",
    "RankingFeedback",
    "VerifierLoss",
]

MAX_ITEMS = 8
"""Most improvement items one loss returns (CompositeLoss keeps at most this many too)."""
_ITEM_CHARS = 300
_SHOWN_CHARS = 2000
"""Characters of an output, target or alternative shown to a judge."""


class Loss(Module):
    """Base class of losses: ``forward(output, target) -> Feedback``.

    Override ``forward`` (``async def`` when it calls an LLM). The backward
    is shared: the feedback goes to the judged output (``forward``'s first
    parameter, whatever its name) only, never to the target; a verdict the
    judge could not give (score None from an unusable reply) sends nothing.
    """

    def forward(self, output: Any, target: Any = None) -> Feedback | Awaitable[Feedback]:
        raise NotImplementedError(f"{type(self).__name__} must implement forward(output, target)")

    def backward(self, feedback: str, ctx: BackwardContext) -> BackwardResult:
        if isinstance(ctx.output, _Unusable):
            return BackwardResult()
        judged = next(iter(inspect.signature(self.forward).parameters), "output")
        return BackwardResult(input_feedback={judged: feedback})


class VerifierLoss(Loss):
    """A loss from a Python check, for tasks with a checkable answer.

    Args:
        check: ``check(output, target)`` returning a bool (right/wrong), a float
            score in [0, 1], a message string (a complaint; empty means fine),
            or a `Feedback`; a DSPy metric ``check(example, pred, trace=None)``
            is called in its own order (`plait.evaluation.as_metric`).
        name: how the check is named in feedback.

    Example::

        loss = VerifierLoss(lambda out, target: out.strip().lower() == target)
    """

    def __init__(self, check: Callable[[Any, Any], Any], name: str | None = None) -> None:
        super().__init__()
        self.check = as_metric(check)
        self.check_name = name or getattr(check, "__name__", "check")

    def forward(self, output: Any, target: Any = None) -> Feedback:
        verdict = self.check(output, target)
        if isinstance(verdict, Feedback):
            return verdict
        expected = "" if target is None else f" Expected: {target!r}."
        if isinstance(verdict, bool):
            if verdict:
                return Feedback(f"The output passed {self.check_name}.", score=1.0)
            return Feedback(
                f"The output failed {self.check_name}.{expected} Got: {output!r}.",
                score=0.0,
                items=["Change the instructions so this kind of input gets the expected output."],
            )
        if isinstance(verdict, int | float):
            score = max(0.0, min(1.0, float(verdict)))
            return Feedback(f"{self.check_name} scored the output {score:.2f}.{expected}", score)
        message = str(verdict)
        if not message:
            return Feedback(f"The output passed {self.check_name}.", score=1.0)
        return Feedback(f"{self.check_name}: {message}{expected} Got: {output!r}.", score=0.0)


# ------------------------------------------------------------------ LLM judges
@dataclass
class _Unusable(Feedback):
    """A verdict the judge could not give: score None, and backward sends nothing."""


@dataclass
class RankingFeedback(Feedback):
    """What `LLMRankingLoss` says about several candidates.

    ``score`` is None: a ranking is relative, so it says nothing absolute
    about the candidates; ``scores`` places each one between 0 (ranked
    last) and 1 (ranked first).
    """

    ranking: list[int] = field(default_factory=list)
    """Candidate indices (0-based), best first; tied candidates keep their input order."""
    scores: list[float] = field(default_factory=list)
    """Per candidate, in input order: the share of other candidates ranked below it."""
    comments: list[str] = field(default_factory=list)
    """Per candidate, in input order: the judge's comment."""


_ASKED_ITEMS = 4
"""Most improvements a judge may list. The bound is in the schema only (``maxItems``, so
llama.cpp's grammar enforces it; verified on the embedded 135M model, which otherwise
repeated one item until its token limit cut the JSON); parsing stays lenient."""


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


def _items(texts: Sequence[str]) -> list[str]:
    """Returns the non-empty texts, each clipped, without repeats, at most MAX_ITEMS."""
    cleaned = (clip(str(text).strip(), _ITEM_CHARS) for text in texts)
    return list(dict.fromkeys(text for text in cleaned if text))[:MAX_ITEMS]


def _shown(label: str, value: Any) -> str:
    return f"{label}:\n{clip(value, _SHOWN_CHARS)}"


def _check_scale(scale: float) -> float:
    if isinstance(scale, bool) or not isinstance(scale, int | float) or scale <= 0:
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    return scale


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


# ------------------------------------------------------------------ human
_ASKING = threading.Lock()
"""One question on the terminal at a time, even when a batch judges items concurrently."""


class HumanFeedbackLoss(Loss):
    """A person judges each output on the terminal.

    Shows the output (and the target, if any), asks for feedback (an empty
    line means "fine") and, if ``score_prompt`` is set, for a score from 0 to
    ``scale``. The questions run in a worker thread so other work of the
    event loop goes on while the person types; concurrent questions wait
    their turn.

    Args:
        prompt: the question asking for feedback.
        score_prompt: the question asking for a score; None asks none.
        scale: the highest score.
        input_fn: reads one answer, given the question (``input`` by default;
            inject another to script it).
        output_fn: shows text (``print`` by default).

    Raises:
        EOFError: from ``forward``, when input ends before an answer is given.

    Example::

        loss = HumanFeedbackLoss(prompt="What is wrong with this summary? ")
    """

    def __init__(
        self,
        prompt: str = "Feedback on this output (empty line: it is fine): ",
        *,
        score_prompt: str | None = "Score from 0 to {scale} (empty: no score): ",
        scale: float = 10,
        input_fn: Callable[[str], str] = input,
        output_fn: Callable[[str], Any] = print,
    ) -> None:
        super().__init__()
        self.prompt = prompt
        self.score_prompt = score_prompt
        self.scale = _check_scale(scale)
        self.input_fn = input_fn
        self.output_fn = output_fn

    async def forward(self, output: Any, target: Any = None) -> Feedback:
        return await asyncio.to_thread(self._ask_person, output, target)

    def _ask_person(self, output: Any, target: Any) -> Feedback:
        with _ASKING:
            shown = [_shown("Output", output)]
            if target is not None:
                shown.append(_shown("Target", target))
            self.output_fn("\n".join(shown))
            try:
                remark = self.input_fn(self.prompt).strip()
                score = self._read_score() if self.score_prompt else None
            except EOFError:
                raise EOFError(
                    "HumanFeedbackLoss: input ended before feedback was given; run training "
                    "in a terminal, or pass input_fn= to script the answers"
                ) from None
        if not remark:
            return Feedback("A person reviewed the output and found it fine.", score)
        return Feedback(f"A person reviewing the output said: {remark}", score, [remark])

    def _read_score(self) -> float | None:
        question = str(self.score_prompt).format(scale=f"{self.scale:g}")
        for _ in range(3):
            answer = self.input_fn(question).strip()
            if not answer:
                return None
            try:
                number = float(answer.split("/")[0])
            except ValueError:
                number = -1.0
            if 0 <= number <= self.scale:
                return number / self.scale
            self.output_fn(f"Please answer a number from 0 to {self.scale:g}, or nothing.")
        return None


# ------------------------------------------------------------------ composite
class CompositeLoss(Loss):
    """Several losses as one: the score is their weighted mean, texts and items merged.

    Losses whose score is None (no score, or an unusable judge reply) do
    not count in the mean; when none has a score, the score is None. Items
    are merged without repeats, at most `MAX_ITEMS`. The losses run
    concurrently.

    Args:
        losses: ``(loss, weight)`` pairs; a bare loss has weight 1, and a plain
            ``check(output, target)`` function is wrapped in a `VerifierLoss`.

    Example::

        loss = CompositeLoss([(VerifierLoss(is_json), 1.0), (LLMJudge("judge", "Polite."), 0.5)])
    """

    def __init__(self, losses: Sequence[Any]) -> None:
        super().__init__()
        modules, weights = [], []
        for i, entry in enumerate(losses):
            loss, weight = entry if isinstance(entry, tuple) else (entry, 1.0)
            if not isinstance(loss, Module):
                if not callable(loss):
                    raise TypeError(f"CompositeLoss entry {i} is not a loss: {loss!r}")
                loss = VerifierLoss(loss)
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
                raise ValueError(f"CompositeLoss entry {i}: weight must be > 0, got {weight!r}")
            modules.append(loss)
            weights.append(float(weight))
        if not modules:
            raise ValueError("CompositeLoss needs at least one (loss, weight) pair")
        self.losses = ModuleList(modules)
        self.weights = weights

    async def forward(self, output: Any, target: Any = None) -> Feedback:
        calls = [loss(output, target) for loss in self.losses]
        pending = [(i, call) for i, call in enumerate(calls) if inspect.isawaitable(call)]
        done = await together(*(call for _, call in pending))
        for (i, _), result in zip(pending, done, strict=True):
            calls[i] = result
        return self._merge(calls)

    def _merge(self, results: list[Any]) -> Feedback:
        texts, items, total, weight_sum = [], [], 0.0, 0.0
        for loss, weight, result in zip(self.losses, self.weights, results, strict=True):
            verdict = result if isinstance(result, Feedback) else Feedback(str(result))
            label = (
                f"[{getattr(loss, 'check_name', None) or type(loss).__name__}, weight {weight:g}]"
            )
            if isinstance(verdict, _Unusable):
                texts.append(f"{label} no verdict: the judge's reply was unusable")
                continue
            texts.append(f"{label} {clip(verdict.text, 600)}")
            items.extend(verdict.items)
            if verdict.score is not None:
                total += weight * verdict.score
                weight_sum += weight
        if all(isinstance(result, _Unusable) for result in results):
            return _Unusable("\n".join(texts))
        score = total / weight_sum if weight_sum else None
        return Feedback("\n".join(texts), score, _items(items))

    def extra_repr(self) -> str:
        return "weights=" + ", ".join(f"{w:g}" for w in self.weights)
