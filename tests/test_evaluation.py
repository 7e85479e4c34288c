"""`plait.evaluate`: the mean metric of a program over a dataset, run concurrently."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import plait
from plait import LLMInference, ResourceConfig, ResourceManager
from plait.evaluation import exact_match, examples_of, score_of
from plait.feedback import Feedback
from plait.testing import ScriptedServer


def answer(body: dict[str, Any]) -> str:
    """Answers the part of the input after ':'; refuses inputs containing 'boom'."""
    text = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    if "boom" in text:
        raise RuntimeError("cannot answer")
    return text.rsplit(":", 1)[1]


@pytest.fixture
async def manager() -> AsyncIterator[ResourceManager]:
    async with ScriptedServer(responder=answer) as server:
        config = ResourceConfig({"*": server.endpoint(max_retries=0)})
        async with ResourceManager(config) as running:
            yield running


async def test_evaluate_returns_the_mean_score(manager: ResourceManager) -> None:
    task = LLMInference("task")
    data = [("a:yes", "yes"), ("b:no", "yes"), {"input": "c:YES ", "target": "yes"}, ("d:no", "no")]
    assert await plait.evaluate(task, data, resources=manager) == 0.75


async def test_a_failed_example_scores_zero_and_training_mode_is_restored(
    manager: ResourceManager,
) -> None:
    task = LLMInference("task").train()
    data = [("a:yes", "yes"), ("boom:yes", "yes")]
    assert await plait.evaluate(task, data, exact_match, resources=manager) == 0.5
    assert task.training


def test_metrics_and_examples_are_checked() -> None:
    assert score_of(lambda o, t: Feedback("ok", score=0.25), "x", "y") == 0.25
    assert score_of(lambda o, t: 1, "x", "y") == 1.0
    with pytest.raises(TypeError, match="returned str"):
        score_of(lambda o, t: "fine", "x", "y")
    with pytest.raises(ValueError, match="example 1"):
        examples_of([("a", "b"), {"question": "a"}])


async def test_an_empty_dataset_is_an_error(manager: ResourceManager) -> None:
    with pytest.raises(ValueError, match="empty dataset"):
        await plait.evaluate(LLMInference("task"), [], resources=manager)
