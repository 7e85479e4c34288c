"""Token usage, prices and cost.

Every finished call carries a `Usage` (input and output tokens, and its cost
once a price is known). The resource manager adds each call's usage to the
totals of its endpoint and of the alias the program used, and stops an
endpoint (or the whole manager) cleanly once a cost budget is spent.

A `Budget` is a hard limit on a piece of work rather than an endpoint: the
calls, tokens and dollars a learning run (a search, a Trainer, an evaluation)
may spend, whatever endpoints it uses. Inside a `budgeted` block the manager
holds room for each request before it is sent (one call, its prompt estimate
plus its reply's ``max_tokens``, and their price), refuses the request when
the room is not there, and settles the hold with the real usage when the
reply comes, so calls in flight never take a run past its budget.

Prices are dollars per million tokens. `price_for` knows a few common OpenAI
and Anthropic models; an endpoint's ``price`` setting overrides it, and the
embedded ``local`` model costs nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Prices and Price live with the providers (plait.backends.providers); the names stay here.
from plait.backends.providers import PRICES, price_for
from plait.backends.types import Price, Usage

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


class Budget:
    """Hard limits on the calls, tokens and dollars of the work inside a `budgeted` block.

    Each request sent counts as a call (a retry is another request); tokens and
    dollars count as replies report them. While a request is in flight, its
    upper bound (the prompt's estimate plus the reply's ``max_tokens``, and
    their price) is held, so concurrent requests cannot together pass a limit.
    A request without ``max_tokens`` is held at plait's usual reply estimate
    (256 tokens), so only a reply longer than that can take ``max_tokens`` or
    ``max_cost`` past the limit; the call count is exact.

    Args:
        max_calls: most requests to send.
        max_tokens: most tokens (prompt and reply) to spend.
        max_cost: most dollars to spend; every endpoint used needs a price.
    """

    __slots__ = (
        "_held_cost",
        "_held_tokens",
        "calls",
        "cost",
        "input_tokens",
        "max_calls",
        "max_cost",
        "max_tokens",
        "output_tokens",
        "refusal",
        "refused",
    )

    def __init__(
        self,
        max_calls: int | None = None,
        max_tokens: int | None = None,
        max_cost: float | None = None,
    ) -> None:
        for name, value in (("max_calls", max_calls), ("max_tokens", max_tokens),
                            ("max_cost", max_cost)):  # fmt: skip
            if value is not None and not _non_negative_number(value):
                raise ValueError(f"{name} must be a number >= 0 or None, got {value!r}")
        self.max_calls = max_calls
        self.max_tokens = max_tokens
        self.max_cost = max_cost
        self.calls = 0
        """Requests sent (or in flight)."""
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost = 0.0
        self.refused = 0
        """Requests refused for want of room; nothing was sent for them."""
        self.refusal: str | None = None
        """Why the first request was refused."""
        self._held_tokens = 0
        self._held_cost = 0.0

    @classmethod
    def of(
        cls, max_calls: int | None, max_tokens: int | None, max_cost: float | None
    ) -> Budget | None:
        """Returns a budget with these limits, or None when none is set (no budget at all)."""
        if max_calls is None and max_tokens is None and max_cost is None:
            return None
        return cls(max_calls, max_tokens, max_cost)

    def __repr__(self) -> str:
        return f"Budget({self.limits()}; spent {self.spent()})"

    @property
    def stopped(self) -> bool:
        """Whether the budget has refused a request (the work it bounds was cut short)."""
        return self.refused > 0

    def limits(self) -> dict[str, Any]:
        """Returns the limits that are set, by name."""
        limits = {"calls": self.max_calls, "tokens": self.max_tokens, "cost": self.max_cost}
        return {name: value for name, value in limits.items() if value is not None}

    def spent(self) -> dict[str, Any]:
        """Returns what was spent: calls, tokens (prompt and reply) and cost."""
        return {
            "calls": self.calls,
            "tokens": self.input_tokens + self.output_tokens,
            "cost": round(self.cost, 6),
        }

    def remaining(self) -> dict[str, Any]:
        """Returns what is left of each limit that is set."""
        spent = self.spent()
        return {name: max(limit - spent[name], 0) for name, limit in self.limits().items()}

    def hold(self, tokens: int, cost: float | None) -> str | None:
        """Holds room for one request; returns why there is none (the request is then refused).

        ``cost`` is None when the endpoint has no price.
        """
        why = self._no_room(tokens, cost)
        if why is not None:
            self.refused += 1
            if self.refusal is None:
                self.refusal = why
            return why
        self.calls += 1
        self._held_tokens += tokens
        self._held_cost += cost or 0.0
        return None

    def _no_room(self, tokens: int, cost: float | None) -> str | None:
        if self.max_calls is not None and self.calls + 1 > self.max_calls:
            return f"max_calls={self.max_calls} are spent"
        used = self.input_tokens + self.output_tokens + self._held_tokens
        if self.max_tokens is not None and used + tokens > self.max_tokens:
            return (
                f"max_tokens={self.max_tokens} leave no room for a request of up to "
                f"{tokens} tokens ({used} spent or in flight)"
            )
        if self.max_cost is not None:
            if cost is None:
                return (
                    "max_cost is set but the endpoint has no price; set 'price' for it in "
                    "the resource configuration"
                )
            if self.cost + self._held_cost + cost > self.max_cost:
                return (
                    f"max_cost=${self.max_cost:g} leaves no room for a request of up to "
                    f"${cost:.6f} (${self.cost + self._held_cost:.6f} spent or in flight)"
                )
        return None

    def release(self, tokens: int, cost: float | None) -> None:
        """Gives back a hold whose request was never sent."""
        self.calls -= 1
        self._settle(tokens, cost)

    def settle(self, tokens: int, cost: float | None, usage: Usage | None) -> None:
        """Replaces a hold by what the request really spent (None: it failed, nothing billed)."""
        self._settle(tokens, cost)
        if usage is not None:
            self.input_tokens += usage.input_tokens
            self.output_tokens += usage.output_tokens
            self.cost += usage.cost

    def _settle(self, tokens: int, cost: float | None) -> None:
        self._held_tokens -= tokens
        self._held_cost -= cost or 0.0


def _non_negative_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


_BUDGETS: contextvars.ContextVar[tuple[Budget, ...]] = contextvars.ContextVar(
    "plait_budgets", default=()
)


def active_budgets() -> tuple[Budget, ...]:
    """Returns the budgets open in this context (innermost last)."""
    return _BUDGETS.get()


@contextlib.contextmanager
def budgeted(budget: Budget | None) -> Iterator[Budget | None]:
    """Holds every model call made in this block (and in tasks it starts) to ``budget``.

    None opens nothing, so a run without limits pays nothing per call.
    """
    if budget is None:
        yield None
        return
    token = _BUDGETS.set((*_BUDGETS.get(), budget))
    try:
        yield budget
    finally:
        _BUDGETS.reset(token)
