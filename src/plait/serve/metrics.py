"""Prometheus metrics of one server, in a registry of its own (never the process-wide one).

HTTP: ``plait_http_requests_total{route,method,status}``,
``plait_http_request_duration_seconds{route}`` (histogram), ``plait_http_requests_in_flight``.
Runs: ``plait_runs_active``, ``plait_runs_queued``. Model calls, per endpoint of the resources
(an alias, or ``*``), read from the shared `ResourceManager` when scraped, so calls pay
nothing for them: ``plait_llm_calls_total``, ``plait_llm_requests_total`` (retries included),
``plait_llm_rate_limited_total`` (upstream 429s), ``plait_llm_failures_total``,
``plait_llm_cache_hits_total``, ``plait_llm_tokens_total{direction}``,
``plait_llm_cost_dollars_total``, ``plait_llm_in_flight``, ``plait_llm_queue_depth``. For
each endpoint of a fallback chain, its circuit: ``plait_llm_circuit_open`` (1 while the chain
skips it), ``plait_llm_circuit_opened_timestamp_seconds`` (when it opened, while open),
``plait_llm_circuit_openings_total``, ``plait_llm_circuit_skipped_total`` (calls that passed
it by); what it served and failed are its ``calls`` and ``failures``. For each endpoint with a
``budget``: ``plait_budget{endpoint,books,kind}``, its ``limit``, ``spent``, ``held`` (by calls
in flight) and ``left`` in ``calls``, ``tokens`` or ``cost`` (dollars).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
"""Seconds: from a cached answer to a long agent run."""


class ServerMetrics:
    """The metrics of one app, and their Prometheus text."""

    def __init__(self, service: Any) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "plait_http_requests",
            "HTTP requests answered.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "plait_http_request_duration_seconds",
            "Seconds from a request's arrival to the end of its answer.",
            ["route"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = 0
        """HTTP requests being answered now (a plain count: read when scraped)."""
        self.registry.register(_RequestsInFlight(self))
        self.registry.register(_RunsAndModelCalls(service))
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        """Counts one answered request."""
        key = (route, method, status)
        children = self._children.get(key)
        if children is None:  # found once per label set (bounded: routes are templates)
            requests = self.requests.labels(route, method, str(status))
            children = self._children[key] = (requests, self.latency.labels(route))
        children[0].inc()
        children[1].observe(seconds)

    def render(self) -> bytes:
        """Returns every metric in Prometheus text format."""
        return generate_latest(self.registry)


class _RequestsInFlight:
    """``plait_http_requests_in_flight``, read at scrape time: a request adds and takes one
    from a plain count rather than a `Gauge`, which takes a lock each time."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        text = "HTTP requests being answered."
        yield _gauge("plait_http_requests_in_flight", text, self.metrics.in_flight)


class _RunsAndModelCalls:
    """Reads runs and model calls from the service at scrape time."""

    def __init__(self, service: Any) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        admission = self.service.admission
        yield _gauge("plait_runs_active", "Runs executing now.", admission.active)
        yield _gauge("plait_runs_queued", "Runs waiting for a place now.", admission.waiting)
        manager = self.service.manager
        stats = manager.stats() if manager is not None and not manager.is_closed else {}
        counters = {
            "calls": ("plait_llm_calls", "Model calls finished (cache hits included)."),
            "requests": ("plait_llm_requests", "Requests sent to the provider, retries included."),
            "rate_limited": ("plait_llm_rate_limited", "429 answers from the provider."),
            "failures": ("plait_llm_failures", "Model calls failed after their last attempt."),
            "cache_hits": ("plait_llm_cache_hits", "Model calls answered from the cache."),
        }
        for attribute, (name, text) in counters.items():
            family = CounterMetricFamily(name, text, labels=["endpoint"])
            for endpoint, stat in stats.items():
                family.add_metric([endpoint], getattr(stat, attribute))
            yield family
        tokens = CounterMetricFamily(
            "plait_llm_tokens", "Tokens of model calls.", labels=["endpoint", "direction"]
        )
        cost = CounterMetricFamily(
            "plait_llm_cost_dollars", "Dollars spent on model calls.", labels=["endpoint"]
        )
        in_flight = GaugeMetricFamily(
            "plait_llm_in_flight", "Provider requests in flight now.", labels=["endpoint"]
        )
        queue = GaugeMetricFamily(
            "plait_llm_queue_depth", "Model calls waiting for the endpoint's limits.",
            labels=["endpoint"],
        )  # fmt: skip
        for endpoint, stat in stats.items():
            tokens.add_metric([endpoint, "input"], stat.usage.input_tokens)
            tokens.add_metric([endpoint, "output"], stat.usage.output_tokens)
            cost.add_metric([endpoint], stat.usage.cost)
            in_flight.add_metric([endpoint], stat.in_flight)
            queue.add_metric([endpoint], stat.queue_depth)
        yield from (tokens, cost, in_flight, queue)
        yield from _circuits(stats)
        yield _budgets(stats)


def _circuits(stats: dict[str, Any]) -> Iterator[Metric]:
    """The circuits of the endpoints that fallback chains list (the others keep none)."""
    is_open = GaugeMetricFamily(
        "plait_llm_circuit_open", "1 while a fallback chain skips the endpoint.",
        labels=["endpoint"],
    )  # fmt: skip
    opened = GaugeMetricFamily(
        "plait_llm_circuit_opened_timestamp_seconds",
        "When the endpoint's circuit opened (Unix time), while it is open.",
        labels=["endpoint"],
    )
    openings = CounterMetricFamily(
        "plait_llm_circuit_openings", "Times the endpoint's circuit opened.", labels=["endpoint"]
    )
    skipped = CounterMetricFamily(
        "plait_llm_circuit_skipped",
        "Calls of a fallback chain that skipped the endpoint, its circuit open.",
        labels=["endpoint"],
    )
    for endpoint, stat in stats.items():
        if stat.circuit is None:
            continue
        is_open.add_metric([endpoint], 0 if stat.circuit == "closed" else 1)
        if stat.circuit_opened_at is not None:
            opened.add_metric([endpoint], stat.circuit_opened_at)
        openings.add_metric([endpoint], stat.circuit_openings)
        skipped.add_metric([endpoint], stat.circuit_skipped)
    yield from (is_open, opened, openings, skipped)


def _budgets(stats: dict[str, Any]) -> Metric:
    """The books of each endpoint's budget (`plait.resources.books`)."""
    family = GaugeMetricFamily(
        "plait_budget",
        "An endpoint budget's limit, spent, held (by calls in flight) and left, in calls, "
        "tokens or dollars (kind=cost).",
        labels=["endpoint", "books", "kind"],
    )
    for endpoint, stat in stats.items():
        if stat.budget is None:
            continue
        for books, name in (("limit", "limits"), ("spent", "spent"), ("held", "held"),
                            ("left", "left")):  # fmt: skip
            for kind, value in stat.budget[name].items():
                if kind in stat.budget["limits"]:
                    family.add_metric([endpoint, books, kind], value)
    return family


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)
