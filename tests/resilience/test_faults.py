"""Faults at scale: 429s with Retry-After, 500s, answers past the timeout, dropped connections.

Every request the server saw is either the one success of a call or a fault
it injected, so the server's request count is exactly what the retry policy
allows: one attempt per success plus one retry per injected failure.
"""

from __future__ import annotations

from collections import Counter

import pytest

from plait import LLMInference, ResourceManager, run
from plait.errors import BackendError
from plait.testing import Fault, ScriptedServer

from .support import TwoStep, endpoint, system_of, user_of

FAULTS = [
    Fault(status=429, headers={"Retry-After": "0.2"}, rate=0.02, seed=1, times=12),
    Fault(status=500, rate=0.03, seed=2),
    Fault(status=503, rate=0.01, seed=3),
    Fault(kind="slow", delay=5.0, rate=0.01, seed=4, times=10),  # past the 1 s timeout
    Fault(kind="drop", rate=0.02, seed=5),
]


@pytest.mark.timeout(120)
async def test_a_batch_of_500_through_injected_faults_completes_exactly_once() -> None:
    items = [f"item {i}" for i in range(500)]
    async with ScriptedServer(latency=0.01, faults=FAULTS) as server:
        config = {"llm": endpoint(server, max_concurrent=32, timeout=1.0, max_retries=8)}
        async with ResourceManager(config) as manager:
            outputs = await run(TwoStep(), items, resources=manager, max_concurrent=64)
            stats = manager.stats()["llm"]
        log = server.stats.log

    # every output is its own input's, in place
    assert outputs == [f"echo: echo: item {i}" for i in range(500)]
    # every call succeeded exactly once at the server: no item was answered twice
    successes = Counter((system_of(r), user_of(r)) for r in log if r.status == 200)
    assert len(successes) == 1000 and set(successes.values()) == {1}
    # every other request is a fault the server injected, and each was retried once
    faulted = [r for r in log if r.fault is not None]
    assert len(log) == 1000 + len(faulted)
    kinds = Counter(r.fault for r in faulted)
    assert set(kinds) == {"status 429", "status 500", "status 503", "slow 5s", "drop"}
    assert kinds["status 429"] == 12 and kinds["slow 5s"] == 10
    assert (stats.requests, stats.retries, stats.failures) == (len(log), len(faulted), 0)
    assert stats.calls == 1000 and stats.rate_limited == 12


async def test_400_fails_fast_with_one_request() -> None:
    async with (
        ScriptedServer(faults=[Fault(status=400, times=1)]) as server,
        ResourceManager({"llm": endpoint(server, max_retries=5)}) as manager,
    ):
        with pytest.raises(BackendError, match="alias 'llm': HTTP 400 is not retried") as info:
            await run(LLMInference("llm"), "hello", resources=manager)
        assert manager.stats()["llm"].retries == 0
    assert info.value.attempts == 1
    assert server.stats.requests == 1


async def test_401_from_a_wrong_key_fails_fast_with_one_request_per_item() -> None:
    async with ScriptedServer(api_key="the-right-key") as server:
        config = {"llm": endpoint(server, api_key="a-wrong-key", max_retries=5)}
        async with ResourceManager(config) as manager:
            results = await run(
                LLMInference("llm"), ["a", "b", "c"], resources=manager, on_error="collect"
            )
    assert all(isinstance(r, BackendError) and r.status == 401 for r in results)
    assert all("HTTP 401 is not retried" in str(r) for r in results)
    assert server.stats.requests == 3
    assert [r.status for r in server.stats.log] == [401, 401, 401]


async def test_exhausted_retries_name_alias_attempts_and_last_status() -> None:
    async with (
        ScriptedServer(faults=[Fault(status=503)]) as server,
        ResourceManager({"judge": endpoint(server, max_retries=3)}) as manager,
    ):
        with pytest.raises(BackendError) as info:
            await run(LLMInference("judge"), "hello", resources=manager)
    message = str(info.value)
    assert "alias 'judge': gave up after 4 attempts (max_retries=3); last: HTTP 503" in message
    cause = info.value
    assert (cause.alias, cause.attempts, cause.status) == ("judge", 4, 503)
    assert server.stats.requests == 4
