# size: ResourceManager with its routes, budgets and cache hooks; issue 35 splits it by concern.
"""`ResourceManager`: sends every model call of a run through its endpoint's limits.

The execution layer never talks to a backend directly. It calls
``await manager.complete(alias, request)`` and the manager:

1. resolves the alias to its endpoint (``UnknownAliasError`` names the known ones);
2. answers from the response cache when the endpoint has one and it hits
   (and the caller accepts the cached reply);
3. waits for the endpoint's limiter (slot, rpm, tpm, pause);
4. holds room for the request's worst case in every budget over it
   (`plait.resources.budget`: the endpoint's, the manager's, the run's),
   waiting while room held by calls in flight may come back, and refusing it
   (``BudgetExceededError``, nothing sent) only when it could never fit;
5. calls the backend under the per-attempt timeout, retrying in place what the
   endpoint's `RetryPolicy` allows (a ``Retry-After`` pauses the endpoint; one
   longer than ``max_retry_after`` fails its call at once and pauses nothing);
6. records usage and cost, stores the reply in the cache only when it was
   accepted (finished normally, and the caller's ``accept`` said yes), and
   returns the `Response` with ``meta`` filled in.

An alias whose entry is a fallback chain (``{"fallback": ["primary",
"backup"]}``) is served by the first of its endpoints that answers: a call
that fails on one after that endpoint's own retries (or whose budget is spent,
or whose circuit is open, `plait.resources.circuit`) goes to the next. Only a
request that would fail anywhere stops the chain: a 400 (which is also how
providers refuse content by policy) or a 422. An auth error (401/403) or an
unknown model (404) is one provider's problem and is passed on. Each endpoint
keeps its own limits, usage, cost and response cache (a reply is cached under
the endpoint that gave it), and the profiler, callbacks and ``meta["endpoint"]``
name the endpoint that served.

One manager holds one backend (one connection pool) and one limiter per
endpoint. `ResourceManager.shared` returns the same manager for the same
configuration object on the same event loop, so every call and every batch
item that uses a configuration shares its limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import logging
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Protocol

from plait import _context
from plait.backends.base import Backend
from plait.backends.types import Request, Response, StreamChunk, Usage, message_to_dict
from plait.callbacks import ReportedCall, active_callbacks
from plait.errors import (
    BackendError,
    BackendTimeout,
    BudgetExceededError,
    CircuitOpenError,
    ConfigError,
    MediaError,
)
from plait.resources.budget import Budget, Claim, Refusal, active_budgets, claim_of, hold
from plait.resources.circuit import Circuit
from plait.resources.config import EndpointConfig, ResourceConfig
from plait.resources.endpoint import (
    Endpoint,
    EndpointStats,
    ResponseCache,
    estimate_tokens,
)
from plait.resources.limits import EndpointLimiter
from plait.resources.retry import RetryPolicy, exhausted
from plait.resources.shared_budget import BudgetStore
from plait.resources.usage import UsageTotals, active_meters

__all__ = ["EndpointStats", "ResourceManager", "ResponseCache"]

logger = logging.getLogger("plait.resources")

Accept = Callable[[Response], bool]
"""Decides whether a reply is what the caller asked for (see `ResourceManager.complete`)."""


class TextSink(Protocol):
    """Where a streaming `ResourceManager.complete` sends the reply's text as it arrives."""

    started: bool
    """Whether text has been sent since the last restart."""

    async def text(self, delta: str) -> None: ...

    async def restart(self, reason: str) -> None: ...


_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Any, ResourceManager]] = (
    weakref.WeakKeyDictionary()
)
"""Per event loop, the shared manager of each configuration identity."""

_UNFINISHED = frozenset({"length", "content_filter"})
"""Finish reasons of replies that were cut off or withheld: returned, never cached."""


def _default_cache_factory(config: EndpointConfig) -> ResponseCache:
    try:
        module = importlib.import_module("plait.resources.cache")
    except ModuleNotFoundError as exc:
        if exc.name != "plait.resources.cache":
            raise
        raise ConfigError(
            f"alias {config.name!r}: key 'cache' is set but the response cache "
            "(plait.resources.cache) is not available in this installation"
        ) from exc
    cache: ResponseCache = module.create_cache(config)
    return cache


_STOPS_A_CHAIN = frozenset({400, 422})
"""Statuses that say the request itself is wrong, so another endpoint would refuse it too."""


class _Route:
    """An alias as the program names it, bound to the endpoint that serves it.

    An alias that names a fallback chain has one route per endpoint of the
    chain in ``fallbacks`` (sharing the alias's totals); ``endpoint`` is then
    the chain's first.
    """

    __slots__ = ("alias", "endpoint", "fallbacks", "totals")

    def __init__(self, alias: str, endpoint: Endpoint, totals: UsageTotals | None = None) -> None:
        self.alias = alias
        self.endpoint = endpoint
        self.totals = totals or UsageTotals()
        self.fallbacks: tuple[_Route, ...] | None = None


class _BudgetHold:
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


# size: one object per run owns every endpoint's state; split by concern in issue 35.
class ResourceManager:
    """Runs model calls for the aliases of a `ResourceConfig`, within their limits.

    Args:
        config: the configuration, or a mapping to build one from.
        budget: dollars all endpoints together may spend (a `Budget` that
            counts an endpoint without a price as free); a call that could
            never fit raises `BudgetExceededError` without sending anything.
        cache_factory: builds the response cache of an endpoint whose config
            sets ``cache``; defaults to ``plait.resources.cache.create_cache``.
        clock: monotonic clock for the limiters (tests inject a fake one).
        sleep: sleep for limiter waits and retry backoff, on ``clock``'s scale.
        seed: seeds retry jitter, for reproducible tests.
        limiter_factory: builds the limiter of each endpoint from its
            configuration, instead of a local `Limiter` (``plait.distributed``
            plugs in one that asks a Ray actor, so limits hold across a cluster).
        budget_store: keeps ``budget`` and the endpoints' ``budget`` where other
            processes spend them too (`plait.resources.shared_budget.BudgetStore`:
            ``plait serve --workers``' SQLite file, a cluster's budget actor), so
            together they spend each once.

    Example::

        async with ResourceManager({"fast": {"provider": "local"}}) as manager:
            request = Request(messages=(Message("user", "Say hi"),))
            response = await manager.complete("fast", request)
            response.meta["attempts"], manager.usage()["fast"].output_tokens

    Most code should not build managers: `ResourceManager.shared` returns the
    one for a configuration on the running loop.
    """

    def __init__(
        self,
        config: ResourceConfig | Mapping[str, Any],
        *,
        budget: float | None = None,
        cache_factory: Callable[[EndpointConfig], ResponseCache] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        seed: int | None = None,
        limiter_factory: Callable[[EndpointConfig], EndpointLimiter] | None = None,
        budget_store: BudgetStore | None = None,
    ) -> None:
        if not isinstance(config, ResourceConfig):
            config = ResourceConfig(config)
        if budget is not None and budget < 0:
            raise ValueError(f"budget must be >= 0 dollars, got {budget}")
        self.config = config
        self.budget = budget
        self.ledger = None if budget is None else Budget(max_cost=budget, unpriced_free=True)
        """The books of ``budget`` (`Budget.snapshot` says what is spent, held and left)."""
        self._budget_store = budget_store
        if budget_store is not None:
            self.ledger = budget_store.share("manager", self.ledger)
        self._cache_factory = cache_factory or _default_cache_factory
        self._clock = clock
        self._sleep = sleep
        self._seed = seed
        self._limiter_factory = limiter_factory
        self._endpoints: dict[str, Endpoint] = {}
        self._routes: dict[str, _Route] = {}
        self._total = UsageTotals()
        self._closed = False
        self._closer: AsyncIterator[None] | None = None
        self._in_flight: dict[str, asyncio.Future[Response]] = {}

    @classmethod
    def shared(
        cls, resources: ResourceConfig | ResourceManager | Mapping[str, Any]
    ) -> ResourceManager:
        """Returns the manager of ``resources`` for the running event loop.

        Equal configurations (`ResourceConfig.identity`) get one manager per
        event loop, so everything that runs with the same settings on the same
        loop shares backends and limits, even when the configuration is a
        mapping or a new `ResourceConfig` built for each call (a notebook cell
        per call would otherwise open and leak a connection pool each time). A
        manager is returned as it is. Shared managers close when their loop
        shuts down (the end of ``asyncio.run``, or the process for ``run_sync``).

        Raises:
            RuntimeError: when called outside a running event loop.
            TypeError: for anything but a config, a manager or a mapping.
        """
        if isinstance(resources, ResourceManager):
            return resources
        if isinstance(resources, Mapping):
            resources = ResourceConfig(resources)
        elif not isinstance(resources, ResourceConfig):
            raise TypeError(
                "resources must be a ResourceConfig, a ResourceManager or a mapping of "
                f"alias -> endpoint settings, got {type(resources).__name__}"
            )
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "ResourceManager.shared() must be called inside a running event loop "
                "(from async code); outside one, build ResourceManager(config) yourself"
            ) from None
        registry = resources._shared  # the fast path: this config object on this loop
        manager: ResourceManager | None = registry.get(loop)
        if manager is None or manager._closed:
            for old_loop in [old for old in registry if old.is_closed()]:
                del registry[old_loop]
            equal = _SHARED.setdefault(loop, {})
            manager = equal.get(resources.identity)
            if manager is None or manager._closed:
                manager = equal[resources.identity] = cls(resources)
                _close_when_loop_shuts_down(manager, loop)
            registry[loop] = manager
        return manager

    # -- calls --------------------------------------------------------------------------

    def _route(self, alias: str) -> _Route:
        """Resolves an alias seen for the first time (the hot path hits `_routes`)."""
        if self._closed:
            raise RuntimeError("this ResourceManager is closed; create a new one")
        configs = self.config.fallbacks(alias)  # raises UnknownAliasError
        route = _Route(alias, self._endpoint(configs[0]))
        if len(configs) > 1:
            route.fallbacks = tuple(
                _Route(alias, self._endpoint(config, in_chain=True), route.totals)
                for config in configs
            )
        self._routes[alias] = route
        return route

    def _endpoint(self, config: EndpointConfig, *, in_chain: bool = False) -> Endpoint:
        """Returns the endpoint of a configuration entry, creating it on first use."""
        endpoint = self._endpoints.get(config.name)
        if endpoint is None:
            limiter = None if self._limiter_factory is None else self._limiter_factory(config)
            endpoint = Endpoint(
                config, clock=self._clock, sleep=self._sleep, seed=self._seed, limiter=limiter
            )
            if config.cache:
                endpoint.cache = self._cache_factory(config)
            if self._budget_store is not None:
                endpoint.ledger = self._budget_store.share(
                    f"endpoint:{config.name}", endpoint.ledger
                )
            self._endpoints[config.name] = endpoint
        if in_chain and endpoint.circuit is None:
            endpoint.circuit = Circuit(
                config.circuit_failures, config.circuit_cooldown, self._clock, config.name
            )
        return endpoint

    async def complete(
        self,
        alias: str,
        request: Request,
        *,
        cache: bool = True,
        max_retries: int | None = None,
        accept: Accept | None = None,
        on_text: TextSink | None = None,
    ) -> Response:
        """Makes one model call on the endpoint serving ``alias``, within its limits.

        Args:
            alias: the name the program uses for the model.
            request: what to send; ``request.timeout`` overrides the
                endpoint's timeout for each attempt.
            cache: False skips the endpoint's response cache for this call.
            max_retries: overrides the endpoint's ``max_retries`` for this call.
            accept: ``accept(response) -> bool``, called once on the response
                this call returns (fresh, shared or from the cache) before it
                is returned. Only a reply it accepts is stored in the cache, and
                a cached reply it refuses counts as a miss; a structured call
                passes its validation here, so a reply that failed validation
                is never replayed from the cache.
            on_text: receives the reply's text as it arrives (``await
                on_text.text(delta)``): the call then uses the backend's real
                stream, with the same cache, limits, retries and usage as
                without it. A cache hit arrives as one piece. Before a retry
                that follows streamed text, ``await on_text.restart(reason)``
                tells the sink to discard it.

        Returns:
            The response, with ``usage.cost`` set when the price is known and
            ``meta`` holding ``alias``, ``endpoint`` (the configuration entry
            that answered), ``attempts`` (on that endpoint), ``latency``
            (seconds of the whole call on it, waits and retries included) and
            ``wait_time`` (seconds of it spent waiting for limits and
            backoff); a cache hit has ``meta["cached"] = True`` and costs
            nothing. After a fallback, ``meta["fell_back_from"]`` lists the
            endpoints of the chain that failed or were skipped first.

        Raises:
            UnknownAliasError: no endpoint serves ``alias``.
            BudgetExceededError: a budget is spent; nothing was sent.
            BackendError: the call failed and will not be retried, or retries
                ran out; ``alias`` and ``attempts`` are set and the message
                says both and the last status. For a fallback chain: the last
                endpoint's error, its message naming every endpoint's failure,
                or the 400/422 that stopped the chain.
            CircuitOpenError: every endpoint of the alias's chain is skipped
                by its open circuit; nothing was sent.
            ConfigError: the endpoint's backend cannot be built, e.g. it needs
                an API key that is nowhere (`endpoint.missing_credential`, read
                at each call until the backend is built); nothing was sent or
                counted.
        """
        route = self._routes.get(alias) or self._route(alias)
        if route.fallbacks is not None:
            return await self._fall_back(route, request, cache, max_retries, accept, on_text)
        callbacks = active_callbacks()
        if not callbacks:
            return await self._cached_or_fresh(route, request, cache, max_retries, accept, on_text)
        return await self._reported(route, request, cache, max_retries, accept, on_text, callbacks)

    async def _reported(
        self,
        route: _Route,
        request: Request,
        cache: bool,
        max_retries: int | None,
        accept: Accept | None,
        on_text: TextSink | None,
        callbacks: tuple[Any, ...],
    ) -> Response:
        """Makes the call on ``route``'s endpoint, told to ``callbacks`` as one LM call."""
        if not callbacks:
            return await self._cached_or_fresh(route, request, cache, max_retries, accept, on_text)
        inputs = _lm_inputs(route, request)
        with ReportedCall("lm", route.endpoint.config, inputs, callbacks) as call:
            call.outputs = await self._cached_or_fresh(
                route, request, cache, max_retries, accept, on_text
            )
        return call.outputs

    async def _fall_back(
        self,
        route: _Route,
        request: Request,
        cache: bool,
        max_retries: int | None,
        accept: Accept | None,
        on_text: TextSink | None,
    ) -> Response:
        """Makes the call on the first endpoint of ``route``'s chain that answers.

        Each endpoint is a call of its own, told to callbacks and the profiler
        under its own name. A streaming caller that already received text from
        a failed endpoint is told to discard it (``on_text.restart``), as for
        a retry.
        """
        callbacks = active_callbacks()
        skipped: list[tuple[str, str]] = []
        last: BackendError | None = None
        for member in route.fallbacks or ():
            circuit, probe = _admitted(member, skipped)
            if probe is None:
                continue
            try:
                response = await self._reported(
                    member, request, cache, max_retries, accept, on_text, callbacks
                )
            except BackendError as error:
                if not _passed_on(circuit, probe, error):
                    raise
                skipped.append((member.endpoint.name, str(error)))
                last = error
                if on_text is not None and on_text.started:
                    await on_text.restart(f"fell back from {member.endpoint.name!r}: {error}")
                continue
            except BaseException:
                circuit.abandoned(probe)
                raise
            circuit.succeeded()
            if skipped:
                response.meta["fell_back_from"] = [name for name, _ in skipped]
                logger.info(
                    "alias %r: answered by %r after %s",
                    route.alias,
                    member.endpoint.name,
                    "; ".join(f"{name!r}: {why}" for name, why in skipped),
                )
            return response
        raise _chain_failed(route.alias, skipped, last)

    async def _cached_or_fresh(
        self,
        route: _Route,
        request: Request,
        cache: bool,
        max_retries: int | None,
        accept: Accept | None,
        on_text: TextSink | None,
    ) -> Response:
        endpoint = route.endpoint
        response_cache = endpoint.cache if cache else None
        if response_cache is None:
            response = await self._complete(route, request, max_retries, on_text)
            if accept is not None:
                accept(response)
            return response
        key = response_cache.key(endpoint.config, request)
        hit = await response_cache.get(key)
        if hit is not None and _accepts(accept, hit):
            return await self._replay(route, hit, on_text)
        shared = await self._join_in_flight(key)
        if shared is not None:
            reply = _copy_response(shared)
            if _accepts(accept, reply):
                return await self._replay(route, reply, on_text)
        leader: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = leader
        try:
            response = await self._complete(route, request, max_retries, on_text)
            accepted = _accepts(accept, response)
            if accepted:
                await response_cache.put(key, response)
        except BaseException:
            leader.cancel()  # followers make their own call
            raise
        finally:
            del self._in_flight[key]
        if accepted:
            leader.set_result(_copy_response(response))
        else:
            leader.cancel()  # a refused reply is not handed on: followers ask themselves
        return response

    async def _join_in_flight(self, key: str) -> Response | None:
        """Waits for an identical cacheable call already in flight; None if there is none.

        A batch with repeated inputs would otherwise pay for each repeat while
        the first answer is still on its way. If that call fails, or its reply
        is refused, the follower gets None and makes its own call.
        """
        leader = self._in_flight.get(key)
        if leader is None:
            return None
        try:
            return await asyncio.shield(leader)
        except asyncio.CancelledError:
            if leader.cancelled():
                return None
            raise  # this caller itself was cancelled

    def _plan(
        self, route: _Route, request: Request, max_retries: int | None
    ) -> tuple[Backend, RetryPolicy, float | None, int]:
        """Returns what every attempt of a call uses.

        Returns:
            The backend, the retry policy, the per-attempt timeout, and the
            tokens to reserve on the endpoint's tpm bucket.
        """
        endpoint = route.endpoint
        policy = (
            endpoint.retry if max_retries is None else endpoint.retry.with_max_retries(max_retries)
        )
        timeout = request.timeout if request.timeout is not None else endpoint.timeout
        reserved = 0 if endpoint.limiter.tpm is None else estimate_tokens(request)
        try:
            backend = endpoint.get_backend()
        except ConfigError as exc:  # a missing API key, found before anything is sent
            raise ConfigError(f"alias {route.alias!r}: {exc}") from None
        return backend, policy, timeout, reserved

    async def _begin_attempt(
        self, route: _Route, reserved: int, request: Request
    ) -> tuple[float, _BudgetHold | None]:
        """Waits for the endpoint's limits, then for room in its budgets; counts the request.

        Returns:
            The seconds waited for the limits, and the budgets' hold (None
            without budgets), which the attempt settles when it ends.
        """
        endpoint = route.endpoint
        waited = await endpoint.limiter.acquire(reserved)
        budgets = active_budgets()
        if endpoint.ledger is not None or self.ledger is not None:
            budgets = (*(b for b in (endpoint.ledger, self.ledger) if b is not None), *budgets)
        held = await self._hold(route, request, budgets, reserved) if budgets else None
        endpoint.requests += 1
        return waited, held

    async def _hold(
        self, route: _Route, request: Request, budgets: tuple[Budget, ...], reserved: int
    ) -> _BudgetHold:
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
            return _BudgetHold(budgets, claim)
        route.endpoint.limiter.release(reserved, 0)
        raise self._refused(route, refusal, claim)

    def _end_attempt(
        self, route: _Route, reserved: int, usage: Usage, held: _BudgetHold | None
    ) -> None:
        """Frees a successful attempt's slot, corrects its token reservation, records usage."""
        limiter = route.endpoint.limiter
        used = usage.input_tokens + usage.output_tokens
        limiter.release(reserved, used or None)
        limiter.on_success()
        self._record(route, usage)
        if held is not None:
            held.settle(usage)

    def _unsent(self, route: _Route, reserved: int, held: _BudgetHold | None) -> None:
        """Undoes an attempt its backend refused before sending anything (an input it
        cannot take): the slot is freed, and neither the endpoint's requests nor the
        run's budgets count it, as a profiler is never told of it."""
        route.endpoint.limiter.release(reserved, 0)
        route.endpoint.requests -= 1
        if held is not None:
            held.release()

    async def _replay(
        self, route: _Route, response: Response, on_text: TextSink | None
    ) -> Response:
        """Returns a cached (or shared) reply; a streaming caller gets its text in one piece."""
        if on_text is not None and response.text:
            await on_text.text(response.text)
        return self._cache_hit(route, response)

    async def _complete(
        self,
        route: _Route,
        request: Request,
        max_retries: int | None,
        on_text: TextSink | None = None,
    ) -> Response:
        backend, policy, timeout, reserved = self._plan(route, request, max_retries)
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
            waited_now, held = await self._begin_attempt(route, reserved, request)
            waited += waited_now
            sent = observer.now() if observer is not None else 0.0
            try:
                if on_text is not None:
                    response = await _streamed(backend, request, timeout, on_text)
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
                self._unsent(route, reserved, held)
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
                self._end_attempt(route, reserved, response.usage, held)
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
            waited += await self._after_failure(route, error, attempts, policy, reserved)

    async def _after_failure(
        self,
        route: _Route,
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
        await self._sleep(delay)
        return delay

    async def stream(
        self, alias: str, request: Request, *, max_retries: int | None = None
    ) -> AsyncGenerator[StreamChunk, None]:
        """Streams one model call on the endpoint serving ``alias``, within its limits.

        The endpoint's slot is held until the stream ends or is closed; close
        an abandoned stream (``contextlib.aclosing``) to free it at once. A
        failure before the first chunk is retried like `complete`; after a
        chunk was yielded it is raised, since the caller has already seen
        part of the reply. The timeout covers the waits for the backend (time
        the caller spends between chunks does not count). The last chunk's
        usage gets its cost, and is added to the totals. Streams never use
        the response cache.

        An alias that names a fallback chain goes to the next endpoint only
        while nothing was yielded: once a chunk of one endpoint's reply has
        reached the caller, that endpoint's failure is raised.

        Raises:
            The same errors as `complete`.
        """
        route = self._routes.get(alias) or self._route(alias)
        if route.fallbacks is None:
            async with contextlib.aclosing(self._stream_from(route, request, max_retries)) as one:
                async for chunk in one:
                    yield chunk
            return
        skipped: list[tuple[str, str]] = []
        last: BackendError | None = None
        for member in route.fallbacks:
            circuit, probe = _admitted(member, skipped)
            if probe is None:
                continue
            yielded = False
            try:
                async with contextlib.aclosing(
                    self._stream_from(member, request, max_retries)
                ) as chunks:
                    async for chunk in chunks:
                        yielded = True
                        yield chunk
            except BackendError as error:
                if yielded:  # the caller has part of this endpoint's reply: no other may follow
                    circuit.failed(probe)
                    raise
                if not _passed_on(circuit, probe, error):
                    raise
                skipped.append((member.endpoint.name, str(error)))
                last = error
                continue
            except BaseException:
                circuit.abandoned(probe)
                raise
            circuit.succeeded()
            return
        raise _chain_failed(route.alias, skipped, last)

    async def _stream_from(
        self, route: _Route, request: Request, max_retries: int | None
    ) -> AsyncGenerator[StreamChunk, None]:
        """Streams one call from ``route``'s endpoint, retrying before the first chunk."""
        alias = route.alias
        endpoint = route.endpoint
        backend, policy, timeout, reserved = self._plan(route, request, max_retries)
        attempts = 0
        while True:
            attempts += 1
            _, held = await self._begin_attempt(route, reserved, request)
            chunks = _within(backend.stream(request), timeout)
            usage: Usage | None = None
            yielded = False
            try:
                async for chunk in chunks:
                    if chunk.usage is not None:
                        usage = chunk.usage
                        if endpoint.price is not None:  # priced before the caller sees it
                            usage.cost = endpoint.price.cost(
                                usage.input_tokens, usage.output_tokens
                            )
                    yielded = True
                    yield chunk
            except TimeoutError as exc:
                error: BackendError = BackendTimeout(
                    f"stream not finished within {timeout:g} s", alias=alias
                )
                error.__cause__ = exc
            except BackendError as exc:
                error = exc
            except MediaError as exc:
                self._unsent(route, reserved, held)
                raise MediaError(f"alias {alias!r}: {exc}") from None
            except BaseException:
                endpoint.limiter.release(reserved, 0)
                if held is not None:
                    held.settle(None)
                raise
            else:
                self._end_attempt(route, reserved, usage or Usage(), held)
                return
            finally:
                await chunks.aclose()
            if held is not None:  # a refused connection sent nothing: its room comes back
                held.release() if getattr(error, "unsent", False) else held.settle(None)
            if yielded:  # the caller has part of the reply: a retry would repeat it
                endpoint.limiter.release(reserved, None)
                endpoint.failures += 1
                error.alias, error.attempts = alias, attempts
                error.args = (f"alias {alias!r}: stream broke after its first chunk: {error}",)
                raise error
            await self._after_failure(route, error, attempts, policy, reserved)

    # -- usage, budget, cache -------------------------------------------------------------

    def record_usage(self, alias: str, usage: Usage, *, price_factor: float = 1.0) -> Usage:
        """Adds a call answered outside `complete` (a provider batch job) to the totals.

        Its cost is the endpoint's price times ``price_factor`` (batch APIs bill
        about half), set on ``usage`` and returned with it.
        """
        route = self._routes.get(alias) or self._route(alias)
        price = route.endpoint.price
        if price is not None:
            usage.cost = price.cost(usage.input_tokens, usage.output_tokens) * price_factor
        route.totals.record(usage)
        route.endpoint.totals.record(usage)
        self._total.record(usage)
        for ledger in (route.endpoint.ledger, self.ledger):
            if ledger is not None:
                ledger.add(usage)
        return usage

    def _record(self, route: _Route, usage: Usage) -> None:
        price = route.endpoint.price
        if price is not None:
            usage.cost = price.cost(usage.input_tokens, usage.output_tokens)
        route.totals.record(usage)
        route.endpoint.totals.record(usage)
        self._total.record(usage)
        for meter in active_meters():
            meter.record(usage)

    def _refused(self, route: _Route, refusal: Refusal, claim: Claim) -> BudgetExceededError:
        """Returns the error of a call ``refusal`` turned away, naming whose budget it was."""
        endpoint = route.endpoint
        if refusal.budget is endpoint.ledger or refusal.budget is self.ledger:
            budget = refusal.budget
            owner = (
                f"endpoint {endpoint.name!r}"
                if budget is endpoint.ledger
                else "this ResourceManager"
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

    def _cache_hit(self, route: _Route, response: Response) -> Response:
        route.endpoint.cache_hits += 1
        for meter in active_meters():
            meter.cached += 1
        response.usage.cost = 0.0
        meta = response.meta
        meta["cached"] = True
        meta["alias"] = route.alias
        meta["endpoint"] = route.endpoint.name
        meta["attempts"] = 0
        meta["latency"] = 0.0
        meta["wait_time"] = 0.0
        return response

    # -- observation --------------------------------------------------------------------

    def usage(self) -> dict[str, Usage]:
        """Returns tokens and cost so far per alias, as the program named them."""
        return {alias: route.totals.snapshot() for alias, route in self._routes.items()}

    def total_usage(self) -> Usage:
        """Returns tokens and cost so far over all aliases."""
        return self._total.snapshot()

    def stats(self) -> dict[str, EndpointStats]:
        """Returns a snapshot of each endpoint used so far, by configuration entry name."""
        return {name: endpoint.stats() for name, endpoint in self._endpoints.items()}

    # -- lifetime -----------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        """Whether `aclose` was called; a closed manager refuses new aliases."""
        return self._closed

    async def aclose(self) -> None:
        """Closes every backend (connection pools, models) and any caches."""
        self._closed = True
        self._routes.clear()
        for endpoint in self._endpoints.values():
            backend, endpoint.backend = endpoint.backend, None
            if backend is not None:
                await backend.aclose()
            cache_close = getattr(endpoint.cache, "aclose", None)
            if cache_close is not None:
                await cache_close()

    async def __aenter__(self) -> ResourceManager:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._endpoints)} endpoints in use"
        return f"ResourceManager({self.config.aliases()!r}, {state})"


def _accepts(accept: Accept | None, response: Response) -> bool:
    """Whether ``response`` may be cached and handed to other callers.

    A reply cut off by the token limit or withheld by a content filter is
    returned to its caller (who sees ``finish_reason``) but never cached: a
    later run should ask again rather than replay a truncated answer.
    ``accept`` runs on every response a call returns, so the caller's
    validation sees cache hits too.
    """
    accepted = accept is None or bool(accept(response))
    return accepted and response.finish_reason not in _UNFINISHED


async def _within(
    stream: AsyncIterator[StreamChunk], timeout: float | None
) -> AsyncGenerator[StreamChunk, None]:
    """Yields a backend's chunks, each wait for the backend guarded by one ``timeout``.

    The deadline guards the waits for the backend, never a yield: a timeout
    spanning a yield would cancel the consumer's code instead, and the time
    the consumer holds a chunk (a slow reader) moves the deadline out.
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    chunks = stream.__aiter__()
    try:
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            paused = loop.time()
            yield chunk
            if deadline is not None:
                deadline += loop.time() - paused
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


async def _streamed(
    backend: Backend, request: Request, timeout: float | None, on_text: TextSink
) -> Response:
    """Makes one attempt over the backend's stream, passing text to ``on_text``; the whole reply.

    The timeout covers the waits for the backend only (`_within`), so a slow
    reader (backpressure in the sink) never times a healthy call out.
    """
    chunks = _within(backend.stream(request), timeout)
    text: list[str] = []
    calls: list[Any] = []
    usage: Usage | None = None
    finish: str | None = None
    try:
        async for chunk in chunks:
            if chunk.text:
                text.append(chunk.text)
                await on_text.text(chunk.text)
            calls.extend(chunk.tool_calls)
            usage = chunk.usage or usage
            finish = chunk.finish_reason or finish
    finally:
        await chunks.aclose()
    return Response(
        text="".join(text), tool_calls=tuple(calls), usage=usage or Usage(), finish_reason=finish
    )


def _passed_on(circuit: Circuit, probe: bool, error: BackendError) -> bool:
    """Notes an endpoint's failure on its circuit; returns whether its chain goes on.

    A 400 or 422 stops the chain (any endpoint would refuse the request), and
    proves the endpoint is up. A spent budget passes the call on without
    counting against the endpoint; anything else counts as a failed call.
    """
    if error.status in _STOPS_A_CHAIN:
        circuit.succeeded()
        return False
    if isinstance(error, BudgetExceededError):
        circuit.abandoned(probe)
    else:
        circuit.failed(probe)
    return True


def _admitted(member: _Route, skipped: list[tuple[str, str]]) -> tuple[Circuit, bool | None]:
    """Asks the circuit of a chain's endpoint whether a call may go (`Circuit.admit`).

    Returns the circuit and its answer; a skip is noted in ``skipped`` with why.
    """
    circuit = member.endpoint.circuit
    assert circuit is not None  # every endpoint a chain lists has one (_route)
    probe = circuit.admit(member.alias)
    if probe is None:
        why = (
            f"skipped: circuit open after {circuit.consecutive} failed calls in a row "
            f"(probed again in {circuit.retry_in():.0f} s)"
        )
        skipped.append((member.endpoint.name, why))
    return circuit, probe


def _chain_failed(
    alias: str, skipped: list[tuple[str, str]], last: BackendError | None
) -> BackendError:
    """Returns the error of a call that no endpoint of its chain answered.

    That is the last endpoint's own error (its type and status are what callers
    match on), its message naming what happened on every endpoint; or, when
    every endpoint was skipped, a `CircuitOpenError`.
    """
    own = f"alias {alias!r}: "  # each endpoint's error already names the alias
    story = "; ".join(f"{name!r}: {why.removeprefix(own)}" for name, why in skipped)
    message = f"alias {alias!r}: no endpoint of its fallback chain answered: {story}"
    if last is None:
        return CircuitOpenError(message, alias=alias, attempts=0)
    last.args = (message, *last.args[1:])
    return last


def _lm_inputs(route: _Route, request: Request) -> dict[str, Any]:
    """Returns what an ``on_lm_start`` callback is told about a request (only when one listens)."""
    config = route.endpoint.config
    inputs: dict[str, Any] = {
        "alias": route.alias,
        "endpoint": config.name,
        "provider": config.provider,
        "model": request.model or config.model,
        "messages": [message_to_dict(m) for m in request.messages],
        **request.options.as_dict(),
    }
    if request.tools:
        inputs["tools"] = [tool.name for tool in request.tools]
    if request.response_schema is not None:
        inputs["response_format"] = request.response_schema.name
    return inputs


def _copy_response(response: Response) -> Response:
    """Returns a response another caller may mark and mutate without touching the original."""
    return dataclasses.replace(
        response, usage=dataclasses.replace(response.usage), meta=dict(response.meta)
    )


async def _closer(manager: ResourceManager) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await manager.aclose()


def _close_when_loop_shuts_down(manager: ResourceManager, loop: asyncio.AbstractEventLoop) -> None:
    """Closes a shared manager when its loop shuts down (the end of ``asyncio.run``).

    A shared manager is created implicitly, so nobody closes it; left open, its
    connection pools are reported as unclosed when the loop ends. A started
    async generator is what ``loop.shutdown_asyncgens()`` closes before the loop
    stops, so its ``finally`` runs on that loop at the right time.
    """
    closer = _closer(manager)
    manager._closer = closer  # keeps it alive until the loop closes it

    async def start() -> None:
        await closer.__anext__()  # first step: the loop now tracks the generator

    loop.create_task(start())
