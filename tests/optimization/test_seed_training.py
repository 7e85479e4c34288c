"""Seed 000's training examples, run as the seed writes them, against the scripted server.

The seed's training loop (``TrainingStep``, ``ExecutionSettings``, gathered
forward passes and backward passes, one ``optimizer.step()``), its
positional ``await step(input, target)``, and its `AssistantGeneration`,
a composite whose own ``backward`` reads ``feedback.payload`` and asks an
LLM for the instructions' feedback.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from plait import (
    BackwardContext,
    BackwardResult,
    ExecutionSettings,
    LLMInference,
    Module,
    Parameter,
    ResourceConfig,
    SFAOptimizer,
    TrainingStep,
)
from plait.testing import ScriptedServer
from seed_programs import AssistantGeneration, DeepPipeline

IMPROVE = "You help improve prompts based on feedback."
ADVICE = "State the answer first, in one short sentence."


def schema_of(body: dict[str, Any]) -> str | None:
    return ((body.get("response_format") or {}).get("json_schema") or {}).get("name")


def system_of(body: dict[str, Any]) -> str:
    return next((m["content"] for m in body["messages"] if m["role"] == "system"), "")


def user_of(body: dict[str, Any]) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def respond(body: dict[str, Any]) -> str:
    """Task calls answer "draft"; the optimizer's calls get usable structured replies."""
    schema = schema_of(body)
    if schema == "FeedbackSummary":
        return json.dumps({"summary": "Too long.", "changes": ["Ask for one sentence."]})
    if schema == "ParameterUpdate":
        old = user_of(body).split("<<<\n", 1)[1].split("\n>>>", 1)[0]
        return json.dumps({"rationale": "shorter", "new_value": f"{old} Answer in one sentence."})
    if system_of(body) == IMPROVE:
        return ADVICE
    return "draft"


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(responder=respond) as running:
        yield running


@pytest.fixture
def resources(server: ScriptedServer) -> ResourceConfig:
    return ResourceConfig({"*": server.endpoint(max_retries=0)})


def learnable(role: str, text: str) -> Parameter:
    return Parameter(text, description=f"system prompt of the {role} step")


def loss_fn(output: Any, target: Any) -> bool:
    return str(output) == str(target)


async def test_the_seed_training_loop_runs_as_written(resources: ResourceConfig) -> None:
    pipeline = DeepPipeline(prompt=learnable)
    batch_inputs = ["Document 1 text...", "Document 2 text..."]
    targets = ["report 1", "report 2"]

    optimizer = SFAOptimizer(pipeline.parameters()).bind(resources)
    step = TrainingStep(pipeline, loss_fn)

    async with ExecutionSettings(resources=resources):
        step.train()
        optimizer.zero_feedback()

        losses = await asyncio.gather(
            *[step(x, target=t) for x, t in zip(batch_inputs, targets, strict=True)]
        )
        await asyncio.gather(*[loss.backward() for loss in losses])

        report = await optimizer.step()
        step.eval()

    assert all(loss.payload.score == 0.0 for loss in losses)
    # Every one of the nine prompts heard about the failure and was rewritten.
    assert len(report.accepted) == 9
    assert all(p.value.endswith("Answer in one sentence.") for p in pipeline.parameters())
    assert not step.training and not pipeline.training


async def test_positional_target_on_an_unbound_step_of_a_bound_program(
    server: ScriptedServer, resources: ResourceConfig
) -> None:
    assistant = AssistantGeneration("Be helpful.").bind(resources)
    step = TrainingStep(assistant, loss_fn)  # not bound: it finds the program's resources
    step.train()

    loss = await step("What is 2 + 2?", "draft")

    assert loss.payload.score == 1.0
    assert loss.meta["_tape_ids"]
    losses = [await step("What is 3 + 3?", "6"), await step(["a", "b"][0], target="draft")]
    assert [x.payload.score for x in losses] == [0.0, 1.0]


async def test_a_composite_backward_override_decides_what_its_parameters_hear(
    server: ScriptedServer, resources: ResourceConfig
) -> None:
    assistant = AssistantGeneration("Be helpful.").bind(resources)
    step = TrainingStep(assistant, loss_fn)
    step.train()
    loss = await step("What is 3 + 3?", "6")

    # No ExecutionSettings here: backward uses the resources the forward pass ran on.
    report = await loss.backward()

    # The override ran: it asked the optimizer LLM, with the real output and the feedback.
    (asked,) = [r.body for r in server.stats.log if r.body and system_of(r.body) == IMPROVE]
    assert "Current instructions: Be helpful." in user_of(asked)
    assert "Output that was produced: draft" in user_of(asked)
    assert "Expected" in user_of(asked) and "6" in user_of(asked)
    # ... and its answer is the instructions' feedback, in place of the default call report.
    assert assistant.assistant_instructions.get_accumulated_feedback() == [ADVICE]
    assert report.parameters == {"module.assistant_instructions": 1}
    # The scope was visited as one step; the LLM call inside it was not.
    assert "backward:module" in report.nodes and "module.llm" not in report.nodes


class Routed(Module):
    """A composite override that reads its context and routes to a child's parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.draft = LLMInference("task", system_prompt=learnable("draft", "Draft it."))
        self.polish = LLMInference("task", system_prompt=learnable("polish", "Polish it."))
        self.seen: list[tuple[dict[str, Any], Any, str]] = []

    def forward(self, topic: str, tone: str) -> str:
        return self.polish(f"{self.draft(topic)} ({tone})")

    async def backward(self, feedback: str, ctx: BackwardContext) -> BackwardResult:
        self.seen.append((ctx.inputs, ctx.output, str(feedback)))
        return BackwardResult(
            input_feedback={"topic": f"topic: {feedback}"},
            parameter_feedback={"draft.system_prompt": "Drafts must be shorter."},
        )


class Outer(Module):
    """A plain composite around the override, with a step after it that reads its output."""

    def __init__(self) -> None:
        super().__init__()
        self.intro = LLMInference("task", system_prompt=learnable("intro", "Pick a topic."))
        self.routed = Routed()
        self.final = LLMInference("task", system_prompt=learnable("final", "Finish."))

    def forward(self, text: str) -> str:
        return self.final(self.routed(self.intro(text), tone="dry"))


async def test_an_override_inside_a_program_gets_the_feedback_of_its_readers(
    resources: ResourceConfig,
) -> None:
    program = Outer().bind(resources)
    step = TrainingStep(program, loss_fn)
    step.train()
    loss = await step("x", "y")
    await loss.backward()

    (seen,) = program.routed.seen
    inputs, output, feedback = seen
    assert inputs == {"topic": "draft", "tone": "dry"} and output == "draft"
    assert "final received" in feedback.lower() or "Expected" in feedback
    params = dict(program.named_parameters())
    assert params["routed.draft.system_prompt"].get_accumulated_feedback() == [
        "Drafts must be shorter."
    ]
    # The override gave polish nothing, so it heard nothing; intro heard the routed text.
    assert params["routed.polish.system_prompt"].get_accumulated_feedback() == []
    (intro,) = params["intro.system_prompt"].get_accumulated_feedback()
    assert "topic: " in intro
    assert params["final.system_prompt"].get_accumulated_feedback()


class Broken(AssistantGeneration):
    def backward(self, feedback: Any, ctx: BackwardContext) -> Any:
        return {"request": str(feedback)}


async def test_an_override_returning_the_wrong_type_is_a_clear_error(
    resources: ResourceConfig,
) -> None:
    step = TrainingStep(Broken("Be helpful.").bind(resources), loss_fn)
    step.train()
    loss = await step("q", "a")
    with pytest.raises(TypeError, match=r"Broken\.backward \(backward:module\) returned dict"):
        await loss.backward()
