"""ResourceManager over real loopback HTTP against the scripted server.

Every assertion about limits, pauses and retries is on what the server saw
(arrival times, peak concurrency, request counts), never on client timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from plait.backends.types import Message, Request, Response, SamplingOptions, Usage
from plait.errors import (
    BackendConnectionError,
    BackendError,
    BackendTimeout,
    BudgetExceededError,
    UnknownAliasError,
)
from plait.resources import EndpointConfig, ResourceConfig, ResourceManager
from plait.testing import Fault, ScriptedServer

FAST_RETRY = {"retry_base_delay": 0.01, "retry_max_delay": 0.05}


def ask(text: str = "hello", **kwargs: Any) -> Request:
    return Request(messages=(Message("user", text),), **kwargs)


def endpoint(server: ScriptedServer, **options: Any) -> dict[str, Any]:
    return {
        "provider": "openai",
        "model": "gpt-4o-mini",
        "base_url": server.base_url,
        "api_key": "test-key",
        **FAST_RETRY,
        **options,
    }


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(latency=0.05) as running:
        yield running


async def test_max_concurrent_holds_across_50_concurrent_calls(server: ScriptedServer) -> None:
    async with ResourceManager({"fast": endpoint(server, max_concurrent=5)}) as manager:
        responses = await asyncio.gather(
            *(manager.complete("fast", ask(f"item {i}")) for i in range(50))
        )
        stats = manager.stats()["fast"]
    assert server.stats.peak_concurrency == 5
    assert server.stats.requests == 50
    assert [r.text for r in responses] == [f"echo: item {i}" for i in range(50)]
    first = responses[0].meta
    assert (first["alias"], first["attempts"]) == ("fast", 1)
    assert first["latency"] >= first["wait_time"] >= 0.0
    assert (stats.calls, stats.requests, stats.retries, stats.in_flight) == (50, 50, 0, 0)
    assert stats.queue_depth == 0 and stats.wait_time_total > 0


async def test_stats_show_queue_depth_and_in_flight_while_calls_wait() -> None:
    async with (
        ScriptedServer(latency=0.2) as slow,
        ResourceManager({"fast": endpoint(slow, max_concurrent=2)}) as manager,
    ):
        calls = [asyncio.create_task(manager.complete("fast", ask())) for _ in range(6)]
        while slow.stats.in_flight < 2:
            await asyncio.sleep(0.01)
        stats = manager.stats()["fast"]
        assert (stats.in_flight, stats.queue_depth) == (2, 4)
        await asyncio.gather(*calls)


async def test_retry_after_pauses_the_whole_endpoint(server: ScriptedServer) -> None:
    server.inject(Fault(status=429, headers={"Retry-After": "1"}, times=1))
    config = {"fast": endpoint(server, max_concurrent=4, rpm=6000)}
    async with ResourceManager(config) as manager:
        responses = await asyncio.gather(*(manager.complete("fast", ask()) for _ in range(20)))
        stats = manager.stats()["fast"]
    log = server.stats.log
    rejected = [r for r in log if r.status == 429]
    assert len(rejected) == 1 and len(log) == 21
    answered_at = rejected[0].finished
    assert answered_at is not None
    # The first request to arrive got the 429 at once; the other three sent with it
    # were still being answered (latency 0.05 s). Every later request waited for a
    # slot freed after the 429, so none may arrive before the second has passed.
    arrivals = sorted(r.arrived for r in log)
    assert arrivals[0] == rejected[0].arrived
    assert min(arrivals[4:]) >= answered_at + 1.0
    assert sorted(r.meta["attempts"] for r in responses) == [1] * 19 + [2]
    assert stats.rate_limited == 1 and stats.retries == 1
    # halved by the 429, then a step back up for each of the 20 successes
    assert stats.effective_rpm == pytest.approx(6000 * (0.5 + 20 * 0.02))


async def test_server_errors_are_retried_in_place_and_counted(server: ScriptedServer) -> None:
    server.inject(Fault(status=500, times=2))
    async with ResourceManager({"fast": endpoint(server, max_retries=3)}) as manager:
        response = await manager.complete("fast", ask())
        stats = manager.stats()["fast"]
    assert response.text == "echo: hello"
    assert response.meta["attempts"] == 3
    assert server.stats.requests == 3
    assert [r.status for r in server.stats.log] == [500, 500, 200]
    assert (stats.requests, stats.retries, stats.failures) == (3, 2, 0)


async def test_a_dropped_connection_is_retried(server: ScriptedServer) -> None:
    server.inject(Fault(kind="drop", times=1))
    async with ResourceManager({"fast": endpoint(server)}) as manager:
        response = await manager.complete("fast", ask())
    assert response.meta["attempts"] == 2
    assert server.stats.requests == 2


async def test_retries_run_out_with_a_message_naming_alias_attempts_and_status(
    server: ScriptedServer,
) -> None:
    server.inject(Fault(status=503))
    async with ResourceManager({"fast": endpoint(server, max_retries=2)}) as manager:
        with pytest.raises(BackendError, match=r"alias 'fast': gave up after 3 attempts") as info:
            await manager.complete("fast", ask())
        assert manager.stats()["fast"].failures == 1
    assert "last: HTTP 503" in str(info.value)
    assert (info.value.alias, info.value.attempts, info.value.status) == ("fast", 3, 503)
    assert server.stats.requests == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_client_errors_fail_fast_with_one_request(
    server: ScriptedServer, status: int
) -> None:
    server.inject(Fault(status=status, times=1))
    async with ResourceManager({"fast": endpoint(server, max_retries=5)}) as manager:
        with pytest.raises(BackendError, match=f"alias 'fast': HTTP {status} is not retried"):
            await manager.complete("fast", ask())
    assert server.stats.requests == 1


async def test_timeouts_are_retried_then_raised_with_attempts(server: ScriptedServer) -> None:
    server.inject(Fault(kind="slow", delay=5.0))
    async with ResourceManager({"fast": endpoint(server, max_retries=2)}) as manager:
        with pytest.raises(BackendTimeout) as info:
            await manager.complete("fast", ask(timeout=0.2))
    assert (info.value.alias, info.value.attempts) == ("fast", 3)
    assert "alias 'fast': gave up after 3 attempts" in str(info.value)
    assert server.stats.requests == 3


async def test_endpoint_timeout_applies_and_a_slow_answer_is_retried(
    server: ScriptedServer,
) -> None:
    server.inject(Fault(kind="slow", delay=5.0, times=1))
    async with ResourceManager({"fast": endpoint(server, timeout=0.3)}) as manager:
        response = await manager.complete("fast", ask())
    assert response.meta["attempts"] == 2
    assert server.stats.requests == 2


async def test_usage_totals_match_what_the_server_reported(server: ScriptedServer) -> None:
    reported: list[tuple[int, int]] = []

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        prompt = len(body["messages"][-1]["content"])
        reported.append((prompt, 3))
        return {"content": "ok", "usage": {"prompt_tokens": prompt, "completion_tokens": 3}}

    server.responder = responder
    config = ResourceConfig({"fast": endpoint(server), "*": endpoint(server, model="llama-x")})
    async with ResourceManager(config) as manager:
        await asyncio.gather(*(manager.complete("fast", ask("x" * i)) for i in range(1, 11)))
        await manager.complete("other", ask("four"))
        per_alias = manager.usage()
        total = manager.total_usage()
    fast = per_alias["fast"]
    assert fast.input_tokens == sum(p for p, _ in reported[:10]) == 55
    assert fast.output_tokens == 30
    assert per_alias["other"].input_tokens == 4
    assert total.input_tokens == 59 and total.output_tokens == 33
    # gpt-4o-mini is in the price table; "llama-x" has no known price
    assert fast.cost == pytest.approx((55 * 0.15 + 30 * 0.60) / 1e6)
    assert per_alias["other"].cost == 0.0
    assert total.cost == pytest.approx(fast.cost)


async def test_cost_is_set_on_each_response_from_a_configured_price(
    server: ScriptedServer,
) -> None:
    server.responder = lambda body: {
        "content": "ok",
        "usage": {"prompt_tokens": 1000, "completion_tokens": 500},
    }
    price = {"input": 2.0, "output": 8.0}
    async with ResourceManager({"fast": endpoint(server, price=price)}) as manager:
        response = await manager.complete("fast", ask())
    assert response.usage == Usage(1000, 500, pytest.approx(0.006))


async def test_budget_stops_further_calls_before_anything_is_sent(
    server: ScriptedServer,
) -> None:
    server.responder = lambda body: {
        "content": "ok",
        "usage": {"prompt_tokens": 1000, "completion_tokens": 0},
    }
    price = {"input": 1000.0, "output": 0.0}  # $1 per call
    config = {"fast": endpoint(server, price=price, budget=2.5)}
    async with ResourceManager(config) as manager:
        for _ in range(3):
            await manager.complete("fast", ask())
        with pytest.raises(BudgetExceededError, match=r"alias 'fast': the budget of \$2\.5"):
            await manager.complete("fast", ask())
    assert server.stats.requests == 3

    server.reset_stats()  # calls queued behind the one that spends the budget are not sent
    config = {"fast": endpoint(server, price=price, max_concurrent=1)}
    async with ResourceManager(config, budget=1.0) as manager:
        results = await asyncio.gather(
            *(manager.complete("fast", ask()) for _ in range(5)), return_exceptions=True
        )
        assert [type(r).__name__ for r in results] == ["Response"] + ["BudgetExceededError"] * 4
        assert manager.stats()["fast"].in_flight == 0
    assert server.stats.requests == 1

    server.reset_stats()
    async with ResourceManager({"fast": endpoint(server, price=price)}, budget=1.0) as manager:
        await manager.complete("fast", ask())
        with pytest.raises(BudgetExceededError, match="this ResourceManager"):
            await manager.complete("fast", ask())
    assert server.stats.requests == 1


async def test_two_aliases_have_separate_limits_and_wildcard_aliases_share_one() -> None:
    async with ScriptedServer(latency=0.05) as a, ScriptedServer(latency=0.05) as b:
        config = {
            "a": endpoint(a, max_concurrent=2),
            "b": endpoint(b, max_concurrent=3),
            "*": endpoint(b, max_concurrent=1),
        }
        async with ResourceManager(config) as manager:
            await asyncio.gather(
                *(manager.complete(alias, ask()) for alias in ["a", "b"] * 15),
            )
            assert (a.stats.peak_concurrency, b.stats.peak_concurrency) == (2, 3)
            b.reset_stats()
            await asyncio.gather(*(manager.complete(alias, ask()) for alias in ["x", "y"] * 4))
            assert b.stats.peak_concurrency == 1 and b.stats.requests == 8
            assert set(manager.stats()) == {"a", "b", "*"}
            assert set(manager.usage()) == {"a", "b", "x", "y"}


async def test_rpm_spaces_arrivals_at_the_server(server: ScriptedServer) -> None:
    server.latency = 0.0
    async with ResourceManager({"fast": endpoint(server, rpm=600)}) as manager:
        started = time.monotonic()  # the server's clock; the bucket is full and untouched
        await asyncio.gather(*(manager.complete("fast", ask()) for _ in range(20)))
    arrivals = sorted(r.arrived for r in server.stats.log)
    assert len(arrivals) == 20
    # rpm=600 allows a burst of one second's worth (10), then one request per 0.1 s:
    # request k (k >= 10) cannot reach the server before (k - 9) × 0.1 s after the
    # start. Only that bound is exact: a request held up on its way (a busy CPU) can
    # arrive together with the next one, so the gaps between arrivals prove nothing.
    for k, arrived in enumerate(arrivals):
        assert arrived - started >= max(0, k - 9) * 0.1, (k, arrived - started)


async def test_unknown_alias_names_the_known_ones(server: ScriptedServer) -> None:
    async with ResourceManager({"fast": endpoint(server), "smart": endpoint(server)}) as m:
        with pytest.raises(UnknownAliasError, match=r"'judge'.*known: 'fast', 'smart'"):
            await m.complete("judge", ask())
    assert server.stats.requests == 0


async def test_stream_yields_chunks_records_usage_and_retries_before_the_first_chunk(
    server: ScriptedServer,
) -> None:
    server.inject(Fault(status=500, times=1))
    async with ResourceManager({"fast": endpoint(server)}) as manager:
        chunks = [c async for c in manager.stream("fast", ask("streamed words"))]
        text = "".join(c.text for c in chunks)
        usage = manager.usage()["fast"]
        stats = manager.stats()["fast"]
    assert text == "echo: streamed words"
    assert server.stats.requests == 2 and stats.retries == 1
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    last = [c.usage for c in chunks if c.usage is not None][-1]
    assert last.cost == pytest.approx(usage.cost) and usage.cost > 0


async def test_stream_failure_after_a_chunk_is_not_retried(server: ScriptedServer) -> None:
    server.inject(Fault(kind="drop", after_chunks=2, times=1))
    async with ResourceManager({"fast": endpoint(server)}) as manager:
        seen: list[str] = []
        with pytest.raises(BackendConnectionError) as info:
            async for chunk in manager.stream("fast", ask("a b c d e f")):
                seen.append(chunk.text)
        assert manager.stats()["fast"].in_flight == 0
    assert seen and info.value.attempts == 1 and info.value.alias == "fast"
    assert server.stats.requests == 1


async def test_an_abandoned_stream_frees_its_slot(server: ScriptedServer) -> None:
    async with ResourceManager({"fast": endpoint(server, max_concurrent=1)}) as manager:
        async with contextlib.aclosing(manager.stream("fast", ask("a b c"))) as stream:
            async for _ in stream:
                break
        assert manager.stats()["fast"].in_flight == 0
        assert (await manager.complete("fast", ask())).text == "echo: hello"


class MemoryCache:
    """A minimal cache speaking the manager's cache protocol (the real one is cache.py)."""

    def __init__(self, endpoint: EndpointConfig) -> None:
        self.store: dict[str, Response] = {}

    def key(self, endpoint: EndpointConfig, request: Request) -> str:
        return repr((endpoint.provider, endpoint.model, request.messages))

    async def get(self, key: str) -> Response | None:
        hit = self.store.get(key)
        return None if hit is None else Response(hit.text, usage=Usage(**vars_of(hit.usage)))

    async def put(self, key: str, response: Response) -> None:
        self.store[key] = response


def vars_of(usage: Usage) -> dict[str, Any]:
    return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}


async def test_cache_seam_serves_hits_without_requests_or_cost(server: ScriptedServer) -> None:
    config = {"fast": endpoint(server, cache=True)}
    async with ResourceManager(config, cache_factory=MemoryCache) as manager:
        first = await manager.complete("fast", ask())
        second = await manager.complete("fast", ask())
        assert server.stats.requests == 1
        assert second.text == first.text and second.meta["cached"] is True
        assert second.usage.cost == 0.0 and first.usage.cost > 0
        await manager.complete("fast", ask(), cache=False)
        assert server.stats.requests == 2
        stats = manager.stats()["fast"]
        assert (stats.cache_hits, stats.calls) == (1, 3)
        assert manager.total_usage().cost == pytest.approx(2 * first.usage.cost)


async def test_per_call_max_retries_overrides_the_endpoint(server: ScriptedServer) -> None:
    server.inject(Fault(status=500, times=1))
    async with ResourceManager({"fast": endpoint(server, max_retries=3)}) as manager:
        with pytest.raises(BackendError, match=r"max_retries=0"):
            await manager.complete("fast", ask(), max_retries=0)
    assert server.stats.requests == 1


async def test_max_tokens_reaches_the_tpm_estimate_and_tpm_spaces_calls(
    server: ScriptedServer,
) -> None:
    server.latency = 0.0
    server.responder = lambda body: {
        "content": "ok",
        "usage": {"prompt_tokens": 100, "completion_tokens": 100},
    }
    # 12,000 tpm = 200 tokens per second, burst 200: each call reserves 4 + 1 + 200
    # tokens up front and really uses 200, so after the first the calls go ~1 s apart.
    request = ask("1234", options=SamplingOptions(max_tokens=200))
    async with ResourceManager({"fast": endpoint(server, tpm=12_000)}) as manager:
        started = time.monotonic()
        await asyncio.gather(*(manager.complete("fast", request) for _ in range(3)))
    arrivals = sorted(r.arrived for r in server.stats.log)
    # Call k waits until the bucket is back at 200: no sooner than k seconds after the
    # start (had the estimate ignored max_tokens, all three would have gone at once).
    for k, arrived in enumerate(arrivals):
        assert arrived - started >= k, (k, arrived - started)


async def test_closed_manager_refuses_calls(server: ScriptedServer) -> None:
    manager = ResourceManager({"fast": endpoint(server)})
    await manager.complete("fast", ask())
    await manager.aclose()
    assert manager.is_closed
    with pytest.raises(RuntimeError, match="closed"):
        await manager.complete("fast", ask())


async def test_shared_returns_one_manager_per_equal_config_and_loop(server: ScriptedServer) -> None:
    config = ResourceConfig({"fast": endpoint(server)})
    manager = ResourceManager.shared(config)
    assert ResourceManager.shared(config) is manager
    assert ResourceManager.shared(manager) is manager
    equal = ResourceConfig({"fast": endpoint(server)})
    assert ResourceManager.shared(equal) is manager  # equal settings share one manager
    assert ResourceManager.shared({"fast": endpoint(server)}) is manager  # a mapping too
    other = ResourceConfig({"fast": endpoint(server, max_retries=1)})
    assert ResourceManager.shared(other) is not manager
    await manager.aclose()
    assert ResourceManager.shared(config) is not manager  # a closed one is replaced
    with pytest.raises(TypeError, match="resources must be a ResourceConfig"):
        ResourceManager.shared(["fast"])  # type: ignore[arg-type]


def test_shared_gives_each_event_loop_its_own_manager() -> None:
    config = ResourceConfig({"*": {"provider": "local"}})

    async def get() -> ResourceManager:
        return ResourceManager.shared(config)

    first_loop, second_loop = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        first = first_loop.run_until_complete(get())
        assert first_loop.run_until_complete(get()) is first
        first_loop.close()
        second = second_loop.run_until_complete(get())
        assert first is not second
        assert list(config._shared) == [second_loop]  # the closed loop's manager was dropped
    finally:
        first_loop.close()
        second_loop.close()
    with pytest.raises(RuntimeError, match="running event loop"):
        ResourceManager.shared(config)


def test_a_shared_manager_is_closed_when_asyncio_run_ends() -> None:
    config = ResourceConfig(
        {"x": {"provider": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}}
    )
    managers = []

    async def main() -> None:
        managers.append(ResourceManager.shared(config))

    asyncio.run(main())
    assert managers[0].is_closed
