"""No call outlives the search that started it: concurrent steps end with it.

When one of a search's concurrent steps raises (a failed endpoint, a metric's
error), the others are cancelled and awaited before the search raises, so no
request is sent after it ended and none runs unseen by its caller. Each test
holds one step's request at the server while another fails, then looks for
steps of the search still running once it has raised.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from plait import Predict, ResourceConfig
from plait._together import together
from plait.errors import BackendError
from plait.optimization import GridSearch, RandomSearch, ReflectiveSearch
from plait.optimization.evaluation import evaluate
from plait.signatures import PlainAdapter
from plait.testing import ScriptedServer

PARITY = "number -> parity: Literal['even', 'odd']"
BETTER = "Answer even when the last digit is 0, 2, 4, 6 or 8, else odd."


def examples(numbers: list[int]) -> list[tuple[str, str]]:
    return [(str(n), "even" if n % 2 == 0 else "odd") for n in numbers]


def program() -> Predict:
    return Predict(PARITY, adapter=PlainAdapter()).copy()


def running(*names: str) -> list[asyncio.Task[Any]]:
    """The tasks still running whose coroutine is one of ``names`` (a search's steps,
    by qualified name)."""
    return [
        task
        for task in asyncio.all_tasks()
        if not task.done() and any(f" {name} " in repr(task.get_coro()) for name in names)
    ]


async def left_running(
    responder: Callable[[dict[str, Any]], Awaitable[str]],
    release: asyncio.Event,
    search: Callable[[ResourceConfig], Awaitable[Any]],
    step: str,
) -> tuple[BaseException, list[asyncio.Task[Any]], int, int]:
    """Runs ``search`` until it raises; returns its error, its ``step`` tasks still running
    then, and the requests the server had seen then and once the held request was let go."""
    async with ScriptedServer(responder=responder) as server:
        config = ResourceConfig({"*": server.endpoint(max_retries=0, max_concurrent=16)})
        try:
            with pytest.raises(Exception) as raised:
                await search(config)
            left = running(step)
            seen = server.stats.requests
        finally:
            release.set()
        for task in left:  # with the defect: they go on, and send more
            await asyncio.gather(task, return_exceptions=True)
        return raised.value, left, seen, server.stats.requests


async def test_random_search_proposal_failing_cancels_the_other_proposals() -> None:
    # two instruction proposals at once: the first is held at the server, then its reply
    # is refused and asked again; the second fails (500), which ends the search
    release = asyncio.Event()
    proposals = 0

    async def responder(body: dict[str, Any]) -> str:
        nonlocal proposals
        if "InstructionProposal" in json.dumps(body.get("response_format") or {}):
            proposals += 1
            if proposals == 1:
                await release.wait()
                return json.dumps({"rationale": "", "instruction": ""})  # refused: re-asked
            raise RuntimeError("the proposal's endpoint failed")
        return "even"

    async def search(config: ResourceConfig) -> Any:
        return await RandomSearch(
            num_candidates=2, propose=2, max_demos=0, alias="*", seed=1
        ).compile(program(), trainset=examples([1, 2]), valset=examples([3, 4]), resources=config)

    error, left, seen, after = await left_running(
        responder, release, search, "ProgramSearch._remembered"
    )

    assert isinstance(error, BackendError)
    assert left == []
    assert after == seen  # nothing was asked after the search raised


async def test_grid_search_candidate_failing_cancels_the_other_candidates() -> None:
    # two candidates evaluated at once: one's call is held at the server, the other's
    # metric raises
    release = asyncio.Event()

    async def responder(body: dict[str, Any]) -> str:
        system = body["messages"][0]["content"]
        if "HOLD" in system:
            await release.wait()
            return "even"
        return "odd" if "BOOM" in system else "even"

    def metric(output: Any, target: Any) -> float:
        if output.parity == "odd":
            raise ValueError("the metric failed")
        return float(output.parity == target)

    async def search(config: ResourceConfig) -> Any:
        grid = GridSearch(metric, parameters={"instructions": ["HOLD", "BOOM"]})
        return await grid.compile(program(), valset=examples([2]), resources=config)

    error, left, seen, after = await left_running(
        responder, release, search, "ProgramSearch._evaluated"
    )

    assert isinstance(error, ValueError) and "the metric failed" in str(error)
    assert left == []
    assert after == seen


async def test_reflective_search_validation_failing_cancels_the_next_rounds_proposals() -> None:
    # round 1's children are validated while round 2's proposals run: their minibatch
    # call is held at the server, and the children's validation makes the metric raise
    release = asyncio.Event()
    plain = 0

    async def responder(body: dict[str, Any]) -> str:
        nonlocal plain
        schema = json.dumps(body.get("response_format") or {})
        if "FeedbackSummary" in schema:
            return json.dumps({"summary": "Wrong on odd numbers.", "changes": ["Say odd."]})
        if "ParameterUpdate" in schema:
            return json.dumps({"rationale": "feedback", "new_value": BETTER})
        if BETTER in body["messages"][0]["content"]:
            return "odd"
        plain += len(body["messages"]) == 2 and body["messages"][-1]["content"] == "5"
        if plain > 2:  # round 2's proposals on the program as it was (round 1 sent two)
            await release.wait()
        return "even"

    def metric(output: Any, target: Any) -> float:
        if target == "odd!" and output.parity == "odd":
            raise ValueError("the metric failed")
        return float(output.parity == target)

    async def search(config: ResourceConfig) -> Any:
        reflective = ReflectiveSearch(
            metric, proposals=2, minibatch=1, max_calls=40, conservatism=0, alias="*"
        )
        return await reflective.compile(
            program(), trainset=examples([5]), valset=[("9", "odd!")], resources=config
        )

    error, left, seen, after = await left_running(
        responder, release, search, "ReflectiveSearch._proposal"
    )

    assert isinstance(error, ValueError) and "the metric failed" in str(error)
    assert left == []
    assert after == seen


async def test_an_llm_judge_failing_cancels_the_other_judgements() -> None:
    # evaluate judges every example at once: one judgement waits (as on its judge's reply),
    # another raises
    ended: list[str] = []

    async def judge(output: Any, target: Any) -> float:
        if target == "odd":
            raise ValueError("the judge failed")
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(target)
        return 1.0

    async with ScriptedServer(responder=lambda body: "even") as server:
        config = ResourceConfig({"*": server.endpoint(max_retries=0)})
        with pytest.raises(ValueError, match="the judge failed"):
            await evaluate(program(), examples([2, 3]), judge, resources=config)

    assert ended == ["even"]  # cancelled and awaited before evaluate raised


async def test_together_cancels_the_others_once_one_raises_and_waits_for_them() -> None:
    ended: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("slow")

    async def failing() -> None:
        await asyncio.sleep(0)
        raise KeyError("first")

    with pytest.raises(KeyError):
        await together(slow(), failing())
    assert ended == ["slow"]  # cancelled and awaited before the error was raised


async def test_together_cancelled_cancels_each_step_once_so_its_clean_up_ends() -> None:
    # the caller's cancel reaches both steps; one ends at once, the other cleans up over
    # a few turns of the loop; a second cancel would cut that clean-up short
    cleaned: list[int] = []
    started = asyncio.Event()

    async def quick() -> None:
        started.set()
        await asyncio.Event().wait()

    async def careful() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            for turn in range(5):
                await asyncio.sleep(0)
                cleaned.append(turn)
            raise

    task = asyncio.ensure_future(together(careful(), quick()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [0, 1, 2, 3, 4]
