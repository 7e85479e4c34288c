"""Refine: the next attempt is told what the previous one said and why it fell short."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from plait import History, LLMInference, Module, Predict, Refine, Requirement
from plait.modules.best_of_n import AllAttemptsFailedError

from .scripted import all_text, bodies, last_user, scripted


def replies(*answers: str) -> Any:
    """A responder answering ``{"answer": <next answer>}`` to each request in turn."""
    queue = iter(answers)
    return lambda body: json.dumps({"answer": next(queue)})


def long_enough(inputs: dict[str, Any], prediction: Any) -> tuple[float, str]:
    return float(len(prediction.answer) >= 10), "The answer needs at least 10 characters."


async def test_second_request_carries_the_first_attempts_output_and_feedback() -> None:
    async with scripted(replies("short", "long enough now")) as (server, manager):
        refine = Refine(Predict("question -> answer"), max_iters=3, reward_fn=long_enough)
        prediction = await refine.bind(manager)(question="Explain tides.")

    first, second = bodies(server)
    assert prediction.answer == "long enough now"
    messages = second["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "user"]
    assert messages[1]["content"] == "question: Explain tides."
    assert json.loads(messages[2]["content"]) == {"answer": "short"}  # the previous attempt
    feedback = messages[3]["content"]
    assert "It scored 0, below the 1 required." in feedback
    assert "Why: The answer needs at least 10 characters." in feedback
    assert last_user(second) == "question: Explain tides."
    assert "short" not in all_text(first)
    rollouts = [t.rollout_id for t in refine.traces()]
    assert rollouts == ["refine:0", "refine:1"]


async def test_requirements_feedback_names_the_failed_requirement() -> None:
    no_digits = Requirement(
        "Write numbers in words",
        lambda pred: not any(c.isdigit() for c in pred.answer) or "it contains digits",
    )
    async with scripted(replies("4 legs", "four legs")) as (server, manager):
        refine = Refine(Predict("question -> answer"), requirements=[no_digits])
        prediction = await refine.bind(manager)(question="Legs of a dog?")

    assert prediction.answer == "four legs"
    feedback = bodies(server)[1]["messages"][3]["content"]
    assert "- Write numbers in words (why: it contains digits)" in feedback


async def test_a_feedback_parameter_receives_the_text() -> None:
    class Tweet(Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = LLMInference(alias="llm")

        async def forward(self, topic: str, feedback: str | None = None) -> str:
            prompt = f"Tweet about {topic}." + (f"\n\n{feedback}" if feedback else "")
            return await self.llm(prompt)

    counter = itertools.count()
    responder = lambda body: "x" * (5 if next(counter) == 0 else 50)  # noqa: E731
    async with scripted(responder) as (server, manager):
        refine = Refine(
            Tweet(), reward_fn=lambda inputs, out: float(len(out) > 20 and inputs["topic"] == "sea")
        )
        result = await refine.bind(manager)(topic="sea")

    assert result == "x" * 50
    second = last_user(bodies(server)[1])
    assert second.startswith("Tweet about sea.\n\nYour previous output:\nxxxxx\n\nThat answer fell")


async def test_returns_the_best_attempt_when_none_passes() -> None:
    async with scripted(replies("a", "abcd", "ab")) as (server, manager):
        refine = Refine(
            Predict("question -> answer"),
            max_iters=3,
            reward_fn=lambda inputs, pred: len(pred.answer) / 10,
            threshold=0.9,
        )
        prediction = await refine.bind(manager)(question="q")
    assert server.stats.requests == 3
    assert prediction.answer == "abcd"
    third = bodies(server)[2]["messages"]
    assert json.loads(third[2]["content"]) == {"answer": "abcd"}  # only the previous attempt
    assert "It scored 0.4, below the 0.9 required." in third[3]["content"]


async def test_a_failed_attempt_is_skipped_and_all_failing_raises() -> None:
    counter = itertools.count()

    def flaky(body: dict[str, Any]) -> str:
        if next(counter) == 0:
            raise RuntimeError("overloaded")
        return '{"answer": "fine answer"}'

    async with scripted(flaky) as (server, manager):
        refine = Refine(Predict("question -> answer"), reward_fn=long_enough)
        prediction = await refine.bind(manager)(question="q")
    assert prediction.answer == "fine answer" and server.stats.requests == 2
    assert len(bodies(server)[1]["messages"]) == 2  # no feedback after a failure

    def broken(body: dict[str, Any]) -> str:
        raise RuntimeError("down")

    async with scripted(broken) as (_, manager):
        refine = Refine(Predict("question -> answer"), max_iters=2, reward_fn=long_enough)
        with pytest.raises(AllAttemptsFailedError, match="all 2 attempts failed"):
            await refine.bind(manager)(question="q")


async def test_the_callers_history_gets_only_the_chosen_attempt() -> None:
    history = History("Be helpful.")
    async with scripted(replies("short", "long enough now")) as (server, manager):
        refine = Refine(Predict("question -> answer"), reward_fn=long_enough)
        await refine.bind(manager)(question="Explain tides.", history=history)
    assert [m.role for m in history.turns] == ["user", "assistant"]
    assert json.loads(history.turns[1].content) == {"answer": "long enough now"}
    assert bodies(server)[0]["messages"][0]["content"].startswith("Be helpful.")


def test_setup_errors_are_clear() -> None:
    class Plain(Module):
        async def forward(self, text: str) -> str:
            return text

    with pytest.raises(TypeError, match=r"must accept `feedback=` .* or `history=`"):
        Refine(Plain(), reward_fn=long_enough)
    with pytest.raises(ValueError, match=r"may use \{previous_output\}, \{feedback\}"):
        Refine(Predict("q -> a"), refinement_prompt="Improve {answer}")
    with pytest.raises(TypeError, match="module= or base_module="):
        Refine(Predict("q -> a"), base_module=Predict("q -> a"))
    with pytest.raises(ValueError, match="max_iters >= 1"):
        Refine(Predict("q -> a"), max_iters=0, reward_fn=long_enough)
