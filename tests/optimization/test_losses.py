"""Losses: each returns `Feedback`; LLM losses ask for a JSON schema and fail soft.

LLM judges talk to the scripted OpenAI-compatible server on loopback: the
tests check what reached the wire (the schema, the prompt) and that the
Feedback fields come from the scripted JSON reply.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from plait import LLMInference, Module, Parameter, ResourceConfig, ResourceManager
from plait.feedback import Feedback
from plait.optimization import (
    CompositeLoss,
    HumanFeedbackLoss,
    LLMJudge,
    LLMPreferenceLoss,
    LLMRankingLoss,
    LLMRubricLoss,
    RankingFeedback,
    TrainingStep,
    VerifierLoss,
)
from plait.testing import ScriptedServer


# ------------------------------------------------------------------ fixtures
@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as running:
        yield running


@pytest.fixture
async def manager(server: ScriptedServer) -> AsyncIterator[ResourceManager]:
    config = ResourceConfig({"*": server.endpoint(max_retries=0)})
    async with ResourceManager(config) as running:
        yield running


def replying(*replies: Any):
    """A responder giving ``replies`` in turn (dicts as JSON text), then the last one again."""
    queue = list(replies)

    def responder(body: dict[str, Any]) -> str:
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        return reply if isinstance(reply, str) else json.dumps(reply)

    return responder


def schema_of(server: ScriptedServer, index: int = -1) -> dict[str, Any]:
    response_format = server.stats.log[index].body["response_format"]
    assert response_format["type"] == "json_schema"
    return response_format["json_schema"]["schema"]


def messages_of(server: ScriptedServer, index: int = -1) -> dict[str, str]:
    return {m["role"]: m["content"] for m in server.stats.log[index].body["messages"]}


# ------------------------------------------------------------------ LLMJudge
async def test_llm_judge_asks_for_a_schema_and_reads_the_verdict(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = replying(
        {"critique": "Too long.", "score": 4, "improvements": ["Cut the intro.", "Answer first."]}
    )
    judge = LLMJudge("judge", criteria="Answers in one sentence.").bind(manager)
    feedback = await judge("A very long answer ...", "A short answer.")
    assert feedback == Feedback("Too long.", 0.4, ["Cut the intro.", "Answer first."])
    schema = schema_of(server)
    assert set(schema["required"]) == {"critique", "score", "improvements"}
    sent = messages_of(server)
    assert "from 0, worst, to 10, best" in sent["system"]
    assert "Criteria: Answers in one sentence." in sent["user"]
    assert "Output to judge:\nA very long answer ..." in sent["user"]
    assert "Reference answer:\nA short answer." in sent["user"]
    assert server.stats.log[-1].body["temperature"] == 0.0


async def test_llm_judge_scores_are_clamped_to_its_scale(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = replying({"critique": "Great.", "score": 12.5, "improvements": []})
    feedback = await LLMJudge("judge", scale=5).bind(manager)("answer")
    assert feedback.score == 1.0
    assert "Reference answer" not in messages_of(server)["user"]


async def test_an_unparsable_judge_reply_is_reasked_once_then_gives_no_score(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = replying("I think it is quite good!")
    feedback = await LLMJudge("judge").bind(manager)("answer")
    assert feedback.score is None
    assert feedback.items == []
    assert "The judge's reply was unusable" in feedback.text
    assert "I think it is quite good!" in feedback.text
    assert server.stats.requests == 2
    reask = server.stats.log[1].body["messages"]
    assert reask[-2] == {"role": "assistant", "content": "I think it is quite good!"}
    assert "could not be used" in reask[-1]["content"]


async def test_a_non_finite_score_is_unusable_too(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = replying('{"critique": "?", "score": NaN, "improvements": []}')
    feedback = await LLMJudge("judge").bind(manager)("answer")
    assert feedback.score is None
    assert "score: Input should be a finite number" in feedback.text


async def test_a_judge_reply_fixed_by_the_reask_is_used(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = replying(
        {"critique": "ok"},  # valid JSON, but no score: fails validation
        {"critique": "Fine.", "score": 9, "improvements": []},
    )
    feedback = await LLMJudge("judge").bind(manager)("answer")
    assert feedback == Feedback("Fine.", 0.9, [])
    assert server.stats.requests == 2


class Answerer(Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference(
            "llm", system_prompt=Parameter("Answer.", description="How to answer.")
        )

    def forward(self, question: str) -> str:
        return self.llm(question)


def judge_or_echo(verdict: Any):
    def responder(body: dict[str, Any]) -> str:
        if body.get("response_format"):
            return verdict if isinstance(verdict, str) else json.dumps(verdict)
        user = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        return "echo: " + user

    return responder


async def test_a_judge_in_a_training_step_judges_the_real_output_and_teaches_the_program(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = judge_or_echo(
        {"critique": "It only echoes.", "score": 1, "improvements": ["Answer the question."]}
    )
    program = Answerer()
    step = TrainingStep(program, LLMJudge("judge")).bind(manager).train()
    loss = await step("What is 2 + 2?", target="4")
    assert loss.payload == Feedback("It only echoes.", 0.1, ["Answer the question."])
    judged = messages_of(server)["user"]
    assert "Output to judge:\necho: What is 2 + 2?" in judged
    assert "Reference answer:\n4" in judged
    report = await loss.backward()
    assert report.parameters == {"module.llm.system_prompt": 1}
    (item,) = program.llm.system_prompt.get_accumulated_feedback()
    assert "It only echoes." in item and "- Answer the question." in item


async def test_an_unusable_verdict_sends_no_feedback_backward(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = judge_or_echo("not json at all")
    program = Answerer()
    step = TrainingStep(program, LLMJudge("judge")).bind(manager).train()
    loss = await step("What is 2 + 2?")
    assert loss.payload.score is None
    report = await loss.backward()
    assert report.parameters == {}
    assert program.llm.system_prompt.get_accumulated_feedback() == []


# ------------------------------------------------------------------ LLMRubricLoss
async def test_rubric_loss_has_one_required_schema_field_per_criterion(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = replying(
        {
            "accuracy": {"comment": "All facts right.", "score": 5},
            "brevity": {"comment": "Two paragraphs too long.", "score": 2},
            "improvements": [],
        }
    )
    rubric = {"Accuracy": "Every fact is in the source.", "Brevity": "At most 3 sentences."}
    feedback = await LLMRubricLoss("judge", rubric).bind(manager)("a summary")
    schema = schema_of(server)
    assert schema["required"] == ["accuracy", "brevity", "improvements"]
    assert schema["properties"]["brevity"]["description"] == "At most 3 sentences."
    assert feedback.score == pytest.approx((1.0 + 0.4) / 2)
    assert "accuracy: 5/5 — All facts right." in feedback.text
    assert "brevity: 2/5 — Two paragraphs too long." in feedback.text
    # No improvements given: the comments on criteria not fully met stand in.
    assert feedback.items == ["brevity: Two paragraphs too long."]
    assert "- brevity: At most 3 sentences." in messages_of(server)["user"]


async def test_rubric_loss_accepts_a_list_or_a_text(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = replying(
        {
            "criterion_1": {"comment": "ok", "score": 3},
            "criterion_2": {"comment": "ok", "score": 1},
            "improvements": ["Add a source."],
        }
    )
    loss = LLMRubricLoss("judge", ["Cites a source.", "Uses plain words."], scale=4).bind(manager)
    feedback = await loss("text")
    assert feedback.score == pytest.approx((0.75 + 0.25) / 2)
    assert feedback.items == ["Add a source."]
    assert list(LLMRubricLoss("judge", "Is it kind?").rubric) == ["rubric"]
    with pytest.raises(ValueError, match="at least one criterion"):
        LLMRubricLoss("judge", [])


# ------------------------------------------------------------------ LLMPreferenceLoss
@pytest.mark.parametrize(
    ("better", "score"), [("candidate", 1.0), ("tie", 0.5), ("reference", 0.0)]
)
async def test_preference_against_a_reference(
    server: ScriptedServer, manager: ResourceManager, better: str, score: float
) -> None:
    server.responder = replying(
        {"comparison": "The reference is more precise.", "better": better, "improvements": ["x"]}
    )
    feedback = await LLMPreferenceLoss("judge").bind(manager)("my answer", "the reference")
    assert feedback.score == score
    assert "The reference is more precise." in feedback.text
    assert schema_of(server)["properties"]["better"]["enum"] == ["candidate", "reference", "tie"]
    user = messages_of(server)["user"]
    assert "candidate:\nmy answer" in user and "reference:\nthe reference" in user


async def test_preference_among_alternatives(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = replying(
        {"comparison": "Alternative 2 is clearer.", "better": "alternative 2", "improvements": []}
    )
    loss = LLMPreferenceLoss("judge", criteria="Clearer.").bind(manager)
    feedback = await loss("mine", ["other one", "other two"])
    assert feedback.score == 0.0
    assert "preferred the alternative 2 over the output" in feedback.text
    enum = schema_of(server)["properties"]["better"]["enum"]
    assert enum == ["candidate", "alternative 1", "alternative 2", "tie"]


async def test_preference_needs_something_to_compare_with() -> None:
    with pytest.raises(ValueError, match="reference answer or a list of alternative"):
        await LLMPreferenceLoss("judge")("mine")


# ------------------------------------------------------------------ LLMRankingLoss
async def test_ranking_loss_ranks_candidates_and_scores_each(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = replying(
        {
            "candidate_1": {"comment": "vague", "rank": 2},
            "candidate_2": {"comment": "best", "rank": 1},
            "candidate_3": {"comment": "also vague", "rank": 2},
            "candidate_4": {"comment": "off topic", "rank": 9},  # clamped to 4
            "improvements": ["Be specific."],
        }
    )
    loss = LLMRankingLoss("judge").bind(manager)
    # A bound call whose first argument is a list runs a batch: one item, four candidates.
    (feedback,) = await loss([["one", "two", "three", "four"]], "a precise answer")
    assert isinstance(feedback, RankingFeedback)
    assert feedback.score is None
    assert feedback.ranking == [1, 0, 2, 3]
    assert feedback.scores == pytest.approx([1 / 3, 1.0, 1 / 3, 0.0])
    assert feedback.comments == ["vague", "best", "also vague", "off topic"]
    assert feedback.items == ["Be specific."]
    assert feedback.text.splitlines()[1] == "1. candidate 2: best"
    assert schema_of(server)["required"] == [
        "candidate_1",
        "candidate_2",
        "candidate_3",
        "candidate_4",
        "improvements",
    ]


async def test_ranking_needs_a_list_of_at_least_two() -> None:
    with pytest.raises(ValueError, match="at least 2 candidates"):
        await LLMRankingLoss("judge")(["only one"])
    with pytest.raises(TypeError, match="list of candidate outputs"):
        await LLMRankingLoss("judge")("a string")


def test_llm_losses_need_an_alias() -> None:
    with pytest.raises(ValueError, match="non-empty alias"):
        LLMJudge("")
    with pytest.raises(ValueError, match="scale must be a positive number"):
        LLMJudge("judge", scale=0)


# ------------------------------------------------------------------ HumanFeedbackLoss
def scripted_person(*answers: str) -> tuple[Any, list[str], list[str]]:
    """Returns ``(input_fn, questions asked, texts shown)``."""
    pending: Iterator[str] = iter(answers)
    asked: list[str] = []
    shown: list[str] = []

    def input_fn(question: str) -> str:
        asked.append(question)
        try:
            return next(pending)
        except StopIteration:
            raise EOFError from None

    return input_fn, asked, shown


async def test_human_feedback_from_injected_answers() -> None:
    input_fn, asked, shown = scripted_person("Too formal.", "6")
    loss = HumanFeedbackLoss(input_fn=input_fn, output_fn=shown.append)
    feedback = await loss("Dear Sir, ...", "Hi!")
    assert feedback == Feedback(
        "A person reviewing the output said: Too formal.", 0.6, ["Too formal."]
    )
    assert shown == ["Output:\nDear Sir, ...\nTarget:\nHi!"]
    assert asked == [
        "Feedback on this output (empty line: it is fine): ",
        "Score from 0 to 10 (empty: no score): ",
    ]


async def test_human_feedback_asks_again_for_a_bad_score_and_accepts_a_fraction() -> None:
    input_fn, asked, shown = scripted_person("", "lots", "11", "3/5")
    loss = HumanFeedbackLoss(input_fn=input_fn, output_fn=shown.append, scale=5)
    feedback = await loss("fine output")
    assert feedback == Feedback("A person reviewed the output and found it fine.", 0.6)
    assert len(asked) == 4
    assert shown[1:] == ["Please answer a number from 0 to 5, or nothing."] * 2


async def test_human_feedback_without_a_score_question() -> None:
    input_fn, asked, _ = scripted_person("Shorter please.")
    feedback = await HumanFeedbackLoss(
        prompt="What is wrong? ", score_prompt=None, input_fn=input_fn, output_fn=lambda _: None
    )("long output")
    assert feedback == Feedback(
        "A person reviewing the output said: Shorter please.", None, ["Shorter please."]
    )
    assert asked == ["What is wrong? "]


async def test_human_feedback_says_when_input_ends() -> None:
    input_fn, _, _ = scripted_person()
    loss = HumanFeedbackLoss(input_fn=input_fn, output_fn=lambda _: None)
    with pytest.raises(EOFError, match="input ended before feedback was given"):
        await loss("output")


def test_human_feedback_reads_real_stdin() -> None:
    script = (
        "import asyncio, json\n"
        "from plait.optimization import HumanFeedbackLoss\n"
        "feedback = asyncio.run(HumanFeedbackLoss().aforward('The answer is 41.', '42'))\n"
        "print('RESULT ' + json.dumps([feedback.text, feedback.score, feedback.items]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input="Off by one.\n2\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "Output:\nThe answer is 41.\nTarget:\n42" in done.stdout
    text, score, items = json.loads(done.stdout.split("RESULT ")[-1])
    assert text == "A person reviewing the output said: Off by one."
    assert score == 0.2
    assert items == ["Off by one."]


# ------------------------------------------------------------------ CompositeLoss
def fixed(feedback: Feedback) -> VerifierLoss:
    return VerifierLoss(lambda output, target: feedback, name=feedback.text)


async def test_composite_loss_is_the_weighted_mean_of_its_parts() -> None:
    loss = CompositeLoss(
        [
            (VerifierLoss(lambda out, target: out == target, name="exact"), 3),
            (VerifierLoss(lambda out, target: 0.2, name="style"), 1.0),
        ]
    )
    feedback = await loss("42", "42")
    assert feedback.score == pytest.approx((3 * 1.0 + 1 * 0.2) / 4)
    assert feedback.text.splitlines() == [
        "[exact, weight 3] The output passed exact.",
        "[style, weight 1] style scored the output 0.20. Expected: '42'.",
    ]


async def test_composite_loss_merges_items_without_repeats_and_bounded() -> None:
    many = Feedback("many", 0.5, [f"item {i}" for i in range(12)])
    overlapping = Feedback("overlap", 0.5, ["item 0", "item 1"])
    feedback = await CompositeLoss([fixed(many), (fixed(overlapping), 2)])("out")
    assert feedback.items == [f"item {i}" for i in range(8)]


async def test_composite_loss_leaves_unscored_parts_out_of_the_mean() -> None:
    feedback = await CompositeLoss(
        [(fixed(Feedback("no score")), 5), (fixed(Feedback("half", 0.5)), 1)]
    )("out")
    assert feedback.score == 0.5
    unscored = await CompositeLoss([fixed(Feedback("no score"))])("out")
    assert unscored.score is None


async def test_composite_loss_wraps_plain_checks_and_refuses_bad_weights() -> None:
    feedback = await CompositeLoss([lambda out, target: True])("out")
    assert feedback.score == 1.0
    with pytest.raises(ValueError, match="entry 0: weight must be > 0"):
        CompositeLoss([(VerifierLoss(bool), 0)])
    with pytest.raises(ValueError, match="at least one"):
        CompositeLoss([])


async def test_composite_loss_runs_llm_judges_concurrently_and_skips_unusable_ones(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    def responder(body: dict[str, Any]) -> str:
        if "Polite." in body["messages"][-1]["content"]:
            return json.dumps({"critique": "Rude.", "score": 2, "improvements": ["Say please."]})
        return "no JSON from this judge"

    server.responder = responder
    server.latency = 0.2
    loss = CompositeLoss(
        [
            (LLMJudge("judge", criteria="Polite."), 1),
            (LLMJudge("judge", criteria="Funny."), 1),
            (VerifierLoss(lambda out, target: True, name="non-empty"), 1),
        ]
    ).bind(manager)
    feedback = await loss("Give it to me.")
    assert feedback.score == pytest.approx((0.2 + 1.0) / 2)
    assert feedback.items == ["Say please."]
    assert "[LLMJudge, weight 1] no verdict: the judge's reply was unusable" in feedback.text
    assert server.stats.peak_concurrency == 2  # both judges asked at once


async def test_composite_loss_in_a_training_step_teaches_the_program(
    manager: ResourceManager,
) -> None:
    program = Answerer()
    loss = CompositeLoss(
        [
            (VerifierLoss(lambda out, target: target in out, name="contains"), 2),
            (VerifierLoss(lambda out, target: "too long" if len(out) > 5 else ""), 1),
        ]
    )
    step = TrainingStep(program, loss).bind(manager).train()
    value = await step("question", target="4")
    assert value.payload.score == 0.0
    await value.backward()
    (item,) = program.llm.system_prompt.get_accumulated_feedback()
    assert "[contains, weight 2] The output failed contains." in item
    assert "too long" in item


# ------------------------------------------------------------------ VerifierLoss
@pytest.mark.parametrize(
    ("verdict", "score", "text"),
    [
        (True, 1.0, "The output passed check."),
        (False, 0.0, "The output failed check. Expected: 'b'. Got: 'a'."),
        (0.25, 0.25, "check scored the output 0.25. Expected: 'b'."),
        (7, 1.0, "check scored the output 1.00. Expected: 'b'."),
        ("", 1.0, "The output passed check."),
        ("wrong unit", 0.0, "check: wrong unit Expected: 'b'. Got: 'a'."),
    ],
)
def test_verifier_loss_verdict_types(verdict: Any, score: float, text: str) -> None:
    def check(output: Any, target: Any) -> Any:
        return verdict

    feedback = VerifierLoss(check)("a", "b")
    assert (feedback.score, feedback.text) == (score, text)


def test_verifier_loss_passes_a_feedback_through() -> None:
    given = Feedback("custom", 0.3, ["do this"])
    assert VerifierLoss(lambda out, target: given)("a") is given


async def test_llm_losses_run_concurrently_over_a_batch(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = replying({"critique": "ok", "score": 5, "improvements": []})
    server.latency = 0.2
    judge = LLMJudge("judge").bind(manager)
    results = await asyncio.gather(*(judge(f"answer {i}") for i in range(3)))
    assert [r.score for r in results] == [0.5] * 3
    assert server.stats.peak_concurrency == 3


# ------------------------------------------------------------------ the embedded model
@pytest.mark.slow
async def test_every_llm_loss_gets_a_usable_verdict_from_the_embedded_model() -> None:
    """A 135M model follows no meta-format, but the JSON schema constrains its reply."""
    config = ResourceConfig({"*": {"provider": "local", "n_ctx": 4096}})
    settings = {"max_tokens": 200}
    async with ResourceManager(config) as manager:
        judge = LLMJudge("judge", criteria="States the capital of France.", **settings)
        rubric = LLMRubricLoss(
            "judge", {"correct": "Names Paris.", "short": "One line."}, **settings
        )
        preference = LLMPreferenceLoss("judge", **settings)
        ranking = LLMRankingLoss("judge", **settings)
        answer = "The capital of France is Paris."
        verdicts = [
            await judge.bind(manager)(answer, "Paris"),
            await rubric.bind(manager)(answer),
            await preference.bind(manager)(answer, "Lyon"),
            (await ranking.bind(manager)([[answer, "Lyon", "I do not know."]]))[0],
        ]
    for verdict in verdicts[:3]:
        assert verdict.score is not None and 0.0 <= verdict.score <= 1.0, verdict
    assert sorted(verdicts[3].ranking) == [0, 1, 2]
