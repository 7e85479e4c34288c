"""Request and token rates, measured where they matter: arrival times at the server.

The limiter's buckets hold one second's worth of their rate (``burst_seconds=1``)
and start full, so the first second's worth goes at once and the rest follows at
the rate. A request is never *sent* before the bucket allows it, so counted from
the start of the run, the k-th request cannot reach the server before the
bucket's schedule says. That is what the tests assert, and only that: a request
may reach the server later than it was sent, by as long as a loaded machine
keeps the client's or the server's loop from running, so the gaps *between*
arrivals say nothing exact (requests sent 0.1 s apart can arrive together).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from plait import LLMInference, Module, ResourceManager, run
from plait.testing import Fault, ScriptedServer

from .support import endpoint


def check_schedule(arrivals: list[float], started: float, earliest: list[float]) -> None:
    """Asserts that the k-th arrival (sorted) came no sooner than ``earliest[k]`` s after start."""
    for k, (arrived, allowed) in enumerate(zip(arrivals, earliest, strict=True)):
        assert arrived - started >= allowed, (
            f"request {k} arrived {arrived - started:.3f} s after the start, "
            f"before the bucket allowed it ({allowed:.3f} s)"
        )


async def test_120_requests_at_rpm_600_are_spaced_at_the_server() -> None:
    prompts = [f"q{i}" for i in range(120)]
    async with (
        ScriptedServer() as server,
        ResourceManager({"llm": endpoint(server, rpm=600)}) as manager,
    ):
        started = time.monotonic()  # the server's clock; the bucket is full and untouched
        outputs = await run(LLMInference("llm"), prompts, resources=manager, max_concurrent=120)
        arrivals = sorted(r.arrived for r in server.stats.log)
    assert outputs == [f"echo: {p}" for p in prompts]
    assert len(arrivals) == 120
    # 600 rpm = 10 per second and a burst of 10: requests 0-9 may go at once, request k
    # (k >= 10) no earlier than (k - 9) × 0.1 s, so the last at 110 × 0.1 = 11.0 s.
    check_schedule(arrivals, started, [max(0, k - 9) * 0.1 for k in range(120)])


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
        started = time.monotonic()
        await run(LLMInference("llm", max_tokens=100), prompts, resources=manager)
        usage = manager.usage()["llm"]
        arrivals = sorted(r.arrived for r in server.stats.log)
    assert usage.input_tokens + usage.output_tokens == 21_000
    # calls 0 and 1 may go at once; call k waits until 2,000 + 2,000 t - 1,000 k >= 1,000,
    # i.e. t >= (k - 1) / 2: the last (k = 20) no earlier than 9.5 s.
    check_schedule(arrivals, started, [max(0, k - 1) / 2 for k in range(21)])


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
