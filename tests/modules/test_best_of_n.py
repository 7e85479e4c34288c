"""BestOfN: concurrent attempts (seen by the server), distinct rollouts, the best reward wins."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

from plait import BestOfN, LLMInference, Module
from plait._context import ROLLOUT
from plait.modules.best_of_n import AllAttemptsFailedError

from .scripted import last_user, scripted


def counting_responder() -> Any:
    """Answers ``answer-1``, ``answer-2`` … in arrival order."""
    counter = itertools.count(1)
    return lambda body: f"answer-{next(counter)}"


def number_of(text: str) -> float:
    return float(text.rsplit("-", 1)[1])


class Tagged(Module):
    """Asks the model with its rollout id in the prompt, so the server can tell attempts apart."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference(alias="llm")

    async def forward(self, question: str) -> dict[str, str]:
        rollout = ROLLOUT.get() or ""
        text = await self.llm(f"[{rollout}] {question}")
        return {"rollout": rollout, "text": text}


async def test_attempts_overlap_on_the_server_and_the_best_reward_wins() -> None:
    async with scripted(counting_responder(), latency=0.2) as (server, manager):
        best = BestOfN(LLMInference(alias="llm"), n=3, reward_fn=lambda i, out: number_of(out))
        result = await best.bind(manager)("What is 2 + 2?")

    log = server.stats.log
    assert len(log) == 3 and server.stats.peak_concurrency == 3
    assert max(r.arrived for r in log) < min(r.finished for r in log)  # all in flight at once
    assert result == "answer-3"


async def test_reward_sees_named_inputs_and_can_be_async() -> None:
    seen: list[dict[str, Any]] = []

    async def reward(inputs: dict[str, Any], output: dict[str, str]) -> float:
        seen.append(inputs)
        return float(output["rollout"].endswith(":1"))

    async with scripted() as (_, manager):
        result = await BestOfN(Tagged(), n=3, reward_fn=reward).bind(manager)(question="q?")
    assert result["rollout"] == "best_of_n:1"
    assert seen == [{"question": "q?"}] * 3


async def test_distinct_rollouts_are_cached_apart_and_reused_on_rerun(tmp_path: Path) -> None:
    cache = str(tmp_path / "responses.sqlite")
    best = BestOfN(LLMInference(alias="llm"), n=3, reward_fn=lambda i, out: number_of(out))
    async with scripted(counting_responder(), cache=cache) as (server, manager):
        first = await best.bind(manager)("same question")
        assert server.stats.requests == 3  # identical requests, yet three samples

    async with scripted(counting_responder(), cache=cache) as (server, manager):
        again = await best.bind(manager)("same question")
        assert server.stats.requests == 0  # every attempt answered by its own cache entry
    assert again == first == "answer-3"


async def test_threshold_picks_the_first_attempt_in_order_and_cancels_later_ones() -> None:
    release = asyncio.Event()

    async def responder(body: dict[str, Any]) -> str:
        if "best_of_n:0" not in last_user(body):
            await release.wait()  # later attempts hang until the test ends
        return "fine"

    async with scripted(responder) as (server, manager):
        best = BestOfN(Tagged(), n=3, reward_fn=lambda i, out: 1.0, threshold=0.5)
        result = await best.bind(manager)(question="q")
        statuses = {last_user(r.body).split("]")[0]: r.status for r in server.stats.log}
        release.set()

    assert result == {"rollout": "best_of_n:0", "text": "fine"}
    assert statuses == {"[best_of_n:0": 200, "[best_of_n:1": None, "[best_of_n:2": None}


async def test_below_threshold_falls_back_to_the_best() -> None:
    async with scripted(counting_responder()) as (_, manager):
        best = BestOfN(
            LLMInference(alias="llm"), n=3, reward_fn=lambda i, o: number_of(o), threshold=10
        )
        assert await best.bind(manager)("q") == "answer-3"


async def test_failed_attempts_are_skipped() -> None:
    def responder(body: dict[str, Any]) -> str:
        if "best_of_n:1" in last_user(body):
            raise RuntimeError("model is down")
        return "ok-" + last_user(body)[-3:]

    async with scripted(responder) as (server, manager):
        best = BestOfN(Tagged(), n=3, reward_fn=lambda i, out: float(out["rollout"][-1]))
        result = await best.bind(manager)(question="why")

    assert server.stats.requests == 3
    assert result["rollout"] == "best_of_n:2"


async def test_all_attempts_failing_names_every_error() -> None:
    def reward(inputs: dict[str, Any], output: str) -> float:
        raise ValueError(f"cannot score {output}")

    async with scripted() as (_, manager):
        best = BestOfN(LLMInference(alias="llm"), n=2, reward_fn=reward).bind(manager)
        with pytest.raises(AllAttemptsFailedError, match="all 2 attempts failed") as info:
            await best("x")

    cause = info.value
    assert isinstance(cause, AllAttemptsFailedError) and len(cause.errors) == 2
    assert "attempt 0: ValueError: cannot score echo: x" in str(cause)
    assert "attempt 1: ValueError: cannot score echo: x" in str(cause)


def test_bad_arguments_are_refused() -> None:
    llm = LLMInference(alias="llm")
    with pytest.raises(ValueError, match="n >= 1"):
        BestOfN(llm, n=0, reward_fn=lambda i, o: 0.0)
    with pytest.raises(TypeError, match="wraps a Module"):
        BestOfN("llm", n=2, reward_fn=lambda i, o: 0.0)  # type: ignore[arg-type]
    assert repr(BestOfN(llm, n=2, reward_fn=len, threshold=0.9)).startswith(
        "BestOfN(n=2, threshold=0.9"
    )
