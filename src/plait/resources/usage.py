"""Token usage, prices and cost.

Every finished call carries a `Usage` (input and output tokens, its cost once
a price is known, and whether the response cache answered it). The resource
manager adds each call's usage to the totals of its endpoint, of the alias
the program used and of the open meters, and stops an endpoint (or the whole
manager) cleanly once a cost budget is spent.

A `Budget` (`plait.resources.budget`, re-exported here with `budgeted` and
`active_budgets`) is a hard limit on a piece of work rather than an endpoint:
the calls, tokens and dollars a learning run (a search, a Trainer, an
evaluation) may spend, whatever endpoints it uses; the same ledger keeps an
endpoint's and the manager's cost ``budget``.

Prices are dollars per million tokens. `price_for` knows a few common OpenAI
and Anthropic models; an endpoint's ``price`` setting overrides it, and the
embedded ``local`` model costs nothing.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field, replace
from typing import Any

# Prices and Price live with the providers (plait.backends.providers); the names stay here.
from plait.backends.providers import PRICES, price_for
from plait.backends.types import HoldsUsage, Price, Usage
from plait.resources.budget import Budget, active_budgets, budgeted

__all__ = [
    "PRICES",
    "Budget",
    "Price",
    "Usage",
    "UsageMeter",
    "UsageTotals",
    "active_budgets",
    "active_meters",
    "budgeted",
    "metered",
    "price_for",
]


class UsageTotals:
    """Running totals of usage and calls for one endpoint or alias.

    Attributes:
        usage: summed tokens and cost of the calls sent; ``usage.cached``: the calls
            answered from a response cache (their tokens not counted: nothing was spent).
        calls: number of finished calls sent.
    """

    __slots__ = ("calls", "usage")

    def __init__(self) -> None:
        self.usage = Usage()
        self.calls = 0

    def record(self, usage: Usage) -> None:
        """Adds one finished call's usage."""
        self.usage += usage
        self.calls += 1

    def snapshot(self) -> Usage:
        """Returns a copy of the summed usage that later calls will not change."""
        return replace(self.usage)


@dataclass(slots=True)
class UsageMeter(HoldsUsage):
    """Counts the model calls made inside a `metered` block, whatever manager made them.

    One evaluation example, one optimizer run, one candidate: meters measure
    a piece of work, where `UsageTotals` measure an endpoint. Meters nest:
    a call counts in every meter open around it. A meter is a running total,
    not a record of a call: it owns its `Usage` (tokens, cost, cache hits)
    and adds each call to it in place, and counts what a `Usage` does not
    hold (calls sent, calls refused).
    """

    calls: int = 0
    """Calls that reached a model (each successful attempt; cache hits excluded)."""
    refused: int = 0
    """Calls a `Budget` refused (nothing was sent)."""
    usage: Usage = field(default_factory=Usage)
    """Tokens and cost of the calls sent; ``usage.cached``: the calls answered from a
    response cache (their tokens are not counted: nothing was spent)."""

    def record(self, usage: Usage) -> None:
        """Adds one finished call."""
        self.calls += 1
        self.usage += usage

    def as_dict(self) -> dict[str, Any]:
        """Returns the counts by name (JSON-compatible); a batch reads it once per item.

        The names and order are those of a checkpoint's and a served run's ``usage``.
        """
        usage = self.usage
        return {
            "calls": self.calls,
            "cached": usage.cached,
            "refused": self.refused,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cost": usage.cost,
        }


_METERS: contextvars.ContextVar[tuple[UsageMeter, ...]] = contextvars.ContextVar(
    "plait_usage_meters", default=()
)


def active_meters() -> tuple[UsageMeter, ...]:
    """Returns the meters open in this context (innermost last)."""
    return _METERS.get()


def metered(meter: UsageMeter | None = None) -> _Metering:
    """Opens a meter for the calls made in this block (and in tasks it starts).

    Example::

        with metered() as meter:
            await program(batch)
        meter.calls, meter.input_tokens
    """
    return _Metering(UsageMeter() if meter is None else meter)


class _Metering:
    """The block of `metered` (a class, not a generator: a batch opens one per item)."""

    __slots__ = ("_meter", "_token")

    def __init__(self, meter: UsageMeter) -> None:
        self._meter = meter
        self._token: contextvars.Token[tuple[UsageMeter, ...]] | None = None

    def __enter__(self) -> UsageMeter:
        self._token = _METERS.set((*_METERS.get(), self._meter))
        return self._meter

    def __exit__(self, *exc_info: object) -> None:
        assert self._token is not None  # entered first
        _METERS.reset(self._token)
