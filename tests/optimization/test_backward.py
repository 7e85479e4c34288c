"""Backward through whole graphs: every learnable parameter hears, nothing else does.

Programs run against the scripted OpenAI-compatible server on loopback;
assertions are on the feedback parameters collected, on the backward
report, and on what the server saw (never on timings).
"""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
from pydantic import BaseModel

import plait.functional as F
import seed_programs
from plait import LLMInference, Module, Parameter, ResourceConfig, ResourceManager, Value, valueify
from plait.backends.types import Message, Request
from plait.execution import generate
from plait.execution.tape import live_tapes
from plait.feedback import BackwardContext, BackwardResult, Feedback
from plait.optimization import LLMRankingLoss, Loss, TrainingStep, VerifierLoss, backward
from plait.testing import ScriptedServer


# ------------------------------------------------------------------ fixtures
def config_for(server: ScriptedServer) -> ResourceConfig:
    return ResourceConfig({"*": server.endpoint(max_retries=0)})


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as running:
        yield running


@pytest.fixture
async def manager(server: ScriptedServer) -> AsyncIterator[ResourceManager]:
    async with ResourceManager(config_for(server)) as running:
        yield running


def learnable(text: str) -> Parameter:
    return Parameter(text, description=f"The system prompt that says: {text}")


def always_wrong(output: Any, target: Any) -> bool:
    return False


def user_text(body: dict[str, Any]) -> str:
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


def system_text(body: dict[str, Any]) -> str:
    return next((m["content"] for m in body["messages"] if m["role"] == "system"), "")


async def train_once(program: Module, manager: ResourceManager, *args: Any, **kwargs: Any):
    """Runs one training step with an always-failing check; returns the backward report."""
    step = TrainingStep(program, VerifierLoss(always_wrong)).bind(manager).train()
    loss = await step(*args, target="the expected answer", **kwargs)
    assert loss.meta["_tape_ids"]
    return await loss.backward()


def feedback_of(param: Parameter) -> str:
    return "\n---\n".join(param.get_accumulated_feedback())


# ---------------------------------------------------- seed 000 programs
def mixed_prompt(role: str, text: str) -> str | Parameter:
    """Makes most seed prompts learnable; the analyzer stays text, the business view frozen."""
    if role == "analyzer":
        return text
    if role == "business":
        return Parameter(text, requires_grad=False)
    return learnable(text)


SummarizeAndAnalyze = partial(seed_programs.SummarizeAndAnalyze, prompt=mixed_prompt)
MultiPerspectiveAnalysis = partial(seed_programs.MultiPerspectiveAnalysis, prompt=mixed_prompt)
Synthesizer = partial(seed_programs.Synthesizer, prompt=mixed_prompt)
DeepPipeline = partial(seed_programs.DeepPipeline, prompt=mixed_prompt)


@pytest.mark.parametrize(
    "program_type", [SummarizeAndAnalyze, MultiPerspectiveAnalysis, Synthesizer, DeepPipeline]
)
async def test_every_learnable_parameter_of_the_seed_programs_hears(
    manager: ResourceManager, program_type: type[Module]
) -> None:
    program = program_type()
    report = await train_once(program, manager, "Quarterly sales rose 4%.")
    learnable_names = {name for name, p in program.named_parameters() if p.requires_grad}
    fixed_names = {name for name, p in program.named_parameters() if not p.requires_grad}
    assert learnable_names and fixed_names
    assert set(report.parameters) == {f"module.{name}" for name in learnable_names}
    params = dict(program.named_parameters())
    for name in learnable_names:
        assert "The output failed always_wrong" in feedback_of(params[name]), name
    for name in fixed_names:
        assert params[name].get_accumulated_feedback() == [], name


async def test_feedback_to_an_llm_call_shows_its_real_input_and_output(
    manager: ResourceManager,
) -> None:
    program = SummarizeAndAnalyze()
    await train_once(program, manager, "Quarterly sales rose 4%.")
    text = feedback_of(program.summarizer.system_prompt)
    assert "received:\nprompt: Quarterly sales rose 4%." in text
    assert "It produced:\necho: Quarterly sales rose 4%." in text


# ---------------------------------------------------- multi-input nodes
class ContextQuestionJudge(Module):
    """An async leaf with two inputs whose backward tells each input something different."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm")

    async def forward(self, context: str, question: str) -> str:
        return await self.llm(f"Context: {context}\nQuestion: {question}")

    def backward(self, feedback: str, ctx: BackwardContext) -> BackwardResult:
        return BackwardResult(
            input_feedback={
                "context": f"CONTEXT-FEEDBACK (was {ctx.inputs['context']!r})",
                "question": f"QUESTION-FEEDBACK (was {ctx.inputs['question']!r})",
            }
        )


class RetrieveAndAsk(Module):
    def __init__(self, by_keyword: bool) -> None:
        super().__init__()
        self.by_keyword = by_keyword
        self.retrieve = LLMInference("llm", system_prompt=learnable("Retrieve context."))
        self.rephrase = LLMInference("llm", system_prompt=learnable("Rephrase the question."))
        self.judge = ContextQuestionJudge()

    def forward(self, text: str) -> str:
        context = self.retrieve(text)
        question = self.rephrase(text)
        if self.by_keyword:
            return self.judge(context=context, question=question)
        return self.judge(context, question)


@pytest.mark.parametrize("by_keyword", [True, False], ids=["keywords", "positional"])
async def test_a_multi_input_node_routes_feedback_by_parameter_name(
    manager: ResourceManager, by_keyword: bool
) -> None:
    program = RetrieveAndAsk(by_keyword)
    await train_once(program, manager, "why is the sky blue")
    retrieve = feedback_of(program.retrieve.system_prompt)
    rephrase = feedback_of(program.rephrase.system_prompt)
    assert "CONTEXT-FEEDBACK (was 'echo: why is the sky blue')" in retrieve
    assert "QUESTION-FEEDBACK" not in retrieve
    assert "QUESTION-FEEDBACK (was 'echo: why is the sky blue')" in rephrase
    assert "CONTEXT-FEEDBACK" not in rephrase


class Join(Module):
    """A plain-Python leaf with two inputs and the default backward."""

    _plait_leaf = True

    def forward(self, left: str, right: str) -> str:
        return f"{left} | {right}"


class TwoBranches(Module):
    def __init__(self) -> None:
        super().__init__()
        self.left = LLMInference("llm", system_prompt=learnable("Left."))
        self.right = LLMInference("llm", system_prompt=learnable("Right."))
        self.join = Join()
        self.final = LLMInference("llm", system_prompt=learnable("Final."))

    def forward(self, text: str) -> str:
        return self.final(self.join(self.left(text), right=self.right(text)))


async def test_the_default_backward_of_a_plain_leaf_reaches_both_inputs(
    manager: ResourceManager,
) -> None:
    program = TwoBranches()
    report = await train_once(program, manager, "x")
    assert set(report.parameters) == {
        "module.left.system_prompt",
        "module.right.system_prompt",
        "module.final.system_prompt",
    }
    assert "module.join" in report.nodes


class MisroutingJudge(ContextQuestionJudge):
    def backward(self, feedback: str, ctx: BackwardContext) -> BackwardResult:
        return BackwardResult(input_feedback={"contxt": feedback})


async def test_feedback_for_an_input_the_module_does_not_have_is_an_error(
    manager: ResourceManager,
) -> None:
    program = RetrieveAndAsk(by_keyword=True)
    program.judge = MisroutingJudge()
    with pytest.raises(KeyError, match=r"MisroutingJudge\.backward \(module\.judge\).*'contxt'"):
        await train_once(program, manager, "x")


# ---------------------------------------------------- select and functional ops
class Facts(BaseModel):
    headline: str  # not `title`: a traced value is a str, so `.title` is str.title
    body: str


def facts_or_echo(body: dict[str, Any]) -> str:
    if body.get("response_format"):
        return json.dumps({"headline": "A headline", "body": "A body"})
    return "echo: " + user_text(body)


class Extract(Module):
    def __init__(self, access: str) -> None:
        super().__init__()
        self.access = access
        self.extract = LLMInference(
            "llm", system_prompt=learnable("Extract facts."), response_format=Facts
        )
        self.write = LLMInference("llm", system_prompt=learnable("Write it up."))

    def forward(self, text: str) -> str:
        facts = self.extract(text)
        if self.access == "getitem":
            title = facts["headline"]
        elif self.access == "attribute":
            title = facts.headline
        else:
            title = F.upper(F.format("{}: {}", F.select(facts, "headline"), facts["body"]))
        return self.write(title)


@pytest.mark.parametrize("access", ["getitem", "attribute", "functional"])
async def test_select_and_functional_op_nodes_pass_feedback_through(
    server: ScriptedServer, manager: ResourceManager, access: str
) -> None:
    server.responder = facts_or_echo
    program = Extract(access)
    report = await train_once(program, manager, "some article")
    assert set(report.parameters) == {"module.extract.system_prompt", "module.write.system_prompt"}
    assert any(node.startswith("F.") for node in report.nodes)
    assert "A headline" in feedback_of(program.extract.system_prompt)  # its real output


class Instructed(Module):
    def __init__(self) -> None:
        super().__init__()
        self.instructions = Parameter("Answer in French.", description="How to answer.")
        self.style = Parameter("Be formal.", requires_grad=False)
        self.llm = LLMInference("llm")

    def forward(self, question: str) -> str:
        return self.llm(f"{self.instructions} {self.style}\n\n{question}")


async def test_a_parameter_formatted_into_a_prompt_hears_about_the_call(
    manager: ResourceManager,
) -> None:
    program = Instructed()
    report = await train_once(program, manager, "what time is it")
    assert report.parameters == {"module.instructions": 1}
    text = feedback_of(program.instructions)
    assert "part of the input of step module.llm" in text
    assert "The output failed always_wrong" in text
    assert program.style.get_accumulated_feedback() == []


# ---------------------------------------------------- async leaves
class Agent(Module):
    """Decides on real values, so it is one node; its inner calls are taped."""

    def __init__(self) -> None:
        super().__init__()
        self.plan = LLMInference("llm", system_prompt=learnable("Plan the task."))
        self.act = LLMInference("llm", system_prompt=learnable("Carry out the plan."))
        self.unused = LLMInference("llm", system_prompt=learnable("Never called."))

    async def forward(self, task: str) -> str:
        plan = await self.plan(f"plan: {task}")
        if plan.startswith("echo"):
            return await self.act(f"act on {plan}")
        return await self.unused(plan)


class Assistant(Module):
    def __init__(self) -> None:
        super().__init__()
        self.agent = Agent()

    def forward(self, task: str) -> str:
        return self.agent(task)


async def test_inner_calls_of_an_async_leaf_learn_from_their_real_inputs_and_outputs(
    manager: ResourceManager,
) -> None:
    program = Assistant()
    report = await train_once(program, manager, "tidy the desk")
    plan = program.agent.plan.system_prompt.get_accumulated_feedback()
    act = program.agent.act.system_prompt.get_accumulated_feedback()
    assert any(
        "prompt: plan: tidy the desk" in item and "It produced:\necho: plan: tidy the desk" in item
        for item in plan
    )
    assert any(
        "prompt: act on echo: plan: tidy the desk" in item
        and "It produced:\necho: act on echo: plan: tidy the desk" in item
        for item in act
    )
    assert "module.agent.plan.system_prompt" in report.parameters
    assert "module.agent.act.system_prompt" in report.parameters


class Deep(Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm", system_prompt=learnable("Go deep."))

    async def forward(self, text: str) -> str:
        return await self.llm(f"deep {text}")


class Middle(Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = LLMInference("llm", system_prompt=learnable("Prepare."))
        self.deep = Deep()

    def forward(self, text: str) -> str:
        return self.deep(self.pre(text))


class Outer(Module):
    """An async leaf running a composite that holds another async leaf."""

    def __init__(self) -> None:
        super().__init__()
        self.middle = Middle()

    async def forward(self, text: str) -> str:
        return await self.middle(text)

    def backward(self, feedback: str, ctx: BackwardContext) -> BackwardResult:
        return BackwardResult(input_feedback={"text": feedback})  # tells no parameter itself


class HoldsOuter(Module):
    def __init__(self) -> None:
        super().__init__()
        self.outer = Outer()

    def forward(self, text: str) -> str:
        return self.outer(text)


async def test_calls_of_an_async_leaf_nested_in_another_are_replayed(
    manager: ResourceManager,
) -> None:
    program = HoldsOuter()
    report = await train_once(program, manager, "q")
    assert set(report.parameters) == {
        "module.outer.middle.pre.system_prompt",
        "module.outer.middle.deep.llm.system_prompt",
    }
    (deep,) = program.outer.middle.deep.llm.system_prompt.get_accumulated_feedback()
    assert "prompt: deep echo: q" in deep and "It produced:\necho: deep echo: q" in deep


# ---------------------------------------------------- concurrency of backward
class Critic(Module):
    """An async leaf whose backward asks an LLM (through the training resources)."""

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label
        self.llm = LLMInference("llm")

    async def forward(self, text: str) -> str:
        return await self.llm(f"{self.label}: {text}")

    async def backward(self, feedback: str, ctx: BackwardContext) -> BackwardResult:
        question = f"backward of {self.label}: how should {ctx.inputs['text']!r} change?"
        response = await generate("llm", Request(messages=(Message("user", question),)))
        return BackwardResult(input_feedback={"text": response.text})


class Panel(Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = Critic("first")
        self.second = Critic("second")
        self.third = Critic("third")
        self.source = LLMInference("llm", system_prompt=learnable("Draft."))

    def forward(self, text: str) -> dict[str, str]:
        draft = self.source(text)
        return {"a": self.first(draft), "b": self.second(draft), "c": self.third(draft)}


async def test_backward_calls_of_independent_nodes_overlap_on_the_server(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    program = Panel().bind(manager).train()
    output = await program("topic")
    server.reset_stats()
    server.latency = 0.3
    report = await backward(output, "The panel missed the point.", resources=manager)
    bodies = [user_text(record.body) for record in server.stats.log]
    assert sorted(body.split(":")[0] for body in bodies) == [
        "backward of first",
        "backward of second",
        "backward of third",
    ]
    assert server.stats.peak_concurrency == 3
    draft = feedback_of(program.source.system_prompt)
    assert draft.count("echo: backward of") == 3  # each critic's LLM-made feedback arrived
    assert report.parameters == {"source.system_prompt": 1}


# ---------------------------------------------------- ranking: one feedback per candidate
def ranking_or_echo(body: dict[str, Any]) -> str:
    if body.get("response_format"):
        return json.dumps(
            {
                "candidate_1": {"comment": "too vague", "rank": 2},
                "candidate_2": {"comment": "precise and short", "rank": 1},
                "candidate_3": {"comment": "wrong facts", "rank": 3},
                "improvements": ["Name the cause."],
            }
        )
    return "echo: " + user_text(body)


class ThreeDrafts(Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = LLMInference("llm", system_prompt=learnable("Draft A."))
        self.b = LLMInference("llm", system_prompt=learnable("Draft B."))
        self.c = LLMInference("llm", system_prompt=learnable("Draft C."))

    def forward(self, text: str) -> list[str]:
        return [self.a(text), self.b(text), self.c(text)]


async def test_a_ranking_loss_tells_each_candidate_about_its_own_place(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = ranking_or_echo
    program = ThreeDrafts()
    step = TrainingStep(program, LLMRankingLoss("judge")).bind(manager).train()
    loss = await step("why is the sky blue")
    assert loss.payload.ranking == [1, 0, 2]
    await loss.backward()
    a, b, c = (feedback_of(m.system_prompt) for m in (program.a, program.b, program.c))
    assert "ranked 2 of 3 by the judge: too vague" in a and "precise" not in a
    assert "ranked 1 of 3 by the judge: precise and short" in b and "vague" not in b
    assert "ranked 3 of 3 by the judge: wrong facts" in c
    assert "Name the cause." in a


class StrictAnswer(Loss):
    """A loss whose judged input is not called ``output``."""

    def forward(self, answer: str, target: Any = None) -> Feedback:
        return Feedback(f"{answer!r} is not {target!r}", 0.0, ["Say the target."])


async def test_a_loss_sends_feedback_to_its_first_input_whatever_its_name(
    manager: ResourceManager,
) -> None:
    program = SummarizeAndAnalyze()
    step = TrainingStep(program, StrictAnswer()).bind(manager).train()
    loss = await step("text", target="summary")
    report = await loss.backward()
    assert report.parameters == {"module.summarizer.system_prompt": 1}
    assert "is not 'summary'" in feedback_of(program.summarizer.system_prompt)


# ---------------------------------------------------- tapes
async def test_backward_releases_the_tape(manager: ResourceManager) -> None:
    gc.collect()  # a tape an earlier test left in a cycle goes now, not between the counts
    before = live_tapes()
    step = TrainingStep(SummarizeAndAnalyze(), always_wrong).bind(manager).train()
    loss = await step("text", target="x")
    assert live_tapes() == before + 1
    await loss.backward()
    assert live_tapes() == before
    assert "_tape_ids" not in loss.meta


async def test_retain_tape_allows_a_second_backward(manager: ResourceManager) -> None:
    program = SummarizeAndAnalyze()
    step = TrainingStep(program, always_wrong).bind(manager).train()
    loss = await step("text", target="x")
    await loss.backward(retain_tape=True)
    await loss.backward()
    assert len(program.summarizer.system_prompt.get_accumulated_feedback()) == 2


async def test_detach_tape_releases_it_without_backward(manager: ResourceManager) -> None:
    gc.collect()  # a tape an earlier test left in a cycle goes now, not between the counts
    before = live_tapes()
    step = TrainingStep(SummarizeAndAnalyze(), always_wrong).bind(manager).train()
    loss = await step("text", target="x")
    loss.detach_tape()
    assert live_tapes() == before
    with pytest.raises(ValueError, match="not produced in training mode"):
        await loss.backward()


class OneCall(Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm", system_prompt=learnable("Answer."))

    def forward(self, question: str) -> str:
        return self.llm(question)


async def test_memory_stays_flat_over_1000_training_steps() -> None:
    async with (
        ScriptedServer(keep_log=False) as server,
        ResourceManager(config_for(server)) as manager,
    ):
        program = OneCall()
        step = TrainingStep(program, VerifierLoss(always_wrong)).bind(manager).train()
        gc.collect()  # a tape an earlier test left in a cycle goes now, not between the counts
        before = live_tapes()
        tracemalloc.start()
        try:
            for i in range(1, 1001):
                loss = await step(f"question number {i}", target="x")
                await loss.backward()
                del loss
                assert live_tapes() <= before + 1
                if i == 100:
                    gc.collect()
                    at_100 = tracemalloc.get_traced_memory()[0]
            gc.collect()
            at_1000 = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert live_tapes() == before
        assert at_1000 - at_100 < 1024 * 1024, (at_100, at_1000)
        assert len(program.llm.system_prompt.get_accumulated_feedback()) <= Parameter.max_feedback


# ---------------------------------------------------- errors
async def test_backward_of_a_value_without_tape_says_to_train_first() -> None:
    with pytest.raises(ValueError, match=r"not produced in training mode.*\.train\(\)"):
        await valueify("an answer").backward()


async def test_backward_of_an_eval_mode_output_says_to_train_first(
    manager: ResourceManager,
) -> None:
    step = TrainingStep(SummarizeAndAnalyze(), always_wrong).bind(manager)  # eval mode
    feedback = await step("text", target="x")
    assert isinstance(feedback, Feedback)
    with pytest.raises(ValueError, match="not produced in training mode"):
        await backward(feedback)


async def test_a_second_backward_without_retain_tape_says_the_tape_was_released(
    manager: ResourceManager,
) -> None:
    step = TrainingStep(SummarizeAndAnalyze(), always_wrong).bind(manager).train()
    loss = await step("text", target="x")
    tape_ids = list(loss.meta["_tape_ids"])
    await loss.backward()
    loss.meta["_tape_ids"] = tape_ids  # as if the caller kept a copy of the ids
    with pytest.raises(KeyError, match="released by a previous backward"):
        await loss.backward()


# ---------------------------------------------------- manual aggregation
async def test_value_backward_sends_one_grad_through_several_outputs(
    manager: ResourceManager,
) -> None:
    program = SummarizeAndAnalyze().bind(manager).train()
    outputs = await program(["first text", "second text", "third text"])
    assert all(isinstance(out, Value) and out.meta["_tape_ids"] for out in outputs)
    combined = Feedback("Two of three answers were too long.", 0.33, ["Be shorter."])
    report = await Value.backward(outputs, grad=combined)
    assert report.parameters == {"summarizer.system_prompt": 3}
    items = program.summarizer.system_prompt.get_accumulated_feedback()
    assert len(items) == 3
    assert all("Two of three answers were too long." in item for item in items)
    for text in ("first text", "second text", "third text"):  # each tape's own real input
        assert sum(f"prompt: {text}" in item for item in items) == 1
