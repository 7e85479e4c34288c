"""Usage per call and per alias, as the server reported it, and budgets that stop a run."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from plait import LLMInference, Module, ResourceManager, run
from plait.errors import BudgetExceededError
from plait.report.profiling import profile
from plait.testing import ScriptedServer

from .support import endpoint, system_of

PRICE = {"input": 1000.0, "output": 0.0}  # $1 per 1,000 input tokens


class Pipeline(Module):
    """Two aliases: ``fast`` drafts, ``smart`` reviews the draft."""

    def __init__(self) -> None:
        super().__init__()
        self.draft = LLMInference("fast", system_prompt="draft", temperature=0.0)
        self.review = LLMInference("smart", system_prompt="review", temperature=0.0)

    def forward(self, text: str) -> str:
        return self.review(self.draft(text))


async def test_tokens_per_call_reach_value_meta_and_totals_match_the_server() -> None:
    reported: dict[str, list[tuple[int, int]]] = defaultdict(list)

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        user = body["messages"][-1]["content"]
        usage = (len(user), len(user) % 7 + 1)  # distinct, easy-to-tell counts per call
        reported[body["messages"][0]["content"]].append(usage)
        return {
            "content": f"{body['messages'][0]['content']}: {user}",
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]},
        }

    items = ["a" * n for n in range(1, 9)]
    async with (
        ScriptedServer(responder=responder) as server,
        ResourceManager(
            {"fast": endpoint(server), "smart": endpoint(server, model="gpt-4o")}
        ) as manager,
    ):
        with profile() as prof:
            await run(Pipeline(), items, resources=manager)
        totals = manager.usage()
        log = server.stats.log
    assert len(log) == 16 and {system_of(r) for r in log} == {"draft", "review"}

    per_node = defaultdict(list)
    for record in prof.records:
        per_node[record.module_path].append((record.input_tokens, record.output_tokens))
    assert sorted(per_node["draft"]) == sorted(reported["draft"])
    assert sorted(per_node["review"]) == sorted(reported["review"])
    for alias, node in (("fast", "draft"), ("smart", "review")):
        assert totals[alias].input_tokens == sum(i for i, _ in reported[node])
        assert totals[alias].output_tokens == sum(o for _, o in reported[node])
    # cost per call from the built-in prices of each alias's model
    fast_cost = sum(r.cost for r in prof.records if r.module_path == "draft")
    assert totals["fast"].cost == pytest.approx(fast_cost)
    assert totals["fast"].cost == pytest.approx(
        (totals["fast"].input_tokens * 0.15 + totals["fast"].output_tokens * 0.60) / 1e6
    )
    assert totals["smart"].cost == pytest.approx(
        (totals["smart"].input_tokens * 2.5 + totals["smart"].output_tokens * 10.0) / 1e6
    )
    assert manager.total_usage().cost == pytest.approx(totals["fast"].cost + totals["smart"].cost)


def thousand_tokens(body: dict[str, Any]) -> dict[str, Any]:
    return {"content": "ok", "usage": {"prompt_tokens": 1000, "completion_tokens": 0}}


async def test_a_tiny_budget_stops_the_run_cleanly_and_sends_nothing_after() -> None:
    items = [f"item {i}" for i in range(10)]
    async with (
        ScriptedServer(responder=thousand_tokens) as server,
        ResourceManager(
            {"llm": endpoint(server, price=PRICE, budget=2.5, max_concurrent=1)}
        ) as manager,
    ):
        with pytest.raises(
            BudgetExceededError, match=r"the budget of \$2\.5000 for endpoint 'llm'"
        ):
            await run(LLMInference("llm"), items, resources=manager)
        stats = manager.stats()["llm"]
        # the three calls that spent $3 went; nothing is queued or in flight to go later
        assert server.stats.requests == 3
        assert (stats.in_flight, stats.queue_depth) == (0, 0)
        assert manager.total_usage().cost == pytest.approx(3.0)

        results = await run(LLMInference("llm"), items, resources=manager, on_error="collect")
        assert server.stats.requests == 3
    assert all(isinstance(r, BudgetExceededError) for r in results)
    assert "Raise 'budget' in the configuration" in str(results[0])
