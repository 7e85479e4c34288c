"""The attempts of one call on one endpoint: its slot, its budget hold, retries, settling.

`call_endpoint` is the per-attempt path `ResourceManager.complete` ends in; the
`ResourceManager.stream` path (`plait.resources.streaming`) uses the same
steps. Each attempt:

1. waits for the endpoint's limiter (slot, rpm, tpm, pause) — `begin_attempt`;
2. holds room for the request's worst case in every budget over it
   (`plait.resources.budget`: the endpoint's, the manager's, the run's),
   waiting while room held by calls in flight may come back, and refusing it
   (``BudgetExceededError``, nothing sent) only when it could never fit —
   `hold_room`, which gives a `BudgetHold`;
3. calls the backend under the per-attempt timeout;
4. on success frees its slot, records usage and cost and settles its hold
   (`end_attempt`); on failure frees its slot and either raises or sleeps the
   backoff (`after_failure`: a ``Retry-After`` pauses the endpoint; one longer
   than ``max_retry_after`` fails its call at once and pauses nothing).

These are functions over the manager's state rather than its methods so the
manager stays one page; the common path (no budget) makes the same calls and
lookups it made as methods.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from plait import _context
from plait.backends.base import Backend
from plait.backends.types import Request, Response, Usage
from plait.errors import BackendError, BackendTimeout, BudgetExceededError, ConfigError, MediaError
from plait.resources.budget import Budget, Claim, Refusal, active_budgets, claim_of, hold
from plait.resources.chunks import TextSink, streamed
from plait.resources.endpoint import estimate_tokens
from plait.resources.retry import RetryPolicy, exhausted
from plait.resources.usage import active_meters

if TYPE_CHECKING:
    from plait.resources.manager import ResourceManager
    from plait.resources.routes import Route

logger = logging.getLogger("plait.resources")


class BudgetHold:
    """The room one request holds in the budgets over it while it is in flight."""

    __slots__ = ("budgets", "claim")

    def __init__(self, budgets: tuple[Budget, ...], claim: Claim) -> None:
        self.budgets = budgets
        self.claim = claim

    def settle(self, usage: Usage | None) -> None:
        """Replaces the hold by what the request spent (None: it failed, nothing billed).

        A reply that reports no tokens at all (a llama.cpp server's stream)
        is charged its worst case: what it spent is unknown, and a budget
        must not count it as free.
        """
        if usage is not None and not usage.input_tokens and not usage.output_tokens:
            usage = Usage(self.claim.tokens, 0, self.claim.cost or 0.0)
        for budget in self.budgets:
            budget.settle(self.claim, usage)

    def release(self) -> None:
        """Gives the hold back: the request was never sent."""
        for budget in self.budgets:
            budget.release(self.claim)


def plan(
    route: Route, request: Request, max_retries: int | None
) -> tuple[Backend, RetryPolicy, float | None, int]:
    """Returns what every attempt of a call uses.

    Returns:
        The backend, the retry policy, the per-attempt timeout, and the
        tokens to reserve on the endpoint's tpm bucket.
    """
    endpoint = route.endpoint
    policy = endpoint.retry if max_retries is None else endpoint.retry.with_max_retries(max_retries)
    timeout = request.timeout if request.timeout is not None else endpoint.timeout
    reserved = 0 if endpoint.limiter.tpm is None else estimate_tokens(request)
    try:
        backend = endpoint.get_backend()
    except ConfigError as exc:  # a missing API key, found before anything is sent
        raise ConfigError(f"alias {route.alias!r}: {exc}") from None
    return backend, policy, timeout, reserved


async def begin_attempt(
    manager: ResourceManager, route: Route, reserved: int, request: Request
) -> tuple[float, BudgetHold | None]:
    """Waits for the endpoint's limits, then for room in its budgets; counts the request.

    Returns:
        The seconds waited for the limits, and the budgets' hold (None
        without budgets), which the attempt settles when it ends.
    """
    endpoint = route.endpoint
    waited = await endpoint.limiter.acquire(reserved)
    budgets = active_budgets()
    if endpoint.ledger is not None or manager.ledger is not None:
        budgets = (*(b for b in (endpoint.ledger, manager.ledger) if b is not None), *budgets)
    held = await hold_room(manager, route, request, budgets, reserved) if budgets else None
    endpoint.requests += 1
    return waited, held


async def hold_room(
    manager: ResourceManager,
    route: Route,
    request: Request,
    budgets: tuple[Budget, ...],
    reserved: int,
) -> BudgetHold:
    """Holds room for ``request``'s worst case in ``budgets``, once its slot is held.

    Slot first, then room: the room a request waits for is held only by
    requests already sent, which hold their slots and give the room back
    whatever this one does, so waiting with a slot cannot starve them;
    and room is held only while a request is really in flight, so what
    waiters wait for always comes back (room taken before the slot would
    sit idle behind a queue or a rate limit; a stream holds both until it
    is read to its end or closed). Refused, or cancelled while
    waiting, the request frees its slot (``reserved`` tokens) holding no
    room; a refusal by the run's budgets counts in the open meters.
    """
    claim = claim_of(request, route.endpoint.price)
    try:
        refusal = await hold(budgets, claim)
    except BaseException:
        route.endpoint.limiter.release(reserved, 0)
        raise
    if refusal is None:
        return BudgetHold(budgets, claim)
    route.endpoint.limiter.release(reserved, 0)
    raise refused(manager, route, refusal, claim)


def end_attempt(
    manager: ResourceManager, route: Route, reserved: int, usage: Usage, held: BudgetHold | None
) -> None:
    """Frees a successful attempt's slot, corrects its token reservation, records usage."""
    limiter = route.endpoint.limiter
    used = usage.input_tokens + usage.output_tokens
    limiter.release(reserved, used or None)
    limiter.on_success()
    record(manager, route, usage)
    if held is not None:
        held.settle(usage)


def unsent(route: Route, reserved: int, held: BudgetHold | None) -> None:
    """Undoes an attempt its backend refused before sending anything (an input it
    cannot take): the slot is freed, and neither the endpoint's requests nor the
    run's budgets count it, as a profiler is never told of it."""
    route.endpoint.limiter.release(reserved, 0)
    route.endpoint.requests -= 1
    if held is not None:
        held.release()


async def call_endpoint(
    manager: ResourceManager,
    route: Route,
    request: Request,
    max_retries: int | None,
    on_text: TextSink | None = None,
) -> Response:
    """Makes one call on ``route``'s endpoint, its attempts and retries; the reply with its meta.

    ``on_text`` makes each attempt read the backend's stream (`chunks.streamed`);
    the sink is told to discard its text before a retry.
    """
    backend, policy, timeout, reserved = plan(route, request, max_retries)
    started = time.perf_counter()
    waited = 0.0
    attempts = 0
    error: BackendError | None = None
    # An active profiler (plait.report.profiling) sees each attempt: its wait, request, status.
    observer = _context.PROFILE.get()
    call = observer.next_call() if observer is not None else 0
    while True:
        attempts += 1
        if on_text is not None and on_text.started:
            await on_text.restart(f"retried after: {error}")
        queued = observer.now() if observer is not None else 0.0
        waited_now, held = await begin_attempt(manager, route, reserved, request)
        waited += waited_now
        sent = observer.now() if observer is not None else 0.0
        try:
            if on_text is not None:
                response = await streamed(backend, request, timeout, on_text)
            elif timeout is None:
                response = await backend.complete(request)
            else:
                async with asyncio.timeout(timeout):
                    response = await backend.complete(request)
        except TimeoutError as exc:
            error = BackendTimeout(f"no answer within {timeout:g} s", alias=route.alias)
            error.__cause__ = exc
        except BackendError as exc:
            error = exc
        except MediaError as exc:  # the endpoint cannot take an input: say which alias
            unsent(route, reserved, held)
            raise MediaError(f"alias {route.alias!r}: {exc}") from None
        except BaseException as exc:
            route.endpoint.limiter.release(reserved, 0)
            if held is not None:
                held.settle(None)
            if observer is not None and isinstance(exc, asyncio.CancelledError):
                # Sent and then cancelled (Ctrl-C, or a budget that ended its step): the
                # request counts, as it does against a budget and may at the provider.
                observer.record_request(
                    route.endpoint.name, route.alias, call, attempts, queued, sent,
                    status=None, error=exc, final=False,
                    priced=route.endpoint.price is not None,
                )  # fmt: skip
            raise
        else:
            end_attempt(manager, route, reserved, response.usage, held)
            if observer is not None:
                observer.record_request(
                    route.endpoint.name, route.alias, call, attempts, queued, sent,
                    usage=response.usage, priced=route.endpoint.price is not None,
                )  # fmt: skip
            meta = response.meta
            meta["alias"] = route.alias
            meta["endpoint"] = route.endpoint.name
            meta["attempts"] = attempts
            meta["latency"] = time.perf_counter() - started
            meta["wait_time"] = waited
            return response
        if observer is not None:
            observer.record_request(
                route.endpoint.name, route.alias, call, attempts, queued, sent,
                status=error.status, error=error,
                final=not policy.should_retry(error, attempts),
                priced=route.endpoint.price is not None,
            )  # fmt: skip
        if held is not None:  # a refused connection sent nothing: its room comes back
            held.release() if getattr(error, "unsent", False) else held.settle(None)
        waited += await after_failure(manager, route, error, attempts, policy, reserved)


async def after_failure(
    manager: ResourceManager,
    route: Route,
    error: BackendError,
    attempts: int,
    policy: RetryPolicy,
    reserved: int,
) -> float:
    """Frees the attempt's slot; raises the final error or sleeps the backoff.

    A ``Retry-After`` within the policy's ``max_retry_after`` pauses the
    whole endpoint (and a 429 lowers its rate). One beyond it means a quota
    that will not come back within the run: that call fails at once and
    the endpoint is neither paused nor slowed, so the calls the server
    would still answer go on (each told the same fails at once too).

    Returns:
        The seconds slept before the retry.
    """
    endpoint = route.endpoint
    limiter = endpoint.limiter
    pause = error.retry_after
    if pause is None or pause <= policy.max_retry_after:
        # The pause must be in place before the slot is released, or the next
        # waiter would be sent straight into the rate limit.
        if error.status == 429:
            limiter.on_rate_limited(pause)
        elif pause:
            limiter.pause_for(pause)
    limiter.release(reserved, 0)
    if not policy.should_retry(error, attempts):
        endpoint.failures += 1
        raise exhausted(error, route.alias, attempts, policy)
    endpoint.retries += 1
    delay = policy.delay(attempts, error)
    logger.debug(
        "alias %r: attempt %d failed (%s); retrying in %.2f s",
        route.alias,
        attempts,
        error,
        delay,
    )
    await manager._sleep(delay)
    return delay


def record(manager: ResourceManager, route: Route, usage: Usage) -> None:
    """Prices a call's usage and adds it to the alias's, endpoint's, manager's, meters' totals."""
    price = route.endpoint.price
    if price is not None:
        usage.cost = price.cost(usage.input_tokens, usage.output_tokens)
    route.totals.record(usage)
    route.endpoint.totals.record(usage)
    manager._total.record(usage)
    for meter in active_meters():
        meter.record(usage)


def refused(
    manager: ResourceManager, route: Route, refusal: Refusal, claim: Claim
) -> BudgetExceededError:
    """Returns the error of a call ``refusal`` turned away, naming whose budget it was."""
    endpoint = route.endpoint
    if refusal.budget is endpoint.ledger or refusal.budget is manager.ledger:
        budget = refusal.budget
        owner = (
            f"endpoint {endpoint.name!r}" if budget is endpoint.ledger else "this ResourceManager"
        )
        assert isinstance(budget, Budget) and budget.max_cost is not None
        return BudgetExceededError(
            f"alias {route.alias!r}: the budget of ${budget.max_cost:.4f} for {owner} has no "
            f"room for the call (${budget.cost:.4f} spent; the call may cost up to "
            f"${claim.cost or 0.0:.4f}); the call was not sent. Raise 'budget' in the "
            "configuration to continue.",
            alias=route.alias,
            attempts=0,
        )
    for meter in active_meters():
        meter.refused += 1
    return BudgetExceededError(
        f"alias {route.alias!r}: the run's budget refused the call ({refusal.why}); "
        "nothing was sent. Give a larger budget to continue.",
        alias=route.alias,
        attempts=0,
    )
