"""ReflectiveSearch against the scripted server: reflection from backward's feedback, the
Pareto frontier, merges, and the call budget."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from plait import Predict, ResourceConfig
from plait.optimization import ReflectiveSearch, Trial
from plait.optimization.search.reflective import _Member
from plait.signatures import PlainAdapter
from plait.testing import ScriptedServer

from .test_search import BETTER, PARITY, TRAIN, VAL, demo_turns, examples, parity, question, system


def schema_name(body: dict[str, Any]) -> str | None:
    return ((body.get("response_format") or {}).get("json_schema") or {}).get("name")


def respond(body: dict[str, Any]) -> str:
    """Right only under BETTER; a rewrite call always proposes BETTER."""
    if schema_name(body) == "ParameterUpdate":
        return json.dumps({"rationale": "name the rule", "new_value": BETTER})
    if system(body) == BETTER:
        return parity(int(question(body)))
    return "even"


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(responder=respond) as running:
        yield running


@pytest.fixture
def config(server: ScriptedServer) -> ResourceConfig:
    return ResourceConfig({"*": server.endpoint(max_retries=0, max_concurrent=8)})


def program() -> Predict:
    return Predict(PARITY, adapter=PlainAdapter())


async def test_reflection_on_backward_feedback_rewrites_the_instructions(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    qa = program()
    search = ReflectiveSearch(max_calls=60, minibatch=4, proposals=2, merge_every=0, seed=0)
    report = await search.compile(qa, TRAIN, VAL, resources=config)

    assert qa.instructions.value == BETTER and report.best.score == 1.0
    assert report.start.score == 0.5 and report.improved
    assert any("instructions: minibatch" in line and "accepted" in line for line in search.log)
    # The rewrite was asked with the feedback plait's backward put on the parameter:
    # the call, what it produced and the verifier's verdict with the expected label.
    (rewrite, *_) = [r.body for r in server.stats.log if schema_name(r.body) == "ParameterUpdate"]
    shown = rewrite["messages"][-1]["content"]
    assert "It produced:" in shown and "Expected: 'odd'" in shown
    # The budget: the search stopped starting rounds once 60 calls were spent.
    assert 60 <= report.calls <= 60 + 2 * (4 + 4 + 3 + len(VAL))
    assert qa.state.optimizer == "ReflectiveSearch" and qa.is_compiled()


async def test_a_demo_mutation_uses_good_runs_and_keeps_labels_balanced(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    def knows_with_demos(body: dict[str, Any]) -> str:
        turns = demo_turns(body)
        if "even" in turns and "odd" in turns:
            return parity(int(question(body)))
        return "even"

    server.responder = knows_with_demos
    qa = program()
    qa.instructions.requires_grad = False  # only the demos can change
    search = ReflectiveSearch(max_calls=40, minibatch=4, proposals=1, merge_every=0, seed=3)
    report = await search.compile(qa, TRAIN, VAL, resources=config)
    assert report.best.score == 1.0
    labels = sorted(d["parity"] for d in qa.demos.value)
    assert "even" in labels and "odd" in labels


def member(scores: list[float], number: int, parent: int | None = None) -> _Member:
    trial = Trial(number, {}, sum(scores) / len(scores), 0.0, scores=scores)
    return _Member(program(), trial, parent=parent)


def test_the_frontier_keeps_leaders_of_any_example_and_drops_dominated_ones() -> None:
    pool = [
        member([0, 0, 1, 0], 0),
        member([1, 1, 0, 0], 1, parent=0),  # best on examples 0 and 1
        member([0, 0, 1, 1], 2, parent=0),  # best on 2 and 3; dominates the start
        member([1, 0, 0, 0], 3, parent=1),  # dominated by member 1
    ]
    assert ReflectiveSearch.frontier(pool) == {1: 2, 2: 2}


async def test_a_merge_takes_each_parameter_from_the_child_that_changed_it(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    def needs_both(body: dict[str, Any]) -> str:
        if system(body) == BETTER and demo_turns(body):
            return parity(int(question(body)))
        return "even"

    server.responder = needs_both
    start, better, shown = program(), program(), program()
    better.instructions.value = BETTER
    shown.demos.value = [{"number": "7", "parity": "odd"}]
    val = examples([1, 2, 3, 4])
    search = ReflectiveSearch()
    pool = [
        _Member(start, await search._evaluate_one(0, _candidate(start), val, config)),
        _Member(better, await search._evaluate_one(1, _candidate(better), val, config), parent=0),
        _Member(shown, await search._evaluate_one(2, _candidate(shown), val, config), parent=0),
    ]
    # Neither child is better than the start alone, so give each a lead to keep them.
    pool[1].trial.scores, pool[2].trial.scores = [1.0, 0, 0, 0], [0, 1.0, 0, 0]
    pool[0].trial.scores = [0, 0, 0, 0]
    import random

    child = search._merge(pool, random.Random(0))
    assert child is not None
    merged = await search._validate(child, val, config)
    assert merged is not None and merged.trial.score == 1.0
    assert merged.program.instructions.value == BETTER
    assert merged.program.demos.value == [{"number": "7", "parity": "odd"}]
    assert merged.trial.note == "merge of trials 1 and 2"


def _candidate(qa: Predict) -> Any:
    from plait.optimization.search import Candidate

    return Candidate(qa, {})


@pytest.mark.slow
async def test_reflective_search_on_the_embedded_model_keeps_its_budget() -> None:
    from .test_search import LOCAL, bbh_booleans, local_program

    train, val = bbh_booleans()
    qa = local_program()
    search = ReflectiveSearch(max_calls=40, minibatch=3, proposals=1, merge_every=2, seed=0)
    report = await search.compile(qa, train, val, resources=ResourceConfig(LOCAL))
    assert report.best.score >= report.start.score
    assert qa.is_compiled() == (report.best is not report.start) and report.reason
    assert report.calls <= 40  # max_calls is a hard budget: never passed, even mid-round
    assert search.log  # every proposal says what became of it
