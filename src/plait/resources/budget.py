"""Budgets: the one ledger every spending limit of plait goes through.

A `Budget` keeps the books of one limit on calls, tokens and dollars: what
was spent, and what requests in flight hold. Every budget is one: a run's,
an evaluation's, a search's or the Trainer's (``max_calls`` / ``max_tokens``
/ ``max_cost``, opened around the work with `budgeted`), an endpoint's
``budget`` and the manager-wide ``budget`` (dollars only). Each promises:

1. **Never passed, whatever is in flight.** Before a request is sent it
   holds room for its worst case (`Claim`: one call, its prompt's tokens
   counted as a bound, its reply's ``max_tokens``, and their price) in every
   budget over it; when the reply comes the hold is settled with the real
   usage, and a request never sent gives its hold back.
2. **Used, not wasted.** A request that does not fit now waits (`hold`)
   while room held by requests in flight may come back, and is refused only
   when it could not fit even if nothing else were held. So work whose whole
   cost fits finishes, and work stopped by its budget has spent at least the
   budget less one request's worst case.

The bound is exact for calls, and for tokens and dollars when the request
sets ``max_tokens``. Without it the reply is held at 256 tokens (plait's
usual estimate; a provider's own cap is unknown), so only a longer reply can
take ``max_tokens`` or ``max_cost`` past its limit, by that reply's excess. A
reply that reports no usage at all is charged its worst case (the manager's
hold does it), since counting it free would let the budget be passed.

The interface, for a backing kept elsewhere (several processes, a state
store): `hold` needs from each budget only `Budget.try_hold`, `Budget.release`,
`Budget.refuse` and `Budget.changed`; a request then ends with
`Budget.settle` or `Budget.release`; `Budget.snapshot` reports the books.
`try_hold` is synchronous and atomic (check and take in one step), so a
shared backing answers it from room it leased in advance and refills
asynchronously, as the cluster's rate-limit leases do.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol

from plait.backends.types import Media, Request, Usage

if TYPE_CHECKING:
    from plait.resources.usage import Price

__all__ = [
    "WAIT",
    "Budget",
    "Claim",
    "Ledger",
    "Refusal",
    "active_budgets",
    "budgeted",
    "claim_of",
    "hold",
]

REPLY_WITHOUT_MAX_TOKENS: Final = 256
"""Reply tokens held for a request that sets no ``max_tokens`` (not a bound: see the module)."""

MEDIA_PART_TOKENS: Final = 1_600
"""Prompt tokens held per image, audio clip or document: an image's largest charge at
OpenAI and Anthropic (audio and long documents may cost more, settled at their real usage)."""


@dataclass(frozen=True, slots=True)
class Claim:
    """The worst case of one request: what it holds in a budget while in flight.

    A claim is always one call.
    """

    tokens: int
    """Prompt and reply tokens, at most."""
    cost: float | None
    """Dollars at most, or None when the endpoint has no price."""


def claim_of(request: Request, price: Price | None) -> Claim:
    """Returns the worst case of ``request`` on an endpoint charging ``price``.

    The prompt is counted, not guessed at four characters a token: a token of
    the byte-level tokenizers providers use is at least one byte, so its
    UTF-8 bytes (and a few tokens per message for the chat template) bound
    its tokens; tools and a response schema count as their JSON; media as
    `MEDIA_PART_TOKENS` each. The reply is its ``max_tokens``, or
    `REPLY_WITHOUT_MAX_TOKENS` when the request sets none.
    """
    prompt = 3  # the template's priming of the reply
    for message in request.messages:
        prompt += 4 + _bytes(message.content) + len(message.role)
        for call in message.tool_calls:
            prompt += 4 + _bytes(call.name) + _bytes(call.arguments)
        if message.parts:
            prompt += MEDIA_PART_TOKENS * sum(isinstance(p, Media) for p in message.parts)
    if request.tools:
        prompt += 64 + _bytes(
            json.dumps([[t.name, t.description, t.parameters] for t in request.tools])
        )
    if request.response_schema is not None:
        prompt += 64 + _bytes(json.dumps(request.response_schema.schema))
    reply = request.options.max_tokens or REPLY_WITHOUT_MAX_TOKENS
    cost = None if price is None else price.cost(prompt, reply)
    return Claim(prompt + reply, cost)


def _bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class _Wait:
    """The type of `WAIT`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "WAIT"


WAIT: Final = _Wait()
"""`Budget.try_hold`'s answer when the claim does not fit now but may once holds settle."""


class Ledger(Protocol):
    """The interface of a budget's books (`Budget` keeps them in this process).

    `hold` uses the first four; a held request ends with `settle` or
    `release`; `snapshot` is what /metrics and reports read.
    """

    def try_hold(self, claim: Claim) -> _Wait | str | None: ...

    def release(self, claim: Claim) -> None: ...

    def refuse(self, why: str) -> None: ...

    def changed(self) -> asyncio.Future[None]: ...

    def settle(self, claim: Claim, usage: Usage | None) -> None: ...

    def snapshot(self) -> dict[str, Any]: ...


class Refusal(NamedTuple):
    """Why `hold` refused a request: the budget that cannot take it, and why."""

    budget: Ledger
    why: str


async def hold(budgets: Sequence[Ledger], claim: Claim) -> Refusal | None:
    """Holds room for ``claim`` in every budget of ``budgets``, waiting while it may come.

    Room is held in all of them or in none: a request never holds room in
    one budget while it waits for another, so two requests cannot each hold
    what the other waits for. It waits on the first budget without room now
    (woken by any settle or release there, then tries all again) and is
    refused as soon as one budget could not take it even if nothing else
    were held; that budget counts the refusal.

    Cancelled while waiting, it holds nothing, so nothing is left to undo.

    Returns:
        None once the room is held (end the request with each budget's
        `Budget.settle` or `Budget.release`), or the `Refusal`.
    """
    while True:
        blocked: Ledger | None = None
        for index, budget in enumerate(budgets):
            verdict = budget.try_hold(claim)
            if verdict is None:
                continue
            for taken in budgets[:index]:
                taken.release(claim)
            if isinstance(verdict, str):
                budget.refuse(verdict)
                return Refusal(budget, verdict)
            blocked = budget
            break
        if blocked is None:
            return None
        await blocked.changed()


class Budget:
    """Hard limits on the calls, tokens and dollars of some work, and its books.

    Each request sent counts as a call (a retry is another request); tokens
    and dollars count as replies report them. While a request is in flight
    its `Claim` is held, so concurrent requests cannot together pass a limit
    (see the module for the promises and the one case a limit can be passed).

    Args:
        max_calls: most requests to send.
        max_tokens: most tokens (prompt and reply) to spend.
        max_cost: most dollars to spend; every endpoint used needs a price,
            unless ``unpriced_free`` (the manager-wide budget: an endpoint
            without a price costs nothing there).
        unpriced_free: count a request on an endpoint without a price as free.
    """

    __slots__ = (
        "_held_calls",
        "_held_cost",
        "_held_tokens",
        "_waiters",
        "calls",
        "cost",
        "input_tokens",
        "max_calls",
        "max_cost",
        "max_tokens",
        "output_tokens",
        "refusal",
        "refused",
        "unpriced_free",
    )

    def __init__(
        self,
        max_calls: int | None = None,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        *,
        unpriced_free: bool = False,
    ) -> None:
        for name, value in (("max_calls", max_calls), ("max_tokens", max_tokens),
                            ("max_cost", max_cost)):  # fmt: skip
            if value is not None and not _non_negative_number(value):
                raise ValueError(f"{name} must be a number >= 0 or None, got {value!r}")
        self.max_calls = max_calls
        self.max_tokens = max_tokens
        self.max_cost = max_cost
        self.unpriced_free = unpriced_free
        self.calls = 0
        """Requests sent or in flight."""
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost = 0.0
        self.refused = 0
        """Requests refused because they could never fit; nothing was sent for them."""
        self.refusal: str | None = None
        """Why the first request was refused."""
        self._held_calls = 0
        self._held_tokens = 0
        self._held_cost = 0.0
        self._waiters: list[asyncio.Future[None]] = []

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
        """Returns what was spent: calls (in flight included), tokens and cost."""
        return {
            "calls": self.calls,
            "tokens": self.input_tokens + self.output_tokens,
            "cost": round(self.cost, 6),
        }

    def held(self) -> dict[str, Any]:
        """Returns what requests in flight hold: calls, tokens and cost at most."""
        return {
            "calls": self._held_calls,
            "tokens": self._held_tokens,
            "cost": round(self._held_cost, 6),
        }

    def remaining(self) -> dict[str, Any]:
        """Returns what is left of each limit that is set, holds not subtracted."""
        spent = self.spent()
        return {name: max(limit - spent[name], 0) for name, limit in self.limits().items()}

    def snapshot(self) -> dict[str, Any]:
        """Returns the books at this moment (JSON-compatible), for /metrics and reports.

        ``spent`` counts calls in flight but only the tokens and dollars of
        replies; ``held`` is what requests in flight may still spend; ``left``
        is each limit less both; ``waiting`` counts requests waiting for room.
        """
        spent, held = self.spent(), self.held()
        left = {
            name: max(limit - (spent[name] if name == "calls" else spent[name] + held[name]), 0)
            for name, limit in self.limits().items()
        }
        return {
            "limits": self.limits(),
            "spent": spent,
            "held": held,
            "left": left,
            "waiting": sum(not w.done() for w in self._waiters),
            "refused": self.refused,
        }

    # -- the ledger -----------------------------------------------------------------------

    def try_hold(self, claim: Claim) -> _Wait | str | None:
        """Holds room for ``claim`` if there is some now.

        Returns:
            None when held; `WAIT` when it fits once requests in flight give
            back what they hold; or why it could not fit even then.
        """
        why = self._never_fits(claim)
        if why is not None:
            return why
        if (
            (self.max_calls is not None and self.calls + 1 > self.max_calls)
            or (
                self.max_tokens is not None
                and self.input_tokens + self.output_tokens + self._held_tokens + claim.tokens
                > self.max_tokens
            )
            or (
                self.max_cost is not None
                and self.cost + self._held_cost + (claim.cost or 0.0) > self.max_cost
            )
        ):
            return WAIT
        self.calls += 1
        self._held_calls += 1
        self._held_tokens += claim.tokens
        self._held_cost += claim.cost or 0.0
        return None

    def _never_fits(self, claim: Claim) -> str | None:
        if self.max_calls is not None and self.calls - self._held_calls + 1 > self.max_calls:
            return f"max_calls={self.max_calls} are spent"
        used = self.input_tokens + self.output_tokens
        if self.max_tokens is not None and used + claim.tokens > self.max_tokens:
            return (
                f"max_tokens={self.max_tokens} leave no room for a request of up to "
                f"{claim.tokens} tokens ({used} spent)"
            )
        if self.max_cost is not None:
            if claim.cost is None and not self.unpriced_free:
                return (
                    "max_cost is set but the endpoint has no price; set 'price' for it in "
                    "the resource configuration"
                )
            if self.cost + (claim.cost or 0.0) > self.max_cost:
                return (
                    f"max_cost=${self.max_cost:g} leaves no room for a request of up to "
                    f"${claim.cost or 0.0:.6f} (${self.cost:.6f} spent)"
                )
        return None

    def refuse(self, why: str) -> None:
        """Counts a request refused for ``why`` (from `try_hold`); nothing was sent for it."""
        self.refused += 1
        if self.refusal is None:
            self.refusal = why

    def settle(self, claim: Claim, usage: Usage | None) -> None:
        """Replaces a sent request's hold by what it spent (None: it failed, nothing billed)."""
        self._drop(claim)
        if usage is not None:
            self.input_tokens += usage.input_tokens
            self.output_tokens += usage.output_tokens
            self.cost += usage.cost
        self._wake()

    def release(self, claim: Claim) -> None:
        """Gives back the hold of a request that was never sent (its call does not count)."""
        self.calls -= 1
        self._drop(claim)
        self._wake()

    def add(self, usage: Usage) -> None:
        """Counts usage spent without a hold (a provider batch job answered outside calls)."""
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.cost += usage.cost

    def changed(self) -> asyncio.Future[None]:
        """Returns a future done at the next settle or release (await it, then try again).

        It may be done early (a shared backing may wake on any change); a
        cancelled waiter's future is dropped at the next wake.
        """
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def _drop(self, claim: Claim) -> None:
        self._held_calls -= 1
        self._held_tokens -= claim.tokens
        self._held_cost -= claim.cost or 0.0
        if not self._held_calls:  # no float dust left behind once nothing is in flight
            self._held_tokens, self._held_cost = 0, 0.0

    def _wake(self) -> None:
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)


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
