"""The estimate of a schedule, and `estimate` for an evaluation: the totals, capped by a budget.

`from_schedule` turns a schedule (phases, which each search and the Trainer give) and
the size of one run (`measure`) into a `CostEstimate`; see `plait.optimization.costs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plait.execution.run import awaitable_or_result
from plait.execution.settings import resources_of
from plait.module import Module
from plait.optimization.costs.measure import (
    _price,
    _unpriced,
    measure,
)
from plait.optimization.costs.parts import (
    _REASK_TOKENS,
    ZERO,
    CostEstimate,
    Phase,
    Proposal,
    Range,
    _rounded,
    _Size,
)
from plait.optimization.evaluation import examples_of
from plait.resources import ResourceManager
from plait.resources.usage import Budget

__all__ = ["check_sample", "estimate", "from_schedule"]


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
    """Estimates what ``evaluate(program, dataset, ...)`` would spend; see the package docs.

    ``sample`` examples run for real to measure one run (their calls are counted
    in ``sample_calls``); ``max_calls`` / ``max_tokens`` / ``max_cost`` cap the
    totals as the same budget would cap the evaluation. Like ``evaluate``, it is
    awaited inside a running event loop and runs to completion in a script.

    Returns:
        A `CostEstimate` (``print`` it for the table).
    """
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
        notes.append(_price_note(phases, size, manager))
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


def _price_note(phases: Sequence[Phase], size: _Size, manager: Any) -> str:
    """Returns the note of an unknown cost, naming the endpoints that have no price."""
    names = dict.fromkeys(size.unpriced)
    for phase in phases:
        if phase.other_alias and manager is not None:
            names.update(dict.fromkeys(_unpriced(manager, [phase.other_alias])))
    if not names:
        return "an endpoint has no price: set 'price' in the resource configuration"
    listed = ", ".join(repr(name) for name in names)
    return f"no price for endpoint {listed}: set 'price' on it in the resource configuration"


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
