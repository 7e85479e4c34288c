"""MultiChainComparison: m concurrent chains (seen by the server), then one comparison call."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from plait import MultiChainComparison
from plait.modules.best_of_n import AllAttemptsFailedError

from .scripted import bodies, last_user, scripted


def is_comparison(body: dict[str, Any]) -> bool:
    return "attempt_1:" in last_user(body)


def responder_with(fail_chain: int | None = None) -> Any:
    counter = itertools.count(1)

    def responder(body: dict[str, Any]) -> str:
        if is_comparison(body):
            return json.dumps({"reasoning": "Two of three say 4.", "answer": "4"})
        k = next(counter)
        if k == fail_chain:
            raise RuntimeError("chain broke")
        return json.dumps({"reasoning": f"thought {k}", "answer": str(3 + k % 2)})

    return responder


async def test_chains_overlap_then_one_comparison_sees_them_all() -> None:
    async with scripted(responder_with(), latency=0.2) as (server, manager):
        program = MultiChainComparison("question -> answer", m=3)
        prediction = await program.bind(manager)(question="2 + 2?")

    log = server.stats.log
    chains, comparison = log[:3], log[3]
    assert len(log) == 4 and not any(is_comparison(r.body) for r in chains)
    assert max(r.arrived for r in chains) < min(r.finished for r in chains)  # concurrent
    assert comparison.arrived >= max(r.finished for r in chains)  # after every chain
    asked = last_user(comparison.body)
    for k in (1, 2, 3):
        assert f"reasoning: thought {k}" in asked
    assert "answer: 4" in asked and "answer: 3" in asked

    assert prediction.answer == "4" and prediction.reasoning == "Two of three say 4."
    assert prediction.usage.input_tokens == sum(
        t.input_tokens for t in program.traces()
    )  # usage of all four calls
    rollouts = sorted(str(t.rollout_id) for t in program.traces())
    assert rollouts == ["None", "multi_chain:0", "multi_chain:1", "multi_chain:2"]


async def test_a_failed_chain_is_shown_as_failed_and_all_failing_raises() -> None:
    async with scripted(responder_with(fail_chain=2)) as (server, manager):
        program = MultiChainComparison("question -> answer", m=3).bind(manager)
        prediction = await program(question="2 + 2?")
    assert prediction.answer == "4"
    asked = last_user(bodies(server)[-1])
    assert asked.count("(this attempt failed: BackendError") == 1

    def broken(body: dict[str, Any]) -> str:
        raise RuntimeError("down")

    async with scripted(broken) as (_, manager):
        program = MultiChainComparison("question -> answer", m=2).bind(manager)
        with pytest.raises(AllAttemptsFailedError, match="all 2 chains failed"):
            await program(question="q")


def test_children_are_learnable_and_clashes_refused() -> None:
    program = MultiChainComparison("question -> answer", m=2)
    assert set(dict(program.named_parameters())) == {
        "chain.instructions",
        "chain.demos",
        "compare.instructions",
        "compare.demos",
    }
    assert list(program.compare.signature.input_fields) == ["question", "attempt_1", "attempt_2"]
    with pytest.raises(ValueError, match="already has attempt_1"):
        MultiChainComparison("question, attempt_1 -> answer")
    with pytest.raises(ValueError, match="m >= 1"):
        MultiChainComparison("q -> a", m=0)
