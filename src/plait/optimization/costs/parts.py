"""The pieces of a cost estimate: ranges, phases, proposals, and the estimate itself.

A schedule is a list of `Phase`; a `Proposal` is one piece of work outside the program
made for real on the sample (`sample_twice` makes a second on the value it gave); a
`CostEstimate` is what `from_schedule` returns. See `plait.optimization.costs`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "CostEstimate",
    "Phase",
    "Proposal",
    "Range",
    "Variant",
    "repeat_feedback",
    "sample_twice",
]


_CHARS_PER_TOKEN = 4


_DEMO_OVERHEAD = 8
"""Tokens of chat template around one demo (its two turns)."""


_UNSAMPLED_REPLY = (1, 32, 256)
"""Reply tokens (low, expected, high) of a program call when nothing was sampled."""


_FEEDBACK_FRAMING = 150
"""Characters a feedback item adds around a call's input and reply: the step's name,
the loss's verdict and score."""


_REASK_TOKENS = 80
"""Tokens a re-ask adds to the conversation besides the reply it refused: what was
wrong with it and what to send instead (`execution.structured.REASK`)."""


class Range(NamedTuple):
    """A low / expected / high triple."""

    low: float
    expected: float
    high: float

    def __mul__(self, other: Any) -> Range:
        if isinstance(other, Range):
            return Range(self.low * other.low, self.expected * other.expected,
                         self.high * other.high)  # fmt: skip
        return Range(self.low * other, self.expected * other, self.high * other)

    def __add__(self, other: Any) -> Range:
        return Range(self.low + other.low, self.expected + other.expected, self.high + other.high)

    def ordered(self) -> Range:
        """Returns the range with low <= expected <= high: where a schedule's columns each
        fill a budget, the most expensive calls can make the high column's total a little
        lower than the expected one, which a range must not show."""
        return Range(min(self.low, self.expected), self.expected, max(self.high, self.expected))

    def capped(self, limit: float | None) -> Range:
        """Returns the range with no column above ``limit`` (None: as it is)."""
        if limit is None:
            return self
        return Range(min(self.low, limit), min(self.expected, limit), min(self.high, limit))


ZERO = Range(0, 0, 0)


@dataclass
class Proposal:
    """One proposal made for real on the estimate's sample, and what one is expected to spend.

    A proposal is a piece of work made of calls outside the program: an
    optimizer's update of one parameter (SFA's summary and rewrite), a
    RandomSearch instruction proposal, a ReflectiveSearch rewrite. A phase
    given one (`Phase.proposal`) counts proposals like it instead of calls of
    an assumed size: each makes ``calls`` calls of ``prompt`` and ``reply``
    tokens in all, re-asks included.

    A sample of one or two proposals cannot show how often a model's replies are
    refused (a re-ask repeats the conversation, so the refused ones cost most):
    none refused in two calls does not make it never. The rate is taken as
    (re-asks + 1/2) / (calls + 1), the estimate under Jeffreys' prior (a quarter
    after one clean call, a sixth after two, five eighths after three calls of
    which two were re-asks), and the expected calls and tokens are those of
    that rate (`of`).
    """

    calls: float
    """Calls one is expected to make, its re-asks included."""
    prompt: float
    """Prompt tokens of those calls (a re-ask's prompt holds the replies it refused)."""
    reply: float
    """Reply tokens of those calls."""
    least: int = 1
    """Calls a proposal makes when no reply is asked again."""
    most: int = 2
    """Calls a proposal makes when every reply is asked again as often as allowed."""
    usable: float = 1.0
    """The share of proposals expected to give a usable value (not refused at every
    attempt): a search may plan the rest of its schedule by it."""
    value: Any = None
    """The value the sampled one proposed, when it gave one."""
    grown: float = 0.0
    """Characters the value it gave added to the parameter's (0 when it gave none): what
    the prompts of every later run carry more."""
    then: Proposal | None = None
    """One made on the value this one gave (`sample_twice`), when a search blends them
    itself (`blend`)."""

    @classmethod
    def of(
        cls, meter: Any, proposals: int, *, least: int, most: int, value: Any = None,
        grown: float = 0.0,
    ) -> Proposal | None:  # fmt: skip
        """Returns the expected proposal from ``proposals`` made for real, whose calls
        ``meter`` (a `resources.usage.UsageMeter`) counted; None when nothing reached a
        model. ``least`` / ``most``: the calls of one without a re-ask / with every one.

        Each of its ``least`` asks is asked again at the rate seen (see the class docs),
        at most ``most / least - 1`` times; a re-ask's prompt is the one before it plus
        the reply it refused and what was wrong with it.
        """
        if proposals < 1 or meter.calls < 1:
            return None
        most = max(most, least)
        asks = least * proposals
        reply = meter.output_tokens / meter.calls
        grows = reply + _REASK_TOKENS
        attempts = meter.calls / asks
        first = max(meter.input_tokens / meter.calls - (attempts - 1) / 2 * grows, 0.0)
        rate = (max(meter.calls - asks, 0) + 0.5) / (meter.calls + 1)
        chances = [rate**k for k in range(most // least)]  # attempt k is made at rate**k
        return cls(
            calls=least * sum(chances),
            prompt=least * sum(w * (first + k * grows) for k, w in enumerate(chances)),
            reply=least * sum(chances) * reply,
            least=least,
            most=most,
            usable=1 - rate ** len(chances),
            value=value,
            grown=grown / proposals,
        )

    def blend(self, then: Proposal | None, share: float) -> Proposal:
        """Returns the mean proposal of a run whose first proposals are like this one and a
        ``share`` of them like ``then`` (a proposal made on the value this one gave: once
        a parameter is rewritten, a model may propose it again unchanged, which is
        refused and asked again). Without ``then``, this one."""
        if then is None:
            return self

        def mean(mine: float, theirs: float) -> float:
            return (1 - share) * mine + share * theirs

        return Proposal(
            calls=mean(self.calls, then.calls),
            prompt=mean(self.prompt, then.prompt),
            reply=mean(self.reply, then.reply),
            least=self.least,
            most=self.most,
            usable=mean(self.usable, then.usable),
            value=self.value,
            grown=self.grown,
        )


async def sample_twice(
    params: Sequence[Any], step: Callable[[], Awaitable[tuple[Proposal | None, bool]]]
) -> tuple[Proposal | None, Proposal | None]:
    """Makes a sampled proposal with ``step`` on ``params`` (which hold their feedback), and
    when it changed them, a second one on the values it gave, shown the same feedback.

    ``step`` returns the proposal and whether it changed a parameter. The second is
    what later proposals of a run meet: a parameter already rewritten, which a model
    may propose again unchanged (refused, then asked again). None as the second when
    the first changed nothing: later proposals meet what it met.
    """
    shown = [param.get_accumulated_feedback() for param in params]
    first, changed = await step()
    if first is None or not changed:
        return first, None
    for param, items in zip(params, shown, strict=True):
        param.zero_feedback()
        for item in items:
            param.accumulate_feedback(item)
    then, _ = await step()
    return first, then


def repeat_feedback(params: Sequence[Any], times: float) -> None:
    """Repeats the feedback each of ``params`` holds until it holds ``times`` as many items
    (rounded; within the parameter's own bound), so a proposal sampled on a few examples
    is shown as much feedback as one on a whole minibatch would be."""
    for param in params:
        items = param.get_accumulated_feedback()
        for index in range(round(len(items) * times) - len(items)):
            param.accumulate_feedback(items[index % len(items)])


class Variant(NamedTuple):
    """One run of a changed program, measured on the sample (`measure_variant`)."""

    calls: float
    """Calls per example."""
    prompt: float
    """Prompt tokens per call."""
    reply: float
    """Reply tokens per call."""


@dataclass
class Phase:
    """One part of a schedule: runs of the program, and calls made outside it.

    ``runs`` counts examples run through the program (with ``demos`` demos
    added to every step's prompt, and ``added_chars`` more characters in each
    run's prompts, as a longer instruction adds); ``other`` counts calls such
    as proposals and rewrites, each of about ``other_chars`` (prompt, reply)
    characters on the endpoint ``other_alias`` (tokens at the sample's
    characters per token). With ``proposal`` (one made for real on the
    sample), ``other`` counts proposals like it instead, each its measured
    calls and tokens.
    """

    name: str
    runs: Range = ZERO
    demos: float = 0.0
    other: Range = ZERO
    other_chars: tuple[float, float] = (1600, 400)
    other_alias: str | None = None
    added_chars: float = 0.0
    proposal: Proposal | None = None
    variants: Sequence[tuple[float, Variant]] = ()
    """Shares of ``runs`` that run the program changed (a candidate's instruction), each
    ``(share, size of a run)`` as measured on the sample under that change
    (`measure_variant`: its prompts hold the change, so ``added_chars`` leaves it out);
    the rest run as the sampled program does."""


@dataclass
class _Size:
    """What one run of the program costs: calls per example, tokens per call, prices."""

    calls: Range
    prompt: Range
    reply: Range
    price: Any
    """The `Price` of the program's endpoint, or None when it has none."""
    demo_tokens: float
    measured: bool
    chars_per_token: float = _CHARS_PER_TOKEN
    """Characters of the sampled calls' messages per prompt token they were billed."""
    unpriced: tuple[str, ...] = ()
    """The endpoints without a price the program's aliases may call (for the note)."""


@dataclass
class CostEstimate:
    """What a piece of learning work is expected to spend, phase by phase.

    ``calls``, ``tokens`` and ``cost`` are `Range` totals; ``cost`` is None
    when an endpoint used has no price. ``print(estimate)`` shows the table.
    """

    what: str
    rows: list[dict[str, Any]]
    calls: Range
    tokens: Range
    cost: Range | None
    sample_calls: int = 0
    """Calls made to measure the sample (already spent)."""
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        head = ["phase", "calls", "tokens", "cost $"]
        lines = [
            [row["phase"], _cell(row["calls"]), _cell(row["tokens"]), _money(row["cost"])]
            for row in self.rows
        ]
        lines.append(["total", _cell(self.calls), _cell(self.tokens), _money(self.cost)])
        widths = [max(len(head[i]), *(len(line[i]) for line in lines)) for i in range(4)]
        out = [f"Estimate for {self.what} (low / expected / high)"]
        out.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
        for line in lines:
            out.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)))
        out += [f"- {note}" for note in self.notes]
        return "\n".join(out)

    def as_dict(self) -> dict[str, Any]:
        """Returns the estimate as JSON-compatible data."""
        return {
            "what": self.what,
            "rows": [
                {k: (list(v) if isinstance(v, Range) else v) for k, v in row.items()}
                for row in self.rows
            ],
            "calls": list(self.calls),
            "tokens": list(self.tokens),
            "cost": list(self.cost) if self.cost is not None else None,
            "sample_calls": self.sample_calls,
            "notes": self.notes,
        }


def _cell(value: Range) -> str:
    return " / ".join(f"{v:,}" for v in _rounded(value))


def _money(value: Range | None) -> str:
    return "unknown (no price)" if value is None else " / ".join(f"{v:.4g}" for v in value)


def _rounded(value: Range) -> Range:
    """Rounds each column up (an estimate does not shave a call off), after dropping the
    float error of its sums: 55.0000001 calls are 55, not 56."""
    return Range(*(math.ceil(round(v, 6)) for v in value))
