"""`ResourceManager`: sends every model call of a run through its endpoint's limits.

The execution layer never talks to a backend directly. It calls
``await manager.complete(alias, request)``, and the call goes through these
modules, each one concern (functions over the manager's state, so the manager
itself stays one page and the path makes the calls it made as methods):

1. `ResourceManager.complete` resolves the alias to its route (`routes.Route`;
   ``UnknownAliasError`` names the known ones) and its endpoint; a fallback
   chain goes through `routes.fall_back`, each member a call of its own;
2. `reuse.cached_or_fresh` answers from the endpoint's response cache when it
   has one and it hits (and the caller accepts the cached reply), or waits
   for an identical call already in flight;
3. `attempts.call_endpoint` makes the attempts: it waits for the endpoint's limiter
   (slot, rpm, tpm, pause), holds room for the request's worst case in every
   budget over it (`attempts.hold_room`: the endpoint's, the manager's, the
   run's; waiting while room held by calls in flight may come back, refusing
   with ``BudgetExceededError``, nothing sent, only when it could never fit),
   calls the backend under the per-attempt timeout (through `chunks.streamed`
   for a caller reading text as it comes), retries in place what the
   endpoint's `RetryPolicy` allows, and records usage and cost;
4. `reuse.cached_or_fresh` stores the reply in the cache only when it was
   accepted (finished normally, and the caller's ``accept`` said yes), and
   the `Response` returns with ``meta`` filled in.

`ResourceManager.stream` takes the same steps through `streaming.stream_from`
(and `streaming.stream_chain` for a chain), without the cache. Each endpoint
keeps its own limits, usage, cost and response cache (a reply is cached under
the endpoint that gave it), and the profiler, callbacks and ``meta["endpoint"]``
name the endpoint that served.

One manager holds one backend (one connection pool) and one limiter per
endpoint. `ResourceManager.shared` (`sharing.shared_manager`) returns the same
manager for equal configurations on the same event loop, so every call and
every batch item that uses a configuration shares its limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any

from plait.backends.types import Request, Response, StreamChunk, Usage, message_to_dict
from plait.callbacks import ReportedCall, active_callbacks
from plait.resources.budget import Budget
from plait.resources.chunks import TextSink
from plait.resources.circuit import Circuit
from plait.resources.config import EndpointConfig, ResourceConfig
from plait.resources.endpoint import Endpoint, EndpointStats, ResponseCache
from plait.resources.limits import EndpointLimiter
from plait.resources.reuse import Accept, cached_or_fresh, default_cache_factory
from plait.resources.routes import Route, fall_back
from plait.resources.shared_budget import BudgetStore
from plait.resources.sharing import shared_manager
from plait.resources.streaming import stream_chain, stream_from
from plait.resources.usage import UsageTotals

__all__ = ["Accept", "EndpointStats", "ResourceManager", "ResponseCache", "TextSink"]


class ResourceManager:
    """Runs model calls for the aliases of a `ResourceConfig`, within their limits.

    Args:
        config: the configuration, or a mapping to build one from.
        budget: dollars all endpoints together may spend (a `Budget` that
            counts an endpoint without a price as free); a call that could
            never fit raises `BudgetExceededError` without sending anything.
        cache_factory: builds the response cache of an endpoint whose config
            sets ``cache``; defaults to ``plait.resources.cache.create_cache``
            (in the configuration's ``state`` store when it names one).
        clock: monotonic clock for the limiters (tests inject a fake one).
        sleep: sleep for limiter waits and retry backoff, on ``clock``'s scale.
        seed: seeds retry jitter, for reproducible tests.
        limiter_factory: builds the limiter of each endpoint from its
            configuration, instead of a local `Limiter` (``plait.distributed``
            plugs in one that asks a Ray actor, so limits hold across a cluster);
            None for an endpoint leaves it its local `Limiter`.
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
        limiter_factory: Callable[[EndpointConfig], EndpointLimiter | None] | None = None,
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
        # What the concern modules read and write (attempts: ledger, _sleep, _total;
        # reuse: _in_flight; sharing: _closed, _closer); the manager owns it all.
        self._budget_store = budget_store
        if budget_store is not None:
            self.ledger = budget_store.share("manager", self.ledger)
        self._cache_factory = cache_factory or functools.partial(
            default_cache_factory, state=config.state
        )
        self._clock = clock
        self._sleep = sleep
        self._seed = seed
        self._limiter_factory = limiter_factory
        self._endpoints: dict[str, Endpoint] = {}
        self._routes: dict[str, Route] = {}
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
        manager: ResourceManager | None = resources._shared.get(loop)  # the fast path
        if manager is None or manager._closed:
            manager = shared_manager(cls, resources, loop)
        return manager

    # -- calls --------------------------------------------------------------------------

    def _route(self, alias: str) -> Route:
        """Resolves an alias seen for the first time (the hot path hits `_routes`)."""
        if self._closed:
            raise RuntimeError("this ResourceManager is closed; create a new one")
        configs = self.config.fallbacks(alias)  # raises UnknownAliasError
        route = Route(alias, self._endpoint(configs[0]))
        if len(configs) > 1:
            route.fallbacks = tuple(
                Route(alias, self._endpoint(config, in_chain=True), route.totals)
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
            return await fall_back(self, route, request, cache, max_retries, accept, on_text)
        callbacks = active_callbacks()
        if not callbacks:
            return await cached_or_fresh(self, route, request, cache, max_retries, accept, on_text)
        return await self._reported(route, request, cache, max_retries, accept, on_text, callbacks)

    async def _reported(
        self,
        route: Route,
        request: Request,
        cache: bool,
        max_retries: int | None,
        accept: Accept | None,
        on_text: TextSink | None,
        callbacks: tuple[Any, ...],
    ) -> Response:
        """Makes the call on ``route``'s endpoint, told to ``callbacks`` as one LM call."""
        if not callbacks:
            return await cached_or_fresh(self, route, request, cache, max_retries, accept, on_text)
        inputs = _lm_inputs(route, request)
        with ReportedCall("lm", route.endpoint.config, inputs, callbacks) as call:
            call.outputs = await cached_or_fresh(
                self, route, request, cache, max_retries, accept, on_text
            )
        return call.outputs

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
        reached the caller, that endpoint's failure is raised. It raises the same
        errors as `complete`.
        """
        route = self._routes.get(alias) or self._route(alias)
        if route.fallbacks is None:
            async with contextlib.aclosing(stream_from(self, route, request, max_retries)) as one:
                async for chunk in one:
                    yield chunk
            return
        async with contextlib.aclosing(stream_chain(self, route, request, max_retries)) as chain:
            async for chunk in chain:
                yield chunk

    # -- usage -----------------------------------------------------------------------

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

    # -- observation --------------------------------------------------------------------

    def usage(self) -> dict[str, Usage]:
        """Returns tokens, cost and cache hits so far per alias, as the program named them."""
        return {alias: route.totals.snapshot() for alias, route in self._routes.items()}

    def total_usage(self) -> Usage:
        """Returns tokens, cost and cache hits so far over all aliases."""
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


def _lm_inputs(route: Route, request: Request) -> dict[str, Any]:
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
