"""Hard budgets on learning runs (max_calls, max_tokens, max_cost), counted at the server.

Every request is held against the budget before it is sent, so however many
calls are in flight, the scripted server never sees more than the budget
allows; the run then stops cleanly with the best of what it evaluated in
full, says what it spent and left undone, and a rerun on its checkpoint with a
larger budget finishes the rest (tests/optimization/test_search_resume.py has
every search's).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

from plait import LLMInference, Parameter, Predict, ResourceConfig, ResourceManager
from plait.errors import UnknownAliasError
from plait.optimization import (
    BootstrapFewShot,
    GridSearch,
    RandomSearch,
    ReflectiveSearch,
    SFAOptimizer,
    Trainer,
)
from plait.optimization.evaluation import evaluate
from plait.signatures import PlainAdapter
from plait.testing import ScriptedServer

PARITY = "number -> parity: Literal['even', 'odd']"
BETTER = "Answer even when the last digit is 0, 2, 4, 6 or 8, else odd."


def parity(n: int) -> str:
    return "even" if n % 2 == 0 else "odd"


def examples(numbers: range | list[int]) -> list[tuple[str, str]]:
    return [(str(n), parity(n)) for n in numbers]


def respond(body: dict[str, Any]) -> str:
    """Right once the system prompt holds BETTER or a demo of each label, else "even"."""
    schema = json.dumps(body.get("response_format") or {})
    if "InstructionProposal" in schema:
        return json.dumps({"rationale": "clearer", "instruction": BETTER})
    if "ParameterUpdate" in schema:
        return json.dumps({"new_value": BETTER, "rationale": "feedback"})
    if "FeedbackSummary" in schema:
        return json.dumps({"summary": "Wrong on odd numbers.", "changes": ["Say odd."]})
    turns = [m["content"] for m in body["messages"] if m["role"] == "assistant"]
    number = int([m["content"] for m in body["messages"] if m["role"] == "user"][-1])
    knows = BETTER in body["messages"][0]["content"] or {"even", "odd"} <= set(turns)
    return parity(number) if knows else "even"


def program() -> Predict:
    return Predict(PARITY, adapter=PlainAdapter()).copy()


TRAIN = examples([2, 4, 6, 8, 10, 12, 3, 5])
VAL = examples(range(20, 30))


# ---------------------------------------------------------------- evaluate


async def test_evaluate_never_sends_more_than_max_calls_with_16_in_flight(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    result = await evaluate(
        program(), examples(range(60)), resources=config, max_concurrent=16, max_calls=37
    )
    assert server.stats.requests == 37
    assert server.stats.peak_concurrency > 1  # the budget held calls in flight, not in line
    assert result.stopped_by_budget and result.unevaluated == 23
    assert result.calls == 37


async def test_evaluate_without_a_budget_is_not_stopped(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    result = await evaluate(program(), VAL, resources=config)
    assert not result.stopped_by_budget and result.unevaluated == 0
    assert server.stats.requests == len(VAL)


async def test_max_cost_is_never_passed_with_prices_set(server: ScriptedServer) -> None:
    priced = ResourceConfig(
        {"*": server.endpoint(max_concurrent=16, price={"input": 1000.0, "output": 2000.0})}
    )
    async with ResourceManager(priced) as manager:
        result = await evaluate(
            program(), examples(range(100)), resources=manager, max_concurrent=16, max_cost=1.0
        )
        spent = manager.total_usage().cost
    # 100 calls cost about $1.50; one holds at most about $0.85 (its schema and 256 reply tokens)
    assert 1.0 - 0.85 <= spent <= 1.0
    assert result.stopped_by_budget and 0 < server.stats.requests < 100


async def test_a_search_whose_whole_cost_fits_its_max_cost_finishes_unstopped(
    server: ScriptedServer,
) -> None:
    # On main a RandomSearch whose full run cost $0.70 stopped at $0.62 under max_cost=1.00:
    # requests that did not fit beside the holds in flight were refused instead of waiting.
    # A request is refused only when its worst case cannot fit beside what was spent, so the
    # promise is for a budget with room for the whole cost and the largest worst case: here
    # the instruction proposal's (about 960 prompt tokens counted as bytes, 400 reply: $1.76).
    priced = ResourceConfig(
        {"*": server.endpoint(max_concurrent=16, price={"input": 1000.0, "output": 2000.0})}
    )

    def search(max_cost: float | None = None) -> RandomSearch:
        return RandomSearch(num_candidates=6, propose=2, max_concurrent=16, max_cost=max_cost)

    async with ResourceManager(priced) as manager:
        await search().compile(program(), trainset=TRAIN, valset=VAL, resources=manager)
        whole = manager.total_usage().cost
    requests = server.stats.requests
    async with ResourceManager(priced) as manager:
        report = await search(1.3 * whole + 1.8).compile(
            program(), trainset=TRAIN, valset=VAL, resources=manager
        )
    assert not report.stopped_by_budget
    assert server.stats.requests == 2 * requests
    assert report.spent["cost"] == pytest.approx(whole)


async def test_max_cost_on_an_endpoint_without_a_price_is_refused_with_the_reason(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    report = await GridSearch(parameters={"temperature": [0.0, 0.7]}, max_cost=1.0).compile(
        program(), valset=VAL, resources=config
    )
    assert server.stats.requests == 0
    assert report.stopped_by_budget and not report.improved
    assert "has no price; set 'price'" in report.left_undone


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"max_calls": -1}, "max_calls must be a number >= 0 or None, got -1"),
        ({"max_cost": "5"}, "max_cost must be a number >= 0 or None, got '5'"),
        ({"max_tokens": float("nan")}, "max_tokens must be a number >= 0 or None, got nan"),
    ],
)
def test_a_bad_budget_is_refused_when_the_search_is_made(
    limits: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        BootstrapFewShot(**limits)


# ------------------------------------------------------------------ searches


async def test_a_budgeted_grid_search_stops_and_resumes_without_repeating_an_evaluated_example(
    server: ScriptedServer, config: ResourceConfig, tmp_path: Any
) -> None:
    grid = {"instructions": [BETTER, "Say even or odd.", "Parity?", "Odd or even?"]}
    checkpoint = tmp_path / "grid.json"
    first = program()
    report = await GridSearch(
        parameters=grid, checkpoint=checkpoint, max_calls=37, max_concurrent=16
    ).compile(first, valset=VAL, resources=config)
    assert server.stats.requests <= 37
    assert report.stopped_by_budget and report.spent["calls"] == server.stats.requests
    finished = [t for t in report.trials if not t.unevaluated]
    assert report.best in finished and "not evaluated in full" in report.left_undone
    assert report.reason.startswith("stopped by the budget")
    sent_first = server.stats.requests
    server.reset_stats()

    again = program()
    resumed = await GridSearch(parameters=grid, checkpoint=checkpoint, max_calls=100).compile(
        again, valset=VAL, resources=config
    )
    assert not resumed.stopped_by_budget
    # only the examples left undone: the trials cut short keep those they evaluated
    assert server.stats.requests == len(VAL) * (1 + len(grid["instructions"])) - sent_first
    assert resumed.improved and again.instructions.value == BETTER


@pytest.mark.parametrize(
    "search",
    [
        BootstrapFewShot(max_calls=13, max_concurrent=16),
        RandomSearch(num_candidates=6, propose=2, max_calls=29, max_concurrent=16),
        ReflectiveSearch(max_calls=23, minibatch=4, proposals=2, max_concurrent=16),
    ],
    ids=lambda search: type(search).__name__,
)
async def test_every_search_stops_within_its_budget_with_the_best_it_finished(
    server: ScriptedServer, config: ResourceConfig, search: Any
) -> None:
    report = await search.compile(program(), trainset=TRAIN, valset=VAL, resources=config)
    assert server.stats.requests <= search.max_calls
    assert report.stopped_by_budget and report.spent["calls"] == server.stats.requests
    assert not report.best.unevaluated
    assert "call(s) refused" in report.left_undone


async def test_a_candidate_step_the_budget_cut_short_says_how_much_it_left(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    from plait.report.learning import LearningLog

    search = BootstrapFewShot(max_calls=13, max_concurrent=16)
    with LearningLog() as learning:
        report = await search.compile(program(), trainset=TRAIN, valset=VAL, resources=config)
    [cut] = [t for t in report.trials if t.unevaluated]
    told = {
        step["inputs"]["candidate"]: step["outputs"]
        for step in learning.steps
        if step["kind"] == "candidate"
    }
    assert told[cut.number]["unevaluated"] == cut.unevaluated > 0
    assert "unevaluated" not in told[0]  # trial 0 was evaluated whole


async def test_a_search_stopped_with_no_trial_cut_short_says_so_in_words(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    # ReflectiveSearch's max_calls stops its rounds; every trial it validated is whole
    report = await ReflectiveSearch(max_calls=23, minibatch=4, proposals=2).compile(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    assert report.stopped_by_budget and not any(t.unevaluated for t in report.trials)
    assert "0 trial(s)" not in report.left_undone
    assert report.left_undone.endswith(
        "no trial was left half-evaluated; the steps after the last one were not run"
    )


async def test_a_budgeted_evaluation_warns_once_and_calls_no_undone_example_failed(
    server: ScriptedServer, config: ResourceConfig, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="plait"):
        result = await evaluate(program(), examples(range(10)), resources=config, max_calls=4)
    assert result.unevaluated == 6
    assert [r.getMessage() for r in caplog.records] == [
        "evaluate: the budget left 6 of 10 examples undone (max_calls=4 are spent)"
    ]


async def test_a_budgeted_search_leaves_its_budget_to_its_report_not_a_warning_per_trial(
    server: ScriptedServer, config: ResourceConfig, caplog: pytest.LogCaptureFixture
) -> None:
    search = RandomSearch(num_candidates=6, propose=2, max_calls=29, max_concurrent=16)
    with caplog.at_level(logging.WARNING, logger="plait"):
        report = await search.compile(program(), trainset=TRAIN, valset=VAL, resources=config)
    assert report.stopped_by_budget and "call(s) refused" in report.left_undone
    told = [r.getMessage() for r in caplog.records]
    assert not [m for m in told if m.startswith("evaluate:")], told


# --------------------------------------------- the alias of a search's own calls


ONLY_THE_PROGRAM = "the resources do not serve (they serve: 'task')"


@pytest.mark.parametrize(
    ("make", "who"),
    [
        (lambda: RandomSearch(num_candidates=2, propose=1), "RandomSearch's instruction proposals"),
        (lambda: ReflectiveSearch(max_calls=40), "ReflectiveSearch's rewrites"),
    ],
    ids=["RandomSearch", "ReflectiveSearch"],
)
@pytest.mark.parametrize("method", ["compile", "estimate"])
async def test_a_search_whose_own_alias_is_not_served_is_refused_before_any_call(
    server: ScriptedServer, make: Any, who: str, method: str
) -> None:
    only_task = ResourceConfig({"task": server.endpoint(max_retries=0)})
    qa = Predict(PARITY, alias="task", adapter=PlainAdapter())
    with pytest.raises(UnknownAliasError) as raised:
        await getattr(make(), method)(qa, trainset=TRAIN, valset=VAL, resources=only_task)
    message = str(raised.value)
    assert message.startswith(f"{who} call the alias 'optimizer', which {ONLY_THE_PROGRAM}")
    assert "set " in message and "(alias=...) to one of those" in message
    assert server.stats.requests == 0  # before: trial 0 and the bootstrap were paid first


async def test_a_search_that_makes_no_call_of_its_own_needs_no_alias_for_it(
    server: ScriptedServer,
) -> None:
    only_task = ResourceConfig({"task": server.endpoint(max_retries=0)})
    qa = Predict(PARITY, alias="task", adapter=PlainAdapter())
    report = await RandomSearch(num_candidates=2, propose=0).compile(
        qa, trainset=TRAIN, valset=VAL, resources=only_task
    )
    assert len(report.trials) == 3


@pytest.mark.parametrize("method", ["fit", "estimate"])
async def test_a_trainer_whose_optimizer_alias_is_not_served_is_refused_before_any_call(
    server: ScriptedServer, method: str
) -> None:
    only_task = ResourceConfig({"task": server.endpoint(max_retries=0)})
    module = task()
    optimizer = SFAOptimizer(module.named_parameters())  # alias "optimizer"
    run = Trainer(
        module, lambda output, target: output == target, optimizer, resources=only_task,
        train_set=TRAIN[:4], val_set=VAL[:4], progress=False,
    )  # fmt: skip
    told = "SFAOptimizer's updates (the Trainer's optimizer) call the alias 'optimizer', which "
    with pytest.raises(UnknownAliasError, match=re.escape(told + ONLY_THE_PROGRAM)):
        await getattr(run, method)()
    assert server.stats.requests == 0


# ------------------------------------------------------------------- trainer


def task() -> LLMInference:
    return LLMInference("task", system_prompt=Parameter("Say even.", description="instructions"))


def trainer(manager: ResourceManager, module: LLMInference, **options: Any) -> Trainer:
    def exact(output: Any, target: Any) -> bool:
        return output == target

    optimizer = SFAOptimizer(module.named_parameters(), conservatism=0)
    return Trainer(
        module, exact, optimizer, resources=manager, train_set=TRAIN[:4],
        val_set=examples(range(20, 24)), metric=exact, batch_size=2, epochs=2,
        progress=False, shuffle=False, **options,
    )  # fmt: skip


async def test_a_budgeted_trainer_stops_at_a_step_and_resumes_with_a_larger_budget(
    server: ScriptedServer, config: ResourceConfig, tmp_path: Any
) -> None:
    async with ResourceManager(config) as manager:
        whole = task()
        await trainer(manager, whole).fit()
        needed = server.stats.requests
        server.reset_stats()

        module = task()
        first = await trainer(manager, module, max_calls=needed // 2, checkpoint_dir=tmp_path).fit()
        assert server.stats.requests <= needed // 2
        assert first.stopped_by_budget and "training stopped at" in first.left_undone
        assert first.spent["calls"] == server.stats.requests
        spent_first = server.stats.requests
        server.reset_stats()

        again = task()
        second = await trainer(manager, again, max_calls=needed, checkpoint_dir=tmp_path).fit()
    assert not second.stopped_by_budget and second.resumed_from is not None
    assert again.system_prompt.value == whole.system_prompt.value
    # only the step the budget cut short is run again
    assert spent_first + server.stats.requests < needed + needed // 2


# ------------------------------------------------------------ embedded model


@pytest.mark.slow
async def test_an_estimate_and_a_budgeted_search_on_the_embedded_model() -> None:
    from .test_search import local_program

    qa = local_program()
    items = [
        ("not True", "False"), ("True and False", "False"), ("True or False", "True"),
        ("not False", "True"), ("False or False", "False"), ("True and True", "True"),
    ]  # fmt: skip
    config = ResourceConfig({"*": {"provider": "local", "n_ctx": 2048}})
    async with ResourceManager(config) as manager:
        search = BootstrapFewShot(max_demos=2, max_calls=9)
        estimate = await search.estimate(
            qa, trainset=items, valset=items, resources=manager, sample=1
        )
        # one sampled example, and that example once more with demos; local is free
        assert estimate.sample_calls == 2 and estimate.cost is not None
        assert estimate.calls.expected == 9  # capped: 6 + 6 + 6 calls would pass the budget
        sent_before = sum(s.requests for s in manager.stats().values())
        report = await search.compile(qa, trainset=items, valset=items, resources=manager)
        sent = sum(s.requests for s in manager.stats().values()) - sent_before
    assert sent <= 9 and report.stopped_by_budget
    assert not report.improved and report.best is report.start  # the candidate was cut short


async def test_a_budget_refusal_in_an_optimizer_step_cancels_the_sibling_update_in_flight() -> None:
    # two parameters update concurrently: the demos' rewrite hangs at the server while the
    # instructions' rewrite is refused and asked again, which the budget refuses
    import asyncio

    release = asyncio.Event()  # set once the test has looked: the server may then finish

    async def responder(body: dict[str, Any]) -> str:
        schema = json.dumps(body.get("response_format") or {})
        if "FeedbackSummary" in schema:
            return json.dumps({"summary": "Wrong.", "changes": ["Say odd."]})
        if "ParameterUpdate" in schema:
            if "Part of the program: demos" in body["messages"][-1]["content"]:
                await release.wait()  # in flight when the step ends
            return json.dumps({"rationale": "empty", "new_value": ""})  # refused: asked again
        return "even"

    async with ScriptedServer(responder=responder) as server:
        config = ResourceConfig({"*": server.endpoint(max_retries=0, max_concurrent=16)})
        module = program()
        optimizer = SFAOptimizer(module.named_parameters(), conservatism=0)
        run = Trainer(
            module, lambda output, target: output.parity == target, optimizer,
            resources=config, train_set=examples([1, 3]), val_set=examples([5, 7]),
            batch_size=2, progress=False, max_calls=8,
        )  # fmt: skip
        try:
            report = await run.fit()
            left = [t for t in asyncio.all_tasks() if "_proposal" in repr(t.get_coro())]
        finally:
            release.set()
        assert report.stopped_by_budget and "call(s) refused" in report.left_undone
        assert left == []  # the demos' update was cancelled, not left running
        assert server.stats.requests == 8
