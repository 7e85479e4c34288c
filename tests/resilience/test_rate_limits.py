"""Request and token rates, measured where they matter: arrival times at the server.

The limiter's buckets hold one second's worth of their rate (``burst_seconds=1``)
and start full, so the first second's worth goes at once and the rest follows at
the rate. A request is never *sent* before the bucket allows it; the only
allowance below is for the first request's trip to the server (``DELIVERY``),
which shortens the span measured from its arrival.
"""

from __future__ import annotations

from typing import Any

import pytest

from plait import LLMInference, Module, ResourceManager, run
from plait.testing import Fault, ScriptedServer

from .support import endpoint

DELIVERY = 0.2
"""Seconds the first request may take to reach the server after it was allowed to go."""


def check_windows(arrivals: list[float], weights: list[float], burst: float, rate: float) -> None:
    """Asserts that no stretch of time received more than ``burst + rate × length``.

    Arrivals are sorted; ``weights`` are what each request took from the bucket.
    One request of slack: a request delayed on its way shortens the gap to the next.
    """
    largest = max(weights)
    for i, earlier in enumerate(arrivals):
        taken = 0.0
        for j in range(i, len(arrivals)):
            taken += weights[j]
            assert taken <= burst + rate * (arrivals[j] - earlier) + largest, (
                f"requests {i}..{j} arrived within {arrivals[j] - earlier:.3f} s"
            )


async def test_120_requests_at_rpm_600_are_spaced_at_the_server() -> None:
    prompts = [f"q{i}" for i in range(120)]
    async with (
        ScriptedServer() as server,
        ResourceManager({"llm": endpoint(server, rpm=600)}) as manager,
    ):
        outputs = await run(LLMInference("llm"), prompts, resources=manager, max_concurrent=120)
        arrivals = sorted(r.arrived for r in server.stats.log)
    assert outputs == [f"echo: {p}" for p in prompts]
    assert len(arrivals) == 120
    # 600 rpm = 10 per second and a burst of 10: requests 0-9 go at once, request k
    # (k >= 10) no earlier than (k - 9) × 0.1 s, so the last at 110 × 0.1 = 11.0 s.
    assert arrivals[-1] - arrivals[0] >= 11.0 - DELIVERY
    check_windows(arrivals, [1.0] * 120, burst=10, rate=10)


async def test_tpm_spaces_large_prompts_by_their_estimated_tokens() -> None:
    def responder(body: dict[str, Any]) -> dict[str, Any]:
        # report exactly the estimate, so no reservation is corrected afterwards
        return {"content": "ok", "usage": {"prompt_tokens": 900, "completion_tokens": 100}}

    # each call is estimated before it is sent at 3,584 chars / 4 + 4 per message
    # + max_tokens 100 = 1,000 tokens; 120,000 tpm is 2,000 tokens/s, burst 2,000
    prompts = [f"{i:04d}" + "x" * 3580 for i in range(21)]
    async with (
        ScriptedServer(responder=responder) as server,
        ResourceManager({"llm": endpoint(server, tpm=120_000)}) as manager,
    ):
        await run(LLMInference("llm", max_tokens=100), prompts, resources=manager)
        usage = manager.usage()["llm"]
        arrivals = sorted(r.arrived for r in server.stats.log)
    assert usage.input_tokens + usage.output_tokens == 21_000
    # calls 0 and 1 go at once; call k waits until 2,000 + 2,000 t - 1,000 k >= 1,000,
    # i.e. t >= (k - 1) / 2: the last (k = 20) no earlier than 9.5 s.
    assert arrivals[-1] - arrivals[0] >= 9.5 - DELIVERY
    check_windows(arrivals, [1000.0] * 21, burst=2000, rate=2000)


@pytest.mark.timeout(60)
async def test_a_fan_in_whose_upstream_is_throttled_finishes() -> None:
    """Upstream calls get 429s with Retry-After; each retry runs in place, so the
    join node's bookkeeping never changes and the graph cannot deadlock, even
    with only four LLM calls allowed in flight for the whole batch."""

    class FanIn(Module):
        def __init__(self) -> None:
            super().__init__()
            self.upstream = LLMInference("throttled", system_prompt="upstream", temperature=0.0)
            self.side = LLMInference("fine", system_prompt="side", temperature=0.0)
            self.join = LLMInference("fine", system_prompt="join", temperature=0.0)

        def forward(self, text: str) -> str:
            return self.join(f"{self.upstream(text)} + {self.side(text)}")

    throttle = Fault(status=429, headers={"Retry-After": "0.2"}, rate=0.5, seed=3, times=20)
    items = [f"item {i}" for i in range(30)]
    async with (
        ScriptedServer(latency=0.01, faults=[throttle]) as upstream_server,
        ScriptedServer(latency=0.01) as other_server,
        ResourceManager(
            {
                "throttled": endpoint(upstream_server, max_concurrent=2, max_retries=10),
                "fine": endpoint(other_server, max_concurrent=4),
            }
        ) as manager,
    ):
        outputs = await run(FanIn(), items, resources=manager, max_concurrent=4)
    assert outputs == [f"echo: echo: {x} + echo: {x}" for x in items]
    up_log = upstream_server.stats.log
    assert sum(r.status == 429 for r in up_log) == 20
    assert sum(r.status == 200 for r in up_log) == 30
    # each join was sent only after its upstream call had finally been answered
    answered = {r.body["messages"][-1]["content"]: r.finished for r in up_log if r.status == 200}
    for record in other_server.stats.log:
        system = record.body["messages"][0]["content"]
        if system == "join":
            item = record.body["messages"][-1]["content"].split(" + ")[1].removeprefix("echo: ")
            finished = answered[item]
            assert finished is not None and record.arrived >= finished
