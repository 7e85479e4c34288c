"""Optimizers against the scripted OpenAI-compatible server.

The server answers the optimizers' structured calls by the schema they ask
for (``FeedbackSummary`` for SFA's aggregation, ``ParameterUpdate`` for a new
value), so each test scripts exactly the replies it needs, and asserts on
the parameters, the optimizer's history and what the server received.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from plait import (
    LLMInference,
    Module,
    Parameter,
    PlaitError,
    Predict,
    ResourceConfig,
    ResourceManager,
)
from plait.optimization import SFAOptimizer, TextGradOptimizer, TrainingStep
from plait.testing import RequestRecord, ScriptedServer

AGGREGATE = "FeedbackSummary"
UPDATE = "ParameterUpdate"


# ------------------------------------------------------------------ helpers
def schema_of(body: dict[str, Any]) -> str | None:
    """Returns the name of the response schema a request asked for (None: plain text)."""
    response_format = body.get("response_format") or {}
    return (response_format.get("json_schema") or {}).get("name")


def prompt_of(body: dict[str, Any]) -> str:
    """Returns the first user message (the optimizer's prompt)."""
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def current_value(body: dict[str, Any]) -> str:
    """Returns the parameter value an optimizer request shows between <<< and >>>."""
    match = re.search(r"<<<\n(.*?)\n>>>", prompt_of(body), re.DOTALL)
    assert match, prompt_of(body)
    return match.group(1)


def requests(server: ScriptedServer, schema: str) -> list[RequestRecord]:
    return [r for r in server.stats.log if r.body and schema_of(r.body) == schema]


def scripted(
    update: Callable[[dict[str, Any]], Any] | None = None,
    changes: list[str] | None = None,
) -> Callable[[dict[str, Any]], str]:
    """A responder: aggregation gives ``changes``; an update appends ' Be specific.' by default."""

    def respond(body: dict[str, Any]) -> str:
        schema = schema_of(body)
        if schema == AGGREGATE:
            listed = ["Be more specific."] if changes is None else changes
            return json.dumps({"summary": "The answers are vague.", "changes": listed})
        if schema == UPDATE:
            if update is not None:
                reply = update(body)
                return reply if isinstance(reply, str) else json.dumps(reply)
            new = current_value(body) + " Be specific."
            return json.dumps({"new_value": new, "rationale": "The feedback asks for it."})
        return "task answer"

    return respond


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(responder=scripted()) as running:
        yield running


@pytest.fixture
async def manager(server: ScriptedServer) -> AsyncIterator[ResourceManager]:
    config = ResourceConfig({"*": server.endpoint(max_retries=0)})
    async with ResourceManager(config) as running:
        yield running


def prompt(value: str = "Summarise the text.", name: str = "prompt") -> Parameter:
    param = Parameter(value, description=f"the {name} of a summariser")
    param.accumulate_feedback("The output failed the check. Expected a shorter summary.")
    return param


class Chain(Module):
    """``second`` reads ``first``'s output; registered downstream-first on purpose."""

    def __init__(self) -> None:
        super().__init__()
        self.second = LLMInference("task", system_prompt=Parameter("SECOND", description="stage 2"))
        self.first = LLMInference("task", system_prompt=Parameter("FIRST", description="stage 1"))

    def forward(self, question: str) -> Any:
        return self.second(f"Notes: {self.first(question)}")


class Fan(Module):
    """Two independent readers of the input, then a combiner."""

    def __init__(self) -> None:
        super().__init__()
        self.left = LLMInference("task", system_prompt=Parameter("LEFT", description="left reader"))
        self.right = LLMInference("task", system_prompt=Parameter("RIGHT", description="right"))
        self.join = LLMInference("task", system_prompt=Parameter("JOIN", description="combiner"))

    def forward(self, text: str) -> Any:
        return self.join(f"{self.left(text)} | {self.right(text)}")


async def give_feedback(program: Module, manager: ResourceManager) -> None:
    """Runs ``program`` in training mode with an always-failing check, then backward."""
    step = TrainingStep(program, lambda output, target: False).bind(manager)
    step.train()
    loss = await step("question", target="answer")
    await loss.backward()


# -------------------------------------------------------------- SFA basics
async def test_sfa_applies_the_scripted_update(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    param = prompt()
    optimizer = SFAOptimizer([("summariser.prompt", param)], conservatism=0).bind(manager)

    report = await optimizer.step()

    assert param.value == "Summarise the text. Be specific."
    assert report.accepted == ["summariser.prompt"] and param.get_accumulated_feedback() == []
    record = optimizer.history["summariser.prompt"][-1]
    assert (record.status, record.old, record.changes) == (
        "accepted",
        "Summarise the text.",
        ["Be more specific."],
    )
    assert record.rationale == "The feedback asks for it." and record.attempts == 2
    # Both calls asked for structured output; the update saw the aggregated changes.
    assert [schema_of(r.body) for r in server.stats.log] == [AGGREGATE, UPDATE]
    update_prompt = prompt_of(requests(server, UPDATE)[0].body)
    assert "- Be more specific." in update_prompt and "the prompt of a summariser" in update_prompt
    assert "Expected a shorter summary" in prompt_of(requests(server, AGGREGATE)[0].body)


async def test_parameters_without_feedback_are_left_alone(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    quiet = Parameter("Stay.", description="a prompt nobody criticised")
    frozen = prompt("Frozen.")
    frozen.requires_grad = False
    report = await SFAOptimizer([quiet, frozen]).bind(manager).step()
    assert report.updates == [] and server.stats.requests == 0


async def test_aggregation_asking_for_no_change_skips_the_update(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = scripted(changes=[])
    param = prompt()
    report = await SFAOptimizer([("prompt", param)]).bind(manager).step()
    assert param.value == "Summarise the text."
    assert report.updates[0].status == "skipped"
    assert [schema_of(r.body) for r in server.stats.log] == [AGGREGATE]


async def test_unusable_aggregation_falls_back_to_the_raw_feedback(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    def respond(body: dict[str, Any]) -> str:
        if schema_of(body) == AGGREGATE:
            return "Here are my thoughts: be shorter."
        return scripted()(body)

    server.responder = respond
    param = prompt()
    optimizer = SFAOptimizer([("prompt", param)], max_retries=1, conservatism=0).bind(manager)
    report = await optimizer.step()
    assert report.accepted == ["prompt"]
    assert len(requests(server, AGGREGATE)) == 2  # asked, re-asked once, then fell back
    assert "aggregation failed" in report.updates[0].feedback
    assert "Expected a shorter summary" in prompt_of(requests(server, UPDATE)[0].body)


# ---------------------------------------------------------- unusable replies
UNUSABLE = {
    "not JSON": ("Sure! Here is a better prompt: Summarise {text} briefly.", "not valid JSON"),
    "empty new_value": ({"new_value": "  ", "rationale": "r"}, "empty"),
    "placeholder lost": ({"new_value": "Summarise it briefly.", "rationale": "r"}, "{text}"),
    "unchanged": ({"new_value": "Summarise {text}.", "rationale": "r"}, "same as the old"),
    # One long word: the server cuts replies at max_tokens, and this one fits.
    "absurdly long": ({"new_value": "Summarise {text}. " + "x" * 600, "rationale": "r"}, "limit"),
}


@pytest.mark.parametrize("case", list(UNUSABLE))
async def test_an_unusable_update_is_rejected_logged_and_never_applied(
    case: str,
    server: ScriptedServer,
    manager: ResourceManager,
    caplog: pytest.LogCaptureFixture,
) -> None:
    reply, reason = UNUSABLE[case]
    server.responder = scripted(update=lambda body: reply)
    param = prompt("Summarise {text}.")
    optimizer = SFAOptimizer([("prompt", param)], max_retries=2, conservatism=0).bind(manager)

    report = await optimizer.step()  # never raises for a bad reply

    assert param.value == "Summarise {text}."
    assert report.rejected == ["prompt"]
    record = optimizer.history["prompt"][-1]
    assert record.status == "rejected" and reason in record.reason
    assert len(requests(server, UPDATE)) == 3  # 1 + max_retries
    assert "rejected the update of prompt" in caplog.text
    assert param.get_accumulated_feedback() == []  # the step consumed the feedback


async def test_a_re_ask_shows_the_reason_and_a_later_good_reply_is_applied(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    replies = iter(
        [
            {"new_value": "Summarise briefly.", "rationale": "shorter"},
            {"new_value": "Summarise {text} briefly.", "rationale": "shorter, kept {text}"},
        ]
    )
    server.responder = scripted(update=lambda body: next(replies))
    param = prompt("Summarise {text}.")
    optimizer = SFAOptimizer([("prompt", param)], conservatism=0).bind(manager)

    report = await optimizer.step()

    assert param.value == "Summarise {text} briefly." and report.accepted == ["prompt"]
    second = requests(server, UPDATE)[1].body["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert "could not be used" in second[-1]["content"] and "{text}" in second[-1]["content"]


async def test_raw_control_characters_in_a_reply_are_parsed_leniently(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    # Invalid JSON (a raw newline inside a string), as small models write it.
    raw = '{"rationale": "two lines", "new_value": "Summarise {text}.\nBe brief."}'
    server.responder = scripted(update=lambda body: raw)
    param = prompt("Summarise {text}.")
    await SFAOptimizer([("prompt", param)], conservatism=0).bind(manager).step()
    assert param.value == "Summarise {text}.\nBe brief."


async def test_a_failing_optimizer_endpoint_rejects_without_crashing(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    def broken(body: dict[str, Any]) -> str:
        raise RuntimeError("model crashed")

    server.responder = broken
    param = prompt()
    report = await TextGradOptimizer([("prompt", param)]).bind(manager).step()
    assert param.value == "Summarise the text."
    assert report.updates[0].status == "rejected"
    assert "call failed" in report.updates[0].reason


async def test_conservatism_rejects_a_rewrite_that_is_too_large(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = scripted(
        update=lambda body: {"new_value": "Write a haiku instead of summarising.", "rationale": "r"}
    )
    param = prompt("Summarise the text in two sentences.")
    optimizer = SFAOptimizer([("prompt", param)], conservatism=0.9, max_retries=0).bind(manager)
    report = await optimizer.step()
    assert param.value == "Summarise the text in two sentences."
    reason = report.updates[0].reason
    assert "changes 6 of 6 words; conservatism 0.9 allows at most 4 (19% of the words" in reason
    assert "smallest edit" in prompt_of(requests(server, UPDATE)[0].body)


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="conservatism must be in"):
        SFAOptimizer([prompt()], conservatism=1.5)
    with pytest.raises(ValueError, match="empty parameter list"):
        SFAOptimizer([])
    with pytest.raises(ValueError, match="momentum"):
        TextGradOptimizer([prompt()], momentum=-1)
    with pytest.raises(ValueError, match="got str at position 0"):
        SFAOptimizer(["not a parameter"])  # type: ignore[list-item]


def test_names_come_from_named_parameters_or_attributes() -> None:
    program = Chain()
    assert [n for n, _ in SFAOptimizer(program).named_parameters()] == [
        "second.system_prompt",
        "first.system_prompt",
    ]
    # From parameters() the path is unknown: attribute names, made unique.
    assert [n for n, _ in SFAOptimizer(program.parameters()).named_parameters()] == [
        "system_prompt",
        "system_prompt#2",
    ]


async def test_step_without_resources_says_how_to_give_them() -> None:
    with pytest.raises(PlaitError, match=r"optimizer.bind\(resources\)"):
        await SFAOptimizer([prompt()]).step()


# ------------------------------------------------------------------- order
async def test_upstream_parameters_update_first_and_downstream_sees_the_change(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    program = Chain()
    await give_feedback(program, manager)
    assert program.first.system_prompt.graph_level < program.second.system_prompt.graph_level
    server.stats.reset()
    optimizer = SFAOptimizer(program.named_parameters(), conservatism=0).bind(manager)

    report = await optimizer.step()

    assert report.levels == [["first.system_prompt"], ["second.system_prompt"]]
    updates = requests(server, UPDATE)
    assert [current_value(r.body) for r in updates] == ["FIRST", "SECOND"]
    downstream = prompt_of(updates[1].body)
    assert "first.system_prompt changed from 'FIRST' to 'FIRST Be specific.'" in downstream
    assert "changed" not in prompt_of(updates[0].body)
    assert program.first.system_prompt.value == "FIRST Be specific."
    assert program.second.system_prompt.value == "SECOND Be specific."
    assert program.first.system_prompt.graph_level is None  # consumed with the feedback


async def test_without_a_graph_the_given_order_is_kept(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    a, b = prompt("AAA"), prompt("BBB")
    await SFAOptimizer([("b", b), ("a", a)], conservatism=0).bind(manager).step()
    assert [current_value(r.body) for r in requests(server, UPDATE)] == ["BBB", "AAA"]


async def test_independent_parameters_of_one_level_update_concurrently(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    program = Fan()
    await give_feedback(program, manager)
    arrived: list[str] = []
    both = asyncio.Event()

    async def respond(body: dict[str, Any]) -> str:
        if schema_of(body) == AGGREGATE and current_value(body) in ("LEFT", "RIGHT"):
            arrived.append(current_value(body))
            if len(arrived) == 2:
                both.set()
            # Waits for the other reader's request: only concurrent requests get past.
            await asyncio.wait_for(both.wait(), timeout=10)
        return scripted()(body)

    server.responder = respond
    server.stats.reset()
    report = await SFAOptimizer(program.named_parameters(), conservatism=0).bind(manager).step()

    assert report.levels == [["left.system_prompt", "right.system_prompt"], ["join.system_prompt"]]
    assert server.stats.peak_concurrency >= 2
    assert len(report.accepted) == 3


# -------------------------------------------------------------- validation
async def test_validation_reverts_a_step_that_lowers_the_score(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    param = prompt()
    calls: list[str] = []

    async def validate() -> float:
        calls.append(param.value)
        return 0.2 if "Be specific." in param.value else 0.5

    optimizer = SFAOptimizer([("prompt", param)], conservatism=0, validate=validate).bind(manager)
    report = await optimizer.step()

    assert param.value == "Summarise the text."
    assert report.reverted and (report.score_before, report.score_after) == (0.5, 0.2)
    record = optimizer.history["prompt"][-1]
    assert record.status == "reverted" and "fell from 0.5 to 0.2" in record.reason
    assert record.new == "Summarise the text. Be specific."

    # The score of the unchanged parameters is remembered: the next step asks once (after).
    param.accumulate_feedback("Still too long.")
    await optimizer.step()
    specific = "Summarise the text. Be specific."
    assert calls == ["Summarise the text.", specific, specific]


async def test_validation_keeps_a_step_that_does_not_lower_the_score(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    param = prompt()

    async def validate() -> float:
        return 0.9 if "Be specific." in param.value else 0.5

    optimizer = SFAOptimizer([("prompt", param)], conservatism=0, validate=validate).bind(manager)
    report = await optimizer.step()
    assert not report.reverted and param.value == "Summarise the text. Be specific."
    assert optimizer.history["prompt"][-1].status == "accepted"


# ---------------------------------------------------------------- TextGrad
async def test_textgrad_updates_from_the_feedback_in_one_call(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    param = prompt()
    report = await TextGradOptimizer([("prompt", param)], conservatism=0).bind(manager).step()
    assert report.accepted == ["prompt"]
    assert [schema_of(r.body) for r in server.stats.log] == [UPDATE]
    assert "Expected a shorter summary" in prompt_of(server.stats.log[0].body)


async def test_textgrad_momentum_shows_past_values_and_their_feedback(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    param = prompt("Version one.")
    optimizer = TextGradOptimizer([("prompt", param)], momentum=2, conservatism=0).bind(manager)
    await optimizer.step()
    param.accumulate_feedback("Now it rambles.")
    await optimizer.step()

    first, second = (prompt_of(r.body) for r in requests(server, UPDATE))
    assert "Earlier values" not in first
    assert "Earlier values" in second
    assert "value 'Version one.'" in second and "Expected a shorter summary" in second
    assert "its update was accepted" in second
    assert current_value(requests(server, UPDATE)[1].body) == "Version one. Be specific."


# ------------------------------------------------------------------- state
async def test_state_dict_round_trips_through_json(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    param = prompt()
    optimizer = TextGradOptimizer([("p", param)], momentum=1, conservatism=0).bind(manager)
    await optimizer.step()
    param.accumulate_feedback("Too long.")
    server.responder = scripted(update=lambda body: "not json")
    await optimizer.step()

    text = json.dumps(optimizer.state_dict())
    restored = TextGradOptimizer([("p", param)], momentum=1, conservatism=0)
    restored.load_state_dict(text)

    assert restored.state_dict() == json.loads(text)
    assert restored.step_count == 2
    assert [r.status for r in restored.history["p"]] == ["accepted", "rejected"]
    assert restored.state_dict()["settings"]["momentum"] == 1


def test_load_state_dict_names_unknown_parameters() -> None:
    state = SFAOptimizer([("a", prompt()), ("b", prompt())]).state_dict()
    with pytest.raises(KeyError, match=r"unknown parameter\(s\) in optimizer state:\\n  b"):
        SFAOptimizer([("a", prompt())]).load_state_dict(state)
    with pytest.raises(ValueError, match="not an optimizer state"):
        SFAOptimizer([("a", prompt())]).load_state_dict({"a": 1})


# ---------------------------------------------------------- embedded model
@pytest.mark.slow
async def test_sfa_step_with_the_embedded_model_never_crashes() -> None:
    config = ResourceConfig({"*": {"provider": "local", "n_ctx": 4096}})
    param = Parameter("Answer the question.", description="system prompt of a yes/no classifier")
    param.accumulate_feedback("The output failed the check. Expected: 'yes'. Got: 'no'.")
    async with ResourceManager(config) as manager:
        optimizer = SFAOptimizer([("prompt", param)], max_retries=1, conservatism=0.3).bind(manager)
        report = await optimizer.step()
    record = report.updates[0]
    assert record.status in ("accepted", "rejected", "skipped")
    assert record.feedback and not record.feedback.startswith("aggregation failed")
    if record.status == "accepted":
        assert param.value == record.new and param.value != "Answer the question."
    else:
        assert param.value == "Answer the question."


async def test_demos_are_asked_for_as_a_list_of_examples(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    qa = Predict("question -> answer: int", demos=[{"question": "1 + 1", "answer": 2}])
    qa.demos.accumulate_feedback("The demos are all easy; add a harder one.")

    def update(body: dict[str, Any]) -> Any:
        schema = body["response_format"]["json_schema"]["schema"]
        demo = schema["$defs"][schema["properties"]["new_value"]["items"]["$ref"].split("/")[-1]]
        assert set(demo["properties"]) == {"question", "answer"}
        new = [{"question": "1 + 1", "answer": 2}, {"question": "17 * 3", "answer": 51}]
        return {"rationale": "a harder one", "new_value": new}

    server.responder = scripted(update=update)
    report = await TextGradOptimizer([("qa.demos", qa.demos)], conservatism=0).bind(manager).step()
    assert report.accepted == ["qa.demos"]
    assert qa.demos.value == [
        {"question": "1 + 1", "answer": 2},
        {"question": "17 * 3", "answer": 51},
    ]
