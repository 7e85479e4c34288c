"""Requirements and ValidateAndRepair: validators, an LLM judge, repairs listing the failures."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from plait import Predict, Requirement, ValidateAndRepair
from plait.modules.requirements import (
    Requirements,
    RequirementsNotMetError,
    RequirementsReport,
    Validated,
)

from .scripted import bodies, last_user, scripted

JUDGE = "Decide whether the output meets the requirement"


def is_judge(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"].startswith(JUDGE)


def judge_reply(body: dict[str, Any]) -> str:
    """The judge fails any output that mentions 'rude'."""
    output = last_user(body).split("output: ", 1)[1]
    if "rude" in output:
        return json.dumps({"reason": "The output is rude.", "passed": False})
    return json.dumps({"reason": "It is fine.", "passed": True})


async def test_validators_decide_without_any_call() -> None:
    async def has_answer(out: dict[str, str]) -> bool:
        return bool(out.get("answer"))

    def explode(out: Any) -> bool:
        raise KeyError("score")

    checks = Requirements(
        [
            Requirement("Has an answer", has_answer),
            Requirement("Short", lambda out: len(out["answer"]) < 5 or "it is 11 characters long"),
            Requirement("Silent", lambda out: False),
            Requirement("Scored", explode),
            Requirement("Anything", lambda out: None),
        ]
    )
    async with scripted() as (server, manager):
        report = await checks.bind(manager)({"answer": "hello world"})

    assert server.stats.requests == 0
    assert isinstance(report, RequirementsReport)
    assert [r.passed for r in report.results] == [True, False, False, False, True]
    assert [r.reason for r in report.failures] == [
        "it is 11 characters long",
        "",
        "the validator raised KeyError: 'score'",
    ]
    assert report.score == 0.4 and not report.passed
    assert report.feedback() == (
        "The output does not meet these requirements:\n"
        "- Short (why: it is 11 characters long)\n"
        "- Silent\n"
        "- Scored (why: the validator raised KeyError: 'score')"
    )
    assert str(report).splitlines()[1] == "[FAIL] Short: it is 11 characters long"


async def test_the_llm_judge_runs_concurrently_with_a_schema() -> None:
    async with scripted(judge_reply, latency=0.2) as (server, manager):
        checks = Requirements(["Polite", "Complete", "On topic"])
        report = await checks.bind(manager)("a rude reply", {"question": "hi?"})

    log = server.stats.log
    assert len(log) == 3 and server.stats.peak_concurrency == 3
    assert max(r.arrived for r in log) < min(r.finished for r in log)
    body = log[0].body
    schema = body["response_format"]["json_schema"]["schema"]
    assert set(schema["properties"]) == {"reason", "passed"}
    assert schema["properties"]["passed"]["type"] == "boolean"
    asked = sorted(last_user(r.body).splitlines()[0] for r in log)
    assert asked == ["requirement: Complete", "requirement: On topic", "requirement: Polite"]
    assert 'task_inputs: {"question":"hi?"}' in last_user(body)
    assert [(r.passed, r.reason, r.judged) for r in report.results] == [
        (False, "The output is rude.", True)
    ] * 3
    assert [t.module_type for t in checks.traces()] == ["Predict"] * 3


async def test_repair_lists_the_failures_and_stops_when_all_pass() -> None:
    answers = iter(["You are rude, it is 4.", "Happy to help: 4."])

    def responder(body: dict[str, Any]) -> str:
        if is_judge(body):
            return judge_reply(body)
        return json.dumps({"answer": next(answers)})

    requirements = [
        Requirement("Polite"),
        Requirement("Mentions a number", lambda p: any(c.isdigit() for c in p.answer)),
    ]
    async with scripted(responder) as (server, manager):
        program = ValidateAndRepair(Predict("question -> answer"), requirements, max_repairs=2)
        result = await program.bind(manager)(question="2 + 2?")

    assert isinstance(result, Validated)
    assert result.passed and result.repairs == 1
    assert result.output.answer == "Happy to help: 4."
    assert [report.passed for report in result.history] == [False, True]
    repair = [b for b in bodies(server) if not is_judge(b)][1]
    feedback = repair["messages"][3]["content"]
    assert feedback.startswith("The output does not meet these requirements:\n- Polite")
    assert "(why: The output is rude.)" in feedback and "Mentions a number" not in feedback
    assert json.loads(repair["messages"][2]["content"]) == {"answer": "You are rude, it is 4."}
    rollouts = {t.rollout_id for t in program.traces()}
    assert rollouts == {"repair:0", "repair:1"}


async def test_best_effort_or_raise_when_repairs_run_out() -> None:
    def responder(body: dict[str, Any]) -> str:
        return '{"answer": "no"}'

    short = Requirement("At least two words", lambda p: len(p.answer.split()) >= 2)
    async with scripted(responder) as (server, manager):
        lenient = ValidateAndRepair(Predict("question -> answer"), [short], max_repairs=1)
        result = await lenient.bind(manager)(question="q")
        assert not result.passed and result.repairs == 1
        assert server.stats.requests == 2

        strict = ValidateAndRepair(
            Predict("question -> answer"), [short], max_repairs=1, raise_on_failure=True
        )
        with pytest.raises(RequirementsNotMetError, match="still fail after 1 repair") as info:
            await strict.bind(manager)(question="q")
    cause = info.value
    assert isinstance(cause, RequirementsNotMetError)
    assert "[FAIL] At least two words" in str(cause) and cause.output.answer == "no"


def test_bad_requirements_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty description"):
        Requirement("  ")
    with pytest.raises(TypeError, match="validator must be callable"):
        Requirement("x", validator="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one requirement"):
        Requirements([])
    with pytest.raises(ValueError, match="max_repairs >= 0"):
        ValidateAndRepair(Predict("q -> a"), ["x"], max_repairs=-1)
    assert asyncio.iscoroutinefunction(Requirements.forward)
