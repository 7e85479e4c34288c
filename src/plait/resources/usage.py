"""Token usage, prices and cost.

Every finished call carries a `Usage` (input and output tokens, and its cost
once a price is known). The resource manager adds each call's usage to the
totals of its endpoint and of the alias the program used, and stops an
endpoint (or the whole manager) cleanly once a cost budget is spent.

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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plait.backends.types import Usage
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


@dataclass(frozen=True, slots=True)
class Price:
    """What a model charges, in dollars per million tokens."""

    input: float
    """Dollars per million prompt (input) tokens."""
    output: float
    """Dollars per million completion (output) tokens."""

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        """Returns the dollar cost of a call with these token counts."""
        return (input_tokens * self.input + output_tokens * self.output) / 1_000_000


FREE = Price(0.0, 0.0)

# Public list prices (standard tier, no caching or batch discounts), checked
# against the providers' pricing pages when written. They drift: an endpoint's
# ``price`` setting always wins, and a model missing here has no known price.
PRICES: Mapping[str, Price] = {
    "gpt-4o-mini": Price(0.15, 0.60),
    "gpt-4o": Price(2.50, 10.00),
    "gpt-4.1-nano": Price(0.10, 0.40),
    "gpt-4.1-mini": Price(0.40, 1.60),
    "gpt-4.1": Price(2.00, 8.00),
    "gpt-3.5-turbo": Price(0.50, 1.50),
    "o3-mini": Price(1.10, 4.40),
    "o4-mini": Price(1.10, 4.40),
    "claude-3-haiku": Price(0.25, 1.25),
    "claude-3-5-haiku": Price(0.80, 4.00),
    "claude-3-5-sonnet": Price(3.00, 15.00),
    "claude-3-7-sonnet": Price(3.00, 15.00),
    "claude-sonnet-4": Price(3.00, 15.00),
    "claude-3-opus": Price(15.00, 75.00),
    "claude-opus-4": Price(15.00, 75.00),
}

# Longest first, so "gpt-4o-mini-2024-07-18" matches "gpt-4o-mini", not "gpt-4o".
_BY_LENGTH = sorted(PRICES, key=len, reverse=True)


def price_for(provider: str, model: str | None) -> Price | None:
    """Returns the built-in price of a model, or None when it is not known.

    A dated or suffixed name (``claude-3-5-sonnet-20241022``, ``openai/gpt-4o``)
    matches the longest known name it starts with, after any ``vendor/`` prefix.
    The ``local`` provider is always free.
    """
    if provider == "local":
        return FREE
    if not model:
        return None
    name = model.rsplit("/", 1)[-1].lower()
    for known in _BY_LENGTH:
        if name.startswith(known):
            return PRICES[known]
    return None


class UsageTotals:
    """Running totals of usage and calls for one endpoint or alias.

    Attributes:
        usage: summed tokens and cost.
        calls: number of finished calls counted.
    """

    __slots__ = ("calls", "usage")

    def __init__(self) -> None:
        self.usage = Usage()
        self.calls = 0

    def record(self, usage: Usage) -> None:
        """Adds one finished call's usage."""
        self.usage.add(usage)
        self.calls += 1

    def snapshot(self) -> Usage:
        """Returns a copy of the summed usage that later calls will not change."""
        u = self.usage
        return Usage(u.input_tokens, u.output_tokens, u.cost)


@dataclass
class UsageMeter:
    """Counts the model calls made inside a `metered` block, whatever manager made them.

    One evaluation example, one optimizer run, one candidate: meters measure
    a piece of work, where `UsageTotals` measure an endpoint. Meters nest:
    a call counts in every meter open around it.
    """

    calls: int = 0
    """Calls that reached a model (each successful attempt; cache hits excluded)."""
    cached: int = 0
    """Calls answered from a response cache."""
    refused: int = 0
    """Calls a `Budget` refused (nothing was sent)."""
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0

    def record(self, usage: Usage) -> None:
        """Adds one finished call."""
        self.calls += 1
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cost += usage.cost

    def as_dict(self) -> dict[str, Any]:
        """Returns the counts by name (JSON-compatible); a batch reads it once per item."""
        return {
            "calls": self.calls,
            "cached": self.cached,
            "refused": self.refused,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost": self.cost,
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
