"""Measuring one run of a program on a small sample: its calls, tokens and prices.

`measure` runs ``sample`` examples for real (and one with demos, when a schedule shows
demos); `measure_variant` a changed copy; without a sample, the program's graph and the
text's length stand in. `quiet` logs what an estimate's copies warn of at debug level.
See `plait.optimization.costs`.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from plait.callbacks import BaseCallback, active_callbacks
from plait.errors import PlaitError, UnknownAliasError
from plait.execution.graph_cache import trace_cached
from plait.module import Module
from plait.optimization.costs.parts import (
    _CHARS_PER_TOKEN,
    _DEMO_OVERHEAD,
    _FEEDBACK_FRAMING,
    _UNSAMPLED_REPLY,
    Range,
    Variant,
    _Size,
)
from plait.optimization.evaluation import run_dataset
from plait.resources import ResourceManager
from plait.resources.usage import metered
from plait.settings import context

__all__ = ["feedback_items", "mean_call", "measure", "measure_variant", "quiet"]


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
    manager = ResourceManager.shared(resources)
    demo_tokens = _demo_tokens(train or examples)
    if sample <= 0:
        return _from_graph(program, examples, manager, demo_tokens), 0

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
        unpriced=_unpriced(manager, _aliases(program)),
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
        if exception is None and usage is not None and not usage.cache_hit:
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

    # cycle: the search package imports costs at its top
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
        unpriced=_unpriced(manager, _aliases(program)),
        demo_tokens=demo_tokens,
        measured=False,
    )


def _llm_steps(program: Module, example_input: Any) -> int:
    """Returns the program's model-calling steps for one input, from its traced graph."""
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
    prices = []
    for alias in aliases:
        try:
            prices.append(manager.config.resolve(alias).effective_price)
        except UnknownAliasError:
            prices.append(None)
    return None if not prices or any(p is None for p in prices) else prices[0]


def _unpriced(manager: Any, aliases: Sequence[str]) -> tuple[str, ...]:
    """Returns the names of the endpoints without a price that ``aliases`` may call (every
    member of a fallback chain), so a note can say which price to set."""
    names: dict[str, None] = {}
    for alias in aliases:
        try:
            chain = manager.config.fallbacks(alias)
        except UnknownAliasError:
            continue  # the run itself names an alias with no entry
        names.update((e.name, None) for e in chain if e.effective_price is None)
    return tuple(names)
