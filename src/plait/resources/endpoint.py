"""`Endpoint`: one configured endpoint at run time, and how its backend is built.

The manager keeps one `Endpoint` per configuration entry. It holds the
backend (created on first use, inside the running loop), the `Limiter`, the
`RetryPolicy`, the usage totals and the counters that `EndpointStats`
reports. `ResponseCache` is the protocol a response cache implements to be
plugged into an endpoint whose configuration sets ``cache``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from plait.backends import providers
from plait.backends.base import Backend
from plait.backends.spec import ProviderSpec
from plait.backends.types import Request, Response, Usage
from plait.errors import ConfigError
from plait.resources.books import endpoint_books
from plait.resources.budget import Budget
from plait.resources.circuit import Circuit
from plait.resources.config import EndpointConfig
from plait.resources.limits import EndpointLimiter, Limiter
from plait.resources.retry import RetryPolicy
from plait.resources.usage import Price, UsageTotals

__all__ = [
    "Endpoint",
    "EndpointStats",
    "ResponseCache",
    "backend_class",
    "create_backend",
    "estimate_tokens",
    "missing_credential",
]

# Reserved for the reply when a request sets no max_tokens; the reservation is
# corrected from the reported usage as soon as the call returns.
_DEFAULT_OUTPUT_ESTIMATE = 256


class ResponseCache(Protocol):
    """What the manager needs from a response cache (implemented in ``cache.py``).

    ``key`` must depend only on what determines the reply (provider, model,
    messages, sampling options, tools, schema, ``rollout_id``), never on
    credentials or URLs. ``get`` returns a fresh `Response` the caller may
    change, or None on a miss.
    """

    def key(self, endpoint: EndpointConfig, request: Request) -> str: ...

    async def get(self, key: str) -> Response | None: ...

    async def put(self, key: str, response: Response) -> None: ...


def backend_class(provider: str) -> type[Backend]:
    """Returns the backend class of a provider, importing its module only now."""
    return _spec(provider).backend_class()


def _spec(provider: str) -> ProviderSpec:
    spec = providers.get(provider)
    if spec is None:
        raise ConfigError(
            f"unknown provider {provider!r}; known: {', '.join(map(repr, providers.names()))}"
        )
    return spec


def create_backend(config: EndpointConfig) -> Backend:
    """Builds the backend of an endpoint, importing its provider's module only now.

    The endpoint's own keys become constructor arguments, then
    ``backend_options`` add the rest (`ResourceConfig` has checked that they
    name parameters of the class and none of those keys).

    Raises:
        ConfigError: the backend could make no call (`missing_credential`);
            nothing is built.
    """
    backend = config.backend
    if backend is not None and not isinstance(backend, type):
        return backend  # a user's instance, built by them
    missing = missing_credential(config)
    if missing is not None:
        raise ConfigError(missing)
    cls, kwargs = _constructor(config)
    return cls(**kwargs)


def missing_credential(config: EndpointConfig) -> str | None:
    """Returns why an endpoint's backend could make no call for want of a credential, or None.

    One line naming the endpoint, what is missing and how to give it (its
    provider spec's ``missing_credential``, or a user's class's
    `Backend.missing_credential`, asked with the settings the backend would be
    built with, so the environment is read now). The manager asks
    before the endpoint's first call, the commands before a run: either way
    nothing has been sent.
    """
    backend = config.backend
    if backend is not None and not isinstance(backend, type):
        return None
    if backend is None:  # a provider's spec holds its rule: its backend is not imported
        missing = _spec(config.provider).missing_credential(**_arguments(config))
    else:
        cls: type[Backend] = backend
        missing = cls.missing_credential(**_user_arguments(config, cls))
    if missing is None:
        return None
    model = f" {config.model}" if config.model else ""
    return f"endpoint {config.name!r} ({config.provider}{model}) {missing}"


def _constructor(config: EndpointConfig) -> tuple[type[Backend], dict[str, Any]]:
    """Returns the class an endpoint's backend is built from and its keyword arguments."""
    backend = config.backend
    if isinstance(backend, type):
        return backend, _user_arguments(config, backend)
    return backend_class(config.provider), _arguments(config)


def _arguments(config: EndpointConfig) -> dict[str, Any]:
    """A provider's backend gets what its spec makes of the endpoint, then ``backend_options``."""
    kwargs = _spec(config.provider).backend_arguments(config)
    kwargs.update(config.backend_options)
    return kwargs


def _user_arguments(config: EndpointConfig, backend: type[Backend]) -> dict[str, Any]:
    """A user's class gets ``model=`` when the configuration names one and the
    constructor takes it, then ``backend_options``."""
    kwargs: dict[str, Any] = {}
    if config.model is not None and "model" in inspect.signature(backend).parameters:
        kwargs["model"] = config.model
    kwargs.update(config.backend_options)
    return kwargs


def estimate_tokens(request: Request) -> int:
    """Returns a rough token count of a call before it is made (prompt + reply budget).

    About four characters per token plus a few per message for the chat
    template, and the request's ``max_tokens`` (or 256) for the reply. It only
    has to be close: the tpm reservation is corrected from real usage.
    """
    chars = 0
    for message in request.messages:
        chars += len(message.content)
    reply = request.options.max_tokens or _DEFAULT_OUTPUT_ESTIMATE
    return chars // 4 + 4 * len(request.messages) + reply


@dataclass(frozen=True, slots=True)
class EndpointStats:
    """A snapshot of one endpoint's traffic and waiting, from `ResourceManager.stats`."""

    name: str
    """The configuration entry (alias, or ``"*"``)."""
    provider: str
    model: str | None
    calls: int
    """Calls that finished successfully (cache hits included)."""
    requests: int
    """Requests sent to the provider, retries included."""
    retries: int
    """Requests that were retries of a failed attempt."""
    rate_limited: int
    """429 answers that paused or slowed the endpoint (one asking to wait longer
    than ``max_retry_after`` fails its call and counts in ``failures`` only)."""
    failures: int
    """Calls that raised after their last attempt."""
    cache_hits: int
    """Calls answered from the response cache (the same as ``usage.cached``)."""
    in_flight: int
    """Requests holding a slot now."""
    queue_depth: int
    """Calls waiting for a slot, a rate or a pause now."""
    wait_time_total: float
    """Seconds calls spent waiting for limits, summed."""
    wait_time_avg: float
    """Average seconds a request waited for limits."""
    effective_rpm: float | None
    """Requests per minute allowed now (lowered after 429s), None if unlimited."""
    effective_tpm: float | None
    effective_max_concurrent: int | None
    paused_for: float
    """Seconds left of a Retry-After pause."""
    usage: Usage
    """Tokens and cost of this endpoint so far."""
    circuit: str | None = None
    """``"closed"``, ``"open"`` or ``"half-open"`` for an endpoint of a fallback chain;
    None for one that no chain lists (it keeps no circuit)."""
    circuit_opened_at: float | None = None
    """When its circuit opened (epoch seconds), while it has not closed since."""
    circuit_openings: int = 0
    """Times its circuit opened."""
    circuit_skipped: int = 0
    """Calls of its chain that skipped it while its circuit was open."""
    budget: dict[str, Any] | None = None
    """The books of its ``budget`` (`plait.resources.books.endpoint_books`: limits, spent,
    held, left), None when it has none."""


class Endpoint:
    """One configured endpoint at run time: its backend, limiter, policy and totals.

    The backend is created on first use, inside the running event loop, so
    building a manager costs nothing and imports no provider SDK.
    """

    __slots__ = (
        "backend",
        "budget",
        "cache",
        "cache_hits",
        "circuit",
        "config",
        "failures",
        "ledger",
        "limiter",
        "name",
        "price",
        "requests",
        "retries",
        "retry",
        "timeout",
        "totals",
    )

    def __init__(
        self,
        config: EndpointConfig,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[object]],
        seed: int | None,
        limiter: EndpointLimiter | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        # Another EndpointLimiter may be given (plait.distributed: one leased from a cluster).
        self.limiter: EndpointLimiter = limiter or Limiter(
            max_concurrent=config.max_concurrent,
            rpm=config.rpm,
            tpm=config.tpm,
            adaptive=config.adaptive,
            clock=clock,
            sleep=sleep,
        )
        self.retry = RetryPolicy(
            max_retries=config.max_retries,
            base_delay=config.retry_base_delay,
            max_delay=config.retry_max_delay,
            max_retry_after=config.max_retry_after,
            seed=seed,
        )
        self.timeout = config.timeout
        self.price: Price | None = config.effective_price
        self.budget = config.budget
        # The books of ``budget`` (dollars): every call holds its worst case here before it is sent.
        self.ledger = None if config.budget is None else Budget(max_cost=config.budget)
        self.backend: Backend | None = None
        self.cache: ResponseCache | None = None
        # Set when a fallback chain lists this endpoint (plait.resources.circuit).
        self.circuit: Circuit | None = None
        self.totals = UsageTotals()
        self.requests = 0
        self.retries = 0
        self.failures = 0

    def get_backend(self) -> Backend:
        """Returns the endpoint's backend, creating it on first use."""
        if self.backend is None:
            self.backend = create_backend(self.config)
        return self.backend

    def stats(self) -> EndpointStats:
        """Returns a snapshot of this endpoint's counters."""
        limiter, circuit = self.limiter, self.circuit
        return EndpointStats(
            name=self.name,
            provider=self.config.provider,
            model=self.config.model,
            calls=self.totals.calls + self.totals.usage.cached,
            requests=self.requests,
            retries=self.retries,
            rate_limited=limiter.rate_limited,
            failures=self.failures,
            cache_hits=self.totals.usage.cached,
            in_flight=limiter.in_flight,
            queue_depth=limiter.queue_depth,
            wait_time_total=limiter.wait_time_total,
            wait_time_avg=limiter.wait_time_total / limiter.acquired if limiter.acquired else 0.0,
            effective_rpm=limiter.effective_rpm,
            effective_tpm=limiter.effective_tpm,
            effective_max_concurrent=limiter.effective_max_concurrent,
            paused_for=limiter.paused_for,
            usage=self.totals.snapshot(),
            circuit=None if circuit is None else circuit.state,
            circuit_opened_at=None if circuit is None else circuit.opened_at,
            circuit_openings=0 if circuit is None else circuit.openings,
            circuit_skipped=0 if circuit is None else circuit.skipped,
            budget=endpoint_books(self),
        )
