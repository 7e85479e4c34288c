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
import inspect
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plait._together import together
from plait.containers import ModuleList
from plait.feedback import BackwardContext, BackwardResult, Feedback, clip
from plait.module import Module
from plait.optimization.evaluation import as_metric

__all__ = [
    "CompositeLoss",
    "HumanFeedbackLoss",
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
