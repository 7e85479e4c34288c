"""Every budget is one ledger: never passed with 64 calls in flight, and used, not wasted.

The scripted server reports 5 prompt tokens and 1 reply token per call and
the endpoint charges $1 per 1,000 tokens, so a call really costs $0.006
while it holds its worst case (its prompt's ~22 tokens counted as a bound,
plus 256 reply tokens without ``max_tokens``: about $0.28). What the tests
assert is what the server saw and what the manager was billed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from plait import LLMInference, ResourceManager, run
from plait.backends.types import Message, Request, Usage
from plait.errors import BudgetExceededError
from plait.optimization.evaluation import evaluate
from plait.resources.budget import Budget, Claim, budgeted, hold
from plait.testing import ScriptedServer

from .support import endpoint

PRICE = {"input": 1000.0, "output": 1000.0}  # $0.001 a token
PER_CALL = 0.006  # 5 + 1 tokens, as the server reports them
WORST_CASE = 0.3  # what one request without max_tokens holds here, rounded up
N = 256


def six_tokens(body: dict[str, Any]) -> dict[str, Any]:
    return {"content": "ok", "usage": {"prompt_tokens": 5, "completion_tokens": 1}}


@pytest.fixture
async def server() -> Any:
    async with ScriptedServer(responder=six_tokens, latency=0.02) as running:
        yield running


def examples() -> list[tuple[str, str]]:
    return [(f"question {i}", "ok") for i in range(N)]


async def test_an_evaluation_whose_whole_cost_fits_its_budget_finishes_with_64_in_flight(
    server: ScriptedServer,
) -> None:
    # Seven holds of ~$0.28 fill $2.00, so on main every later call was refused (7 of 256 ran).
    budget = 1.3 * N * PER_CALL
    async with ResourceManager({"llm": endpoint(server, price=PRICE, max_concurrent=64)}) as m:
        result = await evaluate(
            LLMInference("llm"), examples(), resources=m, max_concurrent=64, max_cost=budget
        )
        spent = m.total_usage().cost
    assert not result.stopped_by_budget and result.unevaluated == 0
    assert server.stats.requests == N and spent == pytest.approx(N * PER_CALL)
    assert server.stats.peak_concurrency > 1  # room was held in flight, not one at a time


@pytest.mark.parametrize(("max_tokens", "worst_case"), [(None, WORST_CASE), (4, 0.03)])
async def test_an_evaluation_stopped_by_its_budget_spent_all_but_one_worst_case(
    server: ScriptedServer, max_tokens: int | None, worst_case: float
) -> None:
    # On main, half the whole cost as a budget stopped the run after 1.6 % of it was spent.
    budget = 0.5 * N * PER_CALL
    async with ResourceManager({"llm": endpoint(server, price=PRICE, max_concurrent=64)}) as m:
        result = await evaluate(
            LLMInference("llm", max_tokens=max_tokens),
            examples(),
            resources=m,
            max_concurrent=64,
            max_cost=budget,
        )
        spent = m.total_usage().cost
    assert result.stopped_by_budget and 0 < result.unevaluated < N
    assert budget - worst_case <= spent <= budget
    assert spent == pytest.approx(server.stats.requests * PER_CALL)


@pytest.mark.parametrize("whose", ["endpoint", "manager"])
async def test_an_endpoint_or_manager_budget_is_never_passed_with_64_in_flight(
    server: ScriptedServer, whose: str
) -> None:
    # On main these counted finished calls only: waves of 64 calls went past the budget.
    budget = 1.0
    options: dict[str, Any] = {"price": PRICE, "max_concurrent": 64}
    if whose == "endpoint":
        options["budget"] = budget
    async with ResourceManager(
        {"llm": endpoint(server, **options)}, budget=budget if whose == "manager" else None
    ) as manager:
        items = [f"question {i}" for i in range(N)]
        results = await run(LLMInference("llm"), items, resources=manager, on_error="collect")
        spent = manager.total_usage().cost
        ledger = manager.ledger if whose == "manager" else manager._endpoints["llm"].ledger
        assert ledger is not None
        books = ledger.snapshot()
    assert server.stats.requests * PER_CALL <= budget + 1e-9
    assert budget - WORST_CASE <= spent <= budget
    refused = [r for r in results if isinstance(r, Exception)]
    assert refused and all(isinstance(r, BudgetExceededError) for r in refused)
    assert f"the budget of $1.0000 for {'endpoint' if whose == 'endpoint' else 'this'}" in str(
        refused[0]
    )
    assert books["held"] == {"calls": 0, "tokens": 0, "cost": 0.0} and books["waiting"] == 0


async def test_a_request_that_does_not_fit_waits_and_goes_when_a_hold_settles() -> None:
    budget = Budget(max_tokens=100)
    first = Claim(60, None)
    assert await hold([budget], first) is None
    waiter = asyncio.create_task(hold([budget], Claim(60, None)))
    await asyncio.sleep(0)
    assert not waiter.done() and budget.snapshot()["waiting"] == 1
    budget.settle(first, Usage(10, 0))  # the real usage leaves room: the waiter is woken
    assert await waiter is None
    assert budget.held()["tokens"] == 60 and budget.spent() == {
        "calls": 2,
        "tokens": 10,
        "cost": 0.0,
    }


async def test_a_waiter_is_refused_once_what_was_spent_leaves_it_no_room() -> None:
    budget = Budget(max_tokens=100)
    first = Claim(60, None)
    assert await hold([budget], first) is None
    waiter = asyncio.create_task(hold([budget], Claim(60, None)))
    await asyncio.sleep(0)
    budget.settle(first, Usage(50, 0))  # 50 spent + 60 can never fit in 100
    refusal = await waiter
    assert refusal is not None and refusal.budget is budget
    assert refusal.why.startswith("max_tokens=100 leave no room for a request of up to 60")
    assert budget.refused == 1 and budget.spent()["calls"] == 1


async def test_a_release_wakes_a_waiter_and_room_is_held_in_every_budget_or_none() -> None:
    outer, inner = Budget(max_calls=10), Budget(max_calls=1)
    first = Claim(1, 0.0)
    assert await hold([outer, inner], first) is None
    waiter = asyncio.create_task(hold([outer, inner], Claim(1, 0.0)))
    await asyncio.sleep(0)
    # Waiting on the inner budget, it holds nothing in the outer one.
    assert outer.held()["calls"] == 1 and outer.calls == 1
    for budget in (outer, inner):
        budget.release(first)  # never sent
    assert await waiter is None
    assert (outer.calls, inner.calls) == (1, 1)


async def test_a_cancelled_waiter_leaves_the_books_as_they_were() -> None:
    budget = Budget(max_cost=1.0)
    first = Claim(10, 0.8)
    assert await hold([budget], first) is None
    before = budget.snapshot()
    waiter = asyncio.create_task(hold([budget], Claim(10, 0.5)))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert budget.snapshot() == before  # waiting 0 again
    budget.settle(first, Usage(1, 1, 0.1))
    assert await hold([budget], Claim(10, 0.5)) is None  # and the books still work
    assert budget.snapshot()["held"]["cost"] == 0.5


async def test_a_run_cancelled_while_its_calls_wait_for_room_frees_every_slot_and_hold(
    server: ScriptedServer,
) -> None:
    budget = Budget(max_cost=1.0)  # about three worst cases: most of 64 calls wait for room
    async with ResourceManager({"llm": endpoint(server, price=PRICE, max_concurrent=64)}) as m:
        with budgeted(budget):
            task = asyncio.create_task(
                run(LLMInference("llm"), [f"q {i}" for i in range(64)], resources=m)
            )
        while server.stats.requests < 4 and not task.done():
            await asyncio.sleep(0.01)
        assert budget.snapshot()["waiting"] > 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stats = m.stats()["llm"]
        books = budget.snapshot()
    assert (stats.in_flight, stats.queue_depth) == (0, 0)
    assert books["held"] == {"calls": 0, "tokens": 0, "cost": 0.0} and books["waiting"] == 0
    assert books["spent"]["cost"] <= 1.0 and books["spent"]["calls"] >= server.stats.requests


async def test_streamed_calls_hold_room_as_calls_do(server: ScriptedServer) -> None:
    budget = 0.5
    config = {"llm": endpoint(server, price=PRICE, budget=budget, max_concurrent=64)}
    async with ResourceManager(config) as manager:

        async def one(i: int) -> bool:
            request = Request(messages=(Message("user", f"question {i}"),))
            try:
                async for _ in manager.stream("llm", request):
                    pass
            except BudgetExceededError:
                return False
            return True

        answered = await asyncio.gather(*(one(i) for i in range(128)))
        spent = manager.total_usage().cost
    assert server.stats.requests == sum(answered) and not all(answered)
    assert budget - WORST_CASE <= spent <= budget
    assert server.stats.requests * PER_CALL <= budget + 1e-9


async def test_a_reply_that_reports_no_usage_is_charged_its_worst_case() -> None:
    # A llama.cpp server never streams usage: counted as free, it would never stop a budget.
    async with (
        ScriptedServer(dialect="llama_cpp") as server,
        ResourceManager({"llm": endpoint(server, max_concurrent=8)}) as manager,
    ):
        budget = Budget(max_tokens=3_000)  # ten worst cases of about 270 tokens
        with budgeted(budget):

            async def one(i: int) -> bool:
                request = Request(messages=(Message("user", f"question {i}"),))
                try:
                    async for _ in manager.stream("llm", request):
                        pass
                except BudgetExceededError:
                    return False
                return True

            answered = await asyncio.gather(*(one(i) for i in range(40)))
    assert manager.total_usage().total_tokens == 0  # the server said nothing of its tokens
    assert 0 < sum(answered) == server.stats.requests <= 11
    assert 3_000 - 300 <= budget.spent()["tokens"] <= 3_000
