# size: the estimate's schedule, measuring and table together; issue 35 moves it into the program-search folder, split.
"""Cost before it runs: calls, tokens and dollars an evaluation, a search or a Trainer will spend.

    estimate = await BootstrapFewShot(metric).estimate(program, trainset=train, valset=val)
    print(estimate)                # a table: each phase, low / expected / high
    estimate.calls.expected, estimate.cost.high
    estimate = plait.estimate(program, devset, resources=config)     # for evaluate
    estimate = trainer.estimate()

An estimate puts together three things:

* **the schedule** — how many times the work runs the program (examples ×
  candidates, bootstrap passes, minibatches, validations) and how many calls it
  makes outside the program (instruction proposals, parameter rewrites); each
  search says its own (`ProgramSearch._schedule`), from its settings and the
  data sizes;
* **the size of one run** — the calls one example makes and the tokens of each
  call, measured on a small sample: ``sample`` examples (2 by default) are run
  for real, and those calls are counted in `CostEstimate.sample_calls` (with
  the proposals below, the only calls an estimate makes; ``sample=0`` makes
  none, and then the calls per example come from the program's graph and the
  tokens from the text's length, with a wide reply range). What a demo adds to a prompt is
  measured too, when the schedule shows demos: the first sampled example runs
  once more with labeled demos (without a sample, it is counted from the
  training examples' length, about four characters a token);
* **proposals made for real** — where a search or the Trainer makes calls
  outside the program (RandomSearch's instruction proposals, ReflectiveSearch's
  rewrites, an optimizer's updates), the sample also makes one of them, on a
  copy of the program with feedback as long as a minibatch's, and (when it
  changed the value) a second on the value it gave (`sample_twice`: later
  proposals meet a rewritten value, which a model may propose again unchanged),
  and counts their calls with the sample's (`Proposal`): their prompt and reply
  tokens and their re-asks are then measured, not assumed. A model that writes
  long replies or whose proposals are refused and asked again shows it there;
  a search also plans the rest of its schedule by what the proposals gave (a
  refused rewrite ends its reflection early; a proposed instruction lengthens
  the prompts of the candidates that carry it; an update those of the runs
  after it). RandomSearch asks for the run's own first proposals instead (the
  seeds its schedule uses) and runs the sample once more under each instruction
  they gave (`measure_variant`): the candidates that carry an instruction are
  sized by the prompts and replies measured under it (`Phase.variants`), as
  its tokens (an odd text can take twice the usual tokens per character) and
  what it makes the model write do not show in its length. What the copies
  would warn of (a refused rewrite, a step that changed nothing) is logged at
  debug level (`quiet`): the run warns of its own. Without a sample, calls
  outside the program (and a judge's) are
  sized in characters by whoever makes them (an optimizer renders the prompts
  it would send: `Optimizer.estimated_calls`) and turned into tokens at the
  rate the sampled calls showed (characters of their messages per prompt
  token), in a range of half to twice the prompt and a quarter to twice the
  reply.

Dollars come from the price of each endpoint in the resource configuration (or
plait's table of list prices); an endpoint without a price makes the cost
unknown (None), which the table says.

The range: *low* assumes the fewest calls the schedule allows (candidates
identical to the program are skipped, no rewrite is needed) and the smallest
sampled calls; *high* the most (every re-ask, each carrying the replies it
refused, the largest sampled call); the token range of a call is at least
-20 % / +50 % around the sampled mean, as a
sample of a few examples cannot show more. The run's own budget, if set, caps
every column.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from plait.callbacks import BaseCallback, active_callbacks
from plait.module import Module

__all__ = [
    "CostEstimate",
    "Phase",
    "Proposal",
    "Range",
    "Variant",
    "check_sample",
    "estimate",
    "from_schedule",
    "measure",
    "measure_variant",
    "quiet",
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


# ----------------------------------------------------------------- measuring
async def measure(
    program: Module, examples: Sequence[tuple[Any, Any]], resources: Any, sample: int,
    train: Sequence[tuple[Any, Any]] = (), demos: int = 0,
) -> tuple[_Size, int]:  # fmt: skip
    """Returns the size of one run of ``program`` and the calls spent measuring it.

    ``sample`` examples of ``examples`` run for real; with 0, the program's
    graph gives the calls per example and the text length the prompt tokens.
    With ``demos``, the first of them runs once more with that many labeled
    demos from ``train``, which measures what a demo adds to a prompt.
    """
    from plait.resources import ResourceManager
    from plait.resources.usage import metered

    manager = ResourceManager.shared(resources)
    demo_tokens = _demo_tokens(train or examples)
    if sample <= 0:
        return _from_graph(program, examples, manager, demo_tokens), 0
    from plait.optimization.evaluation import run_dataset

    chosen = list(examples)[:sample]
    sizes: list[tuple[int, int, int]] = []
    sent = _PromptChars()
    with metered() as meter:
        with sent.counting():
            result = await run_dataset(program, [x for x, _ in chosen], resources=manager)
        measured = await _demo_cost(program, chosen[0][0], train or examples, demos, manager)
    if measured is not None and result.rows[0].calls:
        plain = result.rows[0].input_tokens / result.rows[0].calls
        demo_tokens = max((measured - plain) / demos, 0.0)
    for row in result.rows:
        if row.calls:
            sizes.append((row.calls, row.input_tokens // row.calls, row.output_tokens // row.calls))
    if not sizes:  # every reply came from the cache, or every example failed
        return _from_graph(program, examples, manager, demo_tokens), meter.calls
    calls, prompts, replies = zip(*sizes, strict=True)
    size = _Size(
        calls=Range(min(calls), sum(calls) / len(calls), max(calls)),
        prompt=_spread(prompts),
        reply=_spread(replies),
        price=_price(manager, _aliases(program)),
        demo_tokens=demo_tokens,
        measured=True,
        chars_per_token=sent.per_token(),
    )
    return size, meter.calls


async def measure_variant(
    program: Module, examples: Sequence[tuple[Any, Any]], resources: Any, sample: int
) -> Variant | None:
    """Returns the size of one run of ``program`` (a changed copy: a candidate) on the first
    ``sample`` of ``examples``, the ones `measure` runs; None when no call reached a model
    (the cache answered, or every example failed)."""
    from plait.optimization.evaluation import run_dataset
    from plait.resources import ResourceManager

    chosen = [x for x, _ in list(examples)[: max(sample, 0)]]
    if not chosen:
        return None
    result = await run_dataset(program, chosen, resources=ResourceManager.shared(resources))
    rows = [row for row in result.rows if row.calls]
    if not rows:
        return None
    calls = sum(row.calls for row in rows)
    return Variant(
        calls=calls / len(rows),
        prompt=sum(row.input_tokens for row in rows) / calls,
        reply=sum(row.output_tokens for row in rows) / calls,
    )


_QUIET: ContextVar[bool] = ContextVar("plait_estimate_quiet", default=False)
_QUIETED = ("plait.optimization", "plait.evaluation", "plait.execution")
"""The loggers whose warnings an estimate's copies make at debug level (`quiet`)."""


class _Demoted(logging.Filter):
    """Turns the warnings logged inside `quiet` into debug records."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _QUIET.get() and record.levelno == logging.WARNING:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


_DEMOTED = _Demoted()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Logs what the work inside says as warnings at debug level instead.

    An estimate's sampled proposals and steps run on copies, and what they warn
    of (a rewrite refused, a step that changed nothing) is not the run's: the
    run says it again when it happens. Errors stay errors, and only the work
    inside (its context, the tasks it starts) is affected.
    """
    for name in _QUIETED:
        logging.getLogger(name).addFilter(_DEMOTED)  # once: a logger keeps one of each
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


class _PromptChars(BaseCallback):
    """Counts the characters of the messages the calls made inside `counting` sent, and the
    prompt tokens they were billed: what a token is on the program's endpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.chars = 0
        self.tokens = 0
        self._sent: dict[str, int] = {}

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        from plait.settings import context

        with context(callbacks=[*active_callbacks(), self]):
            yield

    def per_token(self) -> float:
        """Characters per prompt token, within 1..8 (plait's usual 4 when nothing was billed)."""
        if not self.tokens:
            return _CHARS_PER_TOKEN
        return min(max(self.chars / self.tokens, 1.0), 8.0)

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        messages = inputs.get("messages") or ()
        self._sent[call_id] = sum(len(str(m.get("content") or "")) for m in messages)

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        chars = self._sent.pop(call_id, 0)
        usage = getattr(outputs, "usage", None)
        if exception is None and usage is not None and not outputs.meta.get("cached"):
            self.chars += chars
            self.tokens += usage.input_tokens


def feedback_items(examples: Sequence[tuple[Any, Any]], size: _Size) -> list[str]:
    """Returns stand-ins of the feedback a training step gets on ``examples``, one per example,
    each as long as the real one would be about: the call's input, its reply (the
    sampled size) and the loss's verdict around them. For sizing an optimizer's prompts."""
    reply = size.reply.expected * size.chars_per_token
    return ["x" * round(len(str(x)) + reply + _FEEDBACK_FRAMING) for x, _ in examples]


def mean_call(calls: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """Returns the mean (prompt, reply) characters of ``calls`` (zeros when there are none)."""
    if not calls:
        return (0.0, 0.0)
    return (sum(p for p, _ in calls) / len(calls), sum(r for _, r in calls) / len(calls))


def _spread(values: Sequence[int]) -> Range:
    """Returns the sampled range of a size, at least -20 % / +50 % around its mean.

    A sample of two or three examples cannot show how much other examples,
    other instructions or longer replies vary, so the range never claims less.
    """
    mean = sum(values) / len(values)
    return Range(min(min(values), 0.8 * mean), mean, max(max(values), 1.5 * mean))


async def _demo_cost(
    program: Module, example_input: Any, train: Sequence[tuple[Any, Any]], demos: int,
    manager: Any,
) -> float | None:  # fmt: skip
    """Returns the prompt tokens per call of ``program`` with ``demos`` labeled demos on one
    input; None when there is nothing to measure (no demos asked, none fit its steps)."""
    if demos <= 0:
        return None
    import random

    from plait.optimization.evaluation import run_dataset
    from plait.optimization.search.demos import _labeled_pool, _pick, _with_demos, demo_modules

    if not demo_modules(program):
        return None
    pool = {path: items for path, items in _labeled_pool(program, list(train)).items() if items}
    if not pool:
        return None
    shown = _with_demos(program, _pick(pool, program, demos, random.Random(0)))
    result = await run_dataset(shown, [example_input], resources=manager)
    row = result.rows[0]
    return row.input_tokens / row.calls if row.calls else None


def _from_graph(
    program: Module, examples: Sequence[tuple[Any, Any]], manager: Any, demo_tokens: float
) -> _Size:
    steps = _llm_steps(program, examples[0][0]) if examples else 1
    prompt = _tokens_of(program, examples)
    return _Size(
        calls=Range(steps, steps, steps * 2),  # a structured reply may be asked again once
        prompt=Range(prompt, prompt, prompt * 2),
        reply=Range(*_UNSAMPLED_REPLY),
        price=_price(manager, _aliases(program)),
        demo_tokens=demo_tokens,
        measured=False,
    )


def _llm_steps(program: Module, example_input: Any) -> int:
    """Returns the program's model-calling steps for one input, from its traced graph."""
    from plait.errors import PlaitError
    from plait.execution.graph_cache import trace_cached

    try:
        graph = trace_cached(program, (example_input,), {})
    except (PlaitError, TypeError, ValueError):
        return max(len(_llm_modules(program)), 1)
    return max(sum(node.kind == "call" for node in graph.nodes.values()), 1)


def _llm_modules(program: Module) -> list[Module]:
    return [m for _, m in program.named_modules() if isinstance(getattr(m, "alias", None), str)]


def _aliases(program: Module) -> list[str]:
    return sorted({m.alias for m in _llm_modules(program)}) or ["*"]  # type: ignore[attr-defined]


def _tokens_of(program: Module, examples: Sequence[tuple[Any, Any]]) -> float:
    """Prompt tokens of one call, from the text of the inputs and the program's parameters."""
    inputs = [len(str(x)) for x, _ in examples] or [0]
    fixed = sum(len(str(p.value)) for _, p in program.named_parameters())
    return (sum(inputs) / len(inputs) + fixed) / _CHARS_PER_TOKEN + _DEMO_OVERHEAD


def _demo_tokens(examples: Sequence[tuple[Any, Any]]) -> float:
    """Tokens one demo adds to a prompt: its input and target, and their two turns."""
    if not examples:
        return 0.0
    chars = sum(len(str(x)) + len(str(t)) for x, t in examples) / len(examples)
    return chars / _CHARS_PER_TOKEN + _DEMO_OVERHEAD


def _price(manager: Any, aliases: Sequence[str]) -> Any:
    """Returns the price of the first alias's endpoint; None when any of them has no price."""
    from plait.errors import UnknownAliasError

    prices = []
    for alias in aliases:
        try:
            prices.append(manager.config.resolve(alias).effective_price)
        except UnknownAliasError:
            prices.append(None)
    return None if not prices or any(p is None for p in prices) else prices[0]


# ---------------------------------------------------------------- estimating
def estimate(
    program: Module,
    dataset: Any,
    metric: Any = None,
    *,
    resources: Any = None,
    sample: int = 2,
    max_calls: int | None = None,
    max_tokens: int | None = None,
    max_cost: float | None = None,
) -> Any:
    """Estimates what ``evaluate(program, dataset, ...)`` would spend; see the module docs.

    ``sample`` examples run for real to measure one run (their calls are counted
    in ``sample_calls``); ``max_calls`` / ``max_tokens`` / ``max_cost`` cap the
    totals as the same budget would cap the evaluation. Like ``evaluate``, it is
    awaited inside a running event loop and runs to completion in a script.

    Returns:
        A `CostEstimate` (``print`` it for the table).
    """
    from plait.execution.run import awaitable_or_result

    check_sample(sample)
    budget = _budget(max_calls, max_tokens, max_cost)
    return awaitable_or_result(_estimate_evaluation(program, dataset, resources, sample, budget))


def check_sample(sample: Any) -> None:
    """Raises when ``sample`` (the examples an estimate runs for real) is not a count.

    Raises:
        ValueError: a negative number, or not a whole number (a bool neither).
    """
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        raise ValueError(
            f"sample must be a whole number >= 0 (the examples an estimate runs for real; "
            f"0: none), got {sample!r}"
        )


async def _estimate_evaluation(
    program: Module, dataset: Any, resources: Any, sample: int, budget: Any
) -> CostEstimate:
    from plait.execution.settings import resources_of
    from plait.optimization.evaluation import examples_of
    from plait.resources import ResourceManager

    resources = resources_of(program, resources, who="estimate", takes="estimate()")
    examples = examples_of(dataset)
    if not examples:
        raise ValueError("estimate() got an empty dataset")
    size, spent = await measure(program, examples, resources, sample)
    n = len(examples)
    phases = [Phase(f"evaluate: {n} examples", runs=Range(n, n, n))]
    manager = ResourceManager.shared(resources)
    return from_schedule(
        f"evaluate of {type(program).__name__} on {n} examples",
        phases, size, manager, sample_calls=spent, budget=budget,
    )  # fmt: skip


def _budget(max_calls: int | None, max_tokens: int | None, max_cost: float | None) -> Any:
    from plait.resources.usage import Budget

    return Budget.of(max_calls, max_tokens, max_cost)


def from_schedule(
    what: str,
    phases: Sequence[Phase],
    size: _Size,
    manager: Any,
    *,
    sample_calls: int = 0,
    budget: Any = None,
) -> CostEstimate:
    """Returns the estimate of ``phases`` with runs of ``size``, capped by ``budget``."""
    rows = []
    total_calls, total_tokens, total_cost = ZERO, ZERO, ZERO
    unknown_price = size.price is None
    for phase in phases:
        calls, prompt, reply, cost = _phase(phase, size, manager)
        unknown_price = unknown_price or cost is None
        calls, tokens = calls.ordered(), (prompt + reply).ordered()
        cost = cost.ordered() if cost is not None else None
        rows.append({"phase": phase.name, "calls": calls, "tokens": tokens, "cost": cost})
        total_calls, total_tokens = total_calls + calls, total_tokens + tokens
        total_cost = total_cost + (cost or ZERO)
    whole = total_calls
    if budget is not None:
        total_calls, total_tokens, total_cost = _within(
            budget, total_calls, total_tokens, total_cost
        )
    notes = [_sample_note(size, sample_calls)]
    if unknown_price:
        notes.append("an endpoint has no price: set 'price' in the resource configuration")
    if budget is not None:
        limits = ", ".join(
            f"max_{name}=${value:g}" if name == "cost" else f"max_{name}={value:g}"
            for name, value in budget.limits().items()
        )
        capped = "totals capped by" if total_calls != whole else "within"
        notes.append(f"{capped} the budget this run may spend: {limits}")
    return CostEstimate(
        what=what,
        rows=rows,
        calls=_rounded(total_calls.ordered()),
        tokens=_rounded(total_tokens.ordered()),
        cost=None if unknown_price else total_cost.ordered(),
        sample_calls=sample_calls,
        notes=notes,
    )


def _phase(phase: Phase, size: _Size, manager: Any) -> tuple[Range, Range, Range, Range | None]:
    """Returns a phase's calls, prompt tokens, reply tokens and cost (None: no price)."""
    calls_per_run, prompt_per_run, reply_per_run = _per_run(phase, size)
    run_calls = phase.runs * calls_per_run
    demo_tokens = phase.demos * size.demo_tokens
    added = phase.added_chars / size.chars_per_token
    prompt = (
        phase.runs * prompt_per_run
        + run_calls * Range(demo_tokens, demo_tokens, demo_tokens)
        + phase.runs * Range(added, added, added)
    )
    reply = phase.runs * reply_per_run
    if phase.proposal is not None:
        other_calls, other_prompt, other_reply = _proposals(phase.other, phase.proposal)
    else:
        other_in, other_out = (chars / size.chars_per_token for chars in phase.other_chars)
        other_calls = phase.other
        other_prompt = phase.other * Range(other_in / 2, other_in, other_in * 2)
        other_reply = phase.other * Range(other_out / 4, other_out, other_out * 2)
    cost: Range | None = None
    other_price = _price(manager, [phase.other_alias]) if phase.other_alias else size.price
    if size.price is not None and (other_price is not None or not other_calls.high):
        cost = _dollars(size.price, prompt, reply)
        if other_calls.high:
            cost = cost + _dollars(other_price, other_prompt, other_reply)
    return run_calls + other_calls, prompt + other_prompt, reply + other_reply, cost


def _per_run(phase: Phase, size: _Size) -> tuple[Range, Range, Range]:
    """Returns the calls, prompt tokens and reply tokens of one of the phase's runs (before
    demos and added characters): the sampled program's, mixed with its ``variants`` at
    their shares (each with the range of the sampled program's, around its own mean)."""
    rest = max(1 - sum(share for share, _ in phase.variants), 0.0)
    calls = size.calls * rest
    prompt, reply = calls * size.prompt, calls * size.reply
    for share, variant in phase.variants:
        its = _around(size.calls, variant.calls) * share
        calls = calls + its
        prompt = prompt + its * _around(size.prompt, variant.prompt)
        reply = reply + its * _around(size.reply, variant.reply)
    return calls, prompt, reply


def _around(sampled: Range, mean: float) -> Range:
    """Returns the range ``sampled`` gives its mean, around ``mean`` instead."""
    if sampled.expected <= 0:
        return Range(0.8 * mean, mean, 1.5 * mean)
    return sampled * (mean / sampled.expected)


def _proposals(count: Range, proposal: Proposal) -> tuple[Range, Range, Range]:
    """Returns the calls, prompt and reply tokens of ``count`` proposals like ``proposal``.

    Expected: each as the sampled one was. Low: the fewest calls, each half the
    sampled prompt and a quarter of its reply. High: every call asked again as
    often as allowed, each reply twice the sampled one, and each prompt twice
    the sampled one plus the replies and re-asks a last attempt carries.
    """
    prompt, reply = proposal.prompt / proposal.calls, proposal.reply / proposal.calls
    again = max(proposal.most // max(proposal.least, 1) - 1, 0)
    calls = Range(count.low * proposal.least, count.expected * proposal.calls,
                  count.high * proposal.most)  # fmt: skip
    high_prompt = 2 * prompt + again * (2 * reply + _REASK_TOKENS)
    return (
        calls,
        Range(calls.low * prompt / 2, count.expected * proposal.prompt, calls.high * high_prompt),
        Range(calls.low * reply / 4, count.expected * proposal.reply, calls.high * 2 * reply),
    )


def _within(budget: Any, calls: Range, tokens: Range, cost: Range) -> tuple[Range, Range, Range]:
    """Returns the totals a run stopped by ``budget`` would reach.

    Once a limit stops the run, the other columns stop with it: each is scaled
    by the share of the work done before the first limit is reached.
    """
    shares = []
    for index in range(3):
        share = 1.0
        for total, limit in ((calls, budget.max_calls), (tokens, budget.max_tokens),
                             (cost, budget.max_cost)):  # fmt: skip
            if limit is not None and total[index] > limit:
                share = min(share, limit / total[index])
        shares.append(share)
    scale = Range(*shares)
    return calls * scale, tokens * scale, cost * scale


def _dollars(price: Any, prompt: Range, reply: Range) -> Range:
    return Range(*(price.cost(p, r) for p, r in zip(prompt, reply, strict=True)))


def _rounded(value: Range) -> Range:
    """Rounds each column up (an estimate does not shave a call off), after dropping the
    float error of its sums: 55.0000001 calls are 55, not 56."""
    return Range(*(math.ceil(round(v, 6)) for v in value))


def _sample_note(size: _Size, sample_calls: int) -> str:
    if size.measured:
        return (
            f"measured on a sample: {sample_calls} call(s) made, {size.calls.expected:.3g} "
            f"call(s) per example, ~{size.prompt.expected:.0f} prompt and "
            f"~{size.reply.expected:.0f} reply tokens per call"
        )
    return (
        "nothing sampled: calls per example from the program's graph, prompt tokens from "
        "the text's length, replies assumed 1 to 256 tokens"
    )
