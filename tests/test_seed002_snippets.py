"""Seed 002 (dsprrr, an R package): its snippets, translated to the obvious Python, run on plait.

R's ``mod$get_traces()`` is ``mod.get_traces()``, ``list(...)`` a dict,
``function(input, output)`` a lambda, ``TRUE`` True. The LLM is the scripted
server (dsprrr's ``.llm = chat_openai()`` becomes resources bound to the module).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest

from modules.scripted import bodies, scripted
from plait import (
    BestOfN,
    Predict,
    Prediction,
    Refine,
    evaluate,
    get_traces,
    metric_contains,
    metric_exact_match,
    metric_f1,
    metric_field_match,
    signature,
)
from plait.adapter import ChatAdapter


def answers(*texts: str | None, field: str = "answer") -> Any:
    """A responder answering ``{field: <next text>}`` to each request in turn."""
    queue = iter(texts)
    return lambda body: json.dumps({field: next(queue)})


# ------------------------------------------------------------------- signatures
def test_signatures_are_immutable_snippet() -> None:
    sig = signature("question -> answer")
    with pytest.raises(AttributeError, match="immutable"):
        sig.inputs = []  # This would error - signatures are immutable


def test_type_system_snippet() -> None:
    # Simple string output
    summary = signature("text -> summary: string")
    assert summary.output_fields["summary"].annotation is str
    # Classification with fixed options
    sentiment = signature("text -> sentiment: enum('positive', 'negative', 'neutral')")
    assert (
        sentiment.output_fields["sentiment"].annotation
        == Literal["positive", "negative", "neutral"]
    )
    # The string notation, with the other type words
    typed = signature("context, question -> answer: string, n: integer, p: number, ok: boolean")
    assert list(typed.input_fields) == ["context", "question"]
    assert [f.annotation for f in typed.output_fields.values()] == [str, int, float, bool]


def test_modules_share_one_signature_snippet() -> None:
    sig = signature("question -> answer")
    mod1 = Predict(sig)  # module(sig, type = "predict")
    mod2 = Predict(sig)
    assert mod1.signature is mod2.signature  # identical(mod1$signature, mod2$signature)

    fast_classifier = Predict(signature("text -> sentiment: enum('positive', 'negative')"))
    fast_classifier.temperature = 0  # fast_classifier$config$temperature <- 0
    assert fast_classifier.temperature == 0


# ---------------------------------------------------------------------- wrappers
async def test_best_of_n_snippet() -> None:
    async with scripted(answers("a long answer", "short", "a longer answer still")) as (
        _server,
        manager,
    ):
        mod = Predict("question -> answer")
        best_mod = BestOfN(
            base_module=mod,
            N=3,  # dsprrr's `n = 3`; plait's own n=3 works too
            reward_fn=lambda input, output: float(len(output.answer)),  # Return numeric score
        )
        result = await best_mod.bind(manager)(question="Why is the sky blue?")
    assert result.answer == "a longer answer still"


async def test_best_of_n_without_a_reward_keeps_a_valid_attempt() -> None:
    # Two replies leave the answer out (null); whichever attempt gets the third one wins.
    async with scripted(answers(None, None, "ok")) as (_server, manager):
        best = BestOfN(Predict("question -> answer: Optional[str]"), n=3)  # no reward_fn
        result = await best.bind(manager)(question="q?")
    assert isinstance(result, Prediction) and result.answer == "ok"
    assert best.threshold == 1.0


async def test_refine_snippet() -> None:
    # A null answer is a valid reply with a missing field: it scores 0, so it is refined.
    async with scripted(answers(None, "Tides follow the moon.")) as (server, manager):
        mod = Predict("question -> answer: Optional[str]")
        refine_mod = Refine(
            base_module=mod,
            max_iterations=3,
            refinement_prompt="Improve this response: {previous_output}",
        )
        result = await refine_mod.bind(manager)(question="Explain tides.")
    assert result.answer == "Tides follow the moon."
    second = bodies(server)[1]["messages"]
    assert second[-2] == {"role": "user", "content": 'Improve this response: {"answer":null}'}


async def test_best_of_n_over_refine_snippet() -> None:
    # BestOfN over Refine: 3 parallel refinement chains, pick best
    async with scripted(answers("one", "two", "three")) as (server, manager):
        simple_mod = Predict("question -> answer")
        robust_mod = BestOfN(base_module=Refine(base_module=simple_mod), N=3)
        result = await robust_mod.bind(manager)(question="q?")
    assert result.answer in {"one", "two", "three"}
    assert server.stats.requests == 3


# ------------------------------------------------------------------------ traces
async def test_get_traces_snippet() -> None:
    async with scripted(answers("4", "5")) as (_server, manager):
        mod = Predict("question -> answer").bind(manager)
        await mod(question="What is 2+2?")
        await mod(question="What is 2+3?")
    traces = mod.get_traces()  # mod$get_traces()
    assert len(traces) == 2 and traces == get_traces(mod)
    first = traces[0]
    assert first.inputs == {"question": "What is 2+2?"} and first.output == {"answer": "4"}
    assert first.latency >= 0 and first.input_tokens > 0 and first.output_tokens > 0


# ----------------------------------------------------------------------- metrics
def test_metric_exact_match_snippet() -> None:
    metric = metric_exact_match()
    assert metric("hello", "hello") is True
    assert metric("hello", "world") is False
    # A one-field prediction is compared by its field, as plait.evaluation.exact_match does.
    assert metric(Prediction(sentiment="positive"), "positive") is True
    metric = metric_exact_match(field="sentiment")  # Field extraction for structured outputs
    assert metric({"sentiment": "positive"}, {"sentiment": "positive"}) is True
    row = {"text": "Great!", "sentiment": "positive"}  # the whole data row as the target
    assert metric(Prediction(sentiment="positive"), row) is True
    assert metric(Prediction(sentiment="negative"), row) is False
    metric = metric_exact_match(ignore_case=True)  # Case insensitive matching
    assert metric("Hello", "hello") is True
    assert metric_exact_match(ignore_case=True)("Paris ", "paris") is True
    with pytest.raises(KeyError, match="no field 'sentiment'; its fields: answer"):
        metric_exact_match(field="sentiment")({"answer": "x"}, "x")


def test_metric_contains_and_friends_snippet() -> None:
    metric = metric_contains("positive", ignore_case=True)  # Check for substring
    assert metric("The result is POSITIVE", None) is True
    metric = metric_contains(r"\d+", fixed=False)  # Regex pattern
    assert metric("The answer is 42", None) is True
    assert metric_f1()("the quick brown fox", "the fast brown fox") == pytest.approx(0.75)
    both = metric_field_match(["sentiment", "confidence"])
    assert both(
        {"sentiment": "positive", "confidence": 0.9}, {"sentiment": "positive", "confidence": 0.9}
    )


async def test_metrics_plug_into_evaluate() -> None:
    async with scripted(answers("Paris", "Rome")) as (_server, manager):
        mod = Predict("question -> answer").bind(manager)
        data = [
            ({"question": "Capital of France?"}, {"answer": "paris"}),
            ({"question": "Capital of Spain?"}, {"answer": "madrid"}),
        ]
        score = await evaluate(
            mod, data, metric_exact_match(field="answer", ignore_case=True), max_concurrent=1
        )
    assert score == 0.5


async def test_run_dataset_snippet() -> None:
    from plait.evaluation import run_dataset

    async with scripted(answers("positive", "negative", field="sentiment")) as (_, manager):
        # signature("text -> sentiment") |> module(type = "predict") |> run_dataset(data)
        mod = Predict(signature("text -> sentiment")).bind(manager)
        data = [{"text": "I love this!"}, {"text": "This is bad"}]
        results = await run_dataset(mod, data, max_concurrent=1)
    outputs = results.outputs
    assert [o.sentiment for o in outputs] == ["positive", "negative"]


# ------------------------------------------------------------------ optimization
def sentiment_at_temperature_zero(body: dict[str, Any]) -> str:
    """Right (a review with "love" is positive) only at temperature 0; else always negative."""
    review = body["messages"][-1]["content"]
    right = "positive" if "love" in review else "negative"
    return json.dumps({"sentiment": right if body.get("temperature") == 0 else "negative"})


SENTIMENTS = [
    ({"text": f"I love it ({i})"}, "positive") if i % 2 else ({"text": f"Bad ({i})"}, "negative")
    for i in range(10)
]


async def test_optimize_grid_snippet() -> None:
    async with scripted(sentiment_at_temperature_zero) as (_server, manager):
        mod = Predict(signature("text -> sentiment")).bind(manager)
        # mod$optimize_grid(devset = train_data, metric = metric_exact_match(),
        #                   parameters = list(temperature = c(0, 0.3, 0.7)))
        report = await mod.optimize_grid(
            devset=SENTIMENTS,
            metric=metric_exact_match(),
            parameters={"temperature": [0, 0.3, 0.7]},
        )
    assert mod.temperature == 0 and mod.is_compiled()
    assert len(mod.state.trials) == 4  # "Records all trials in state$trials"
    assert mod.state.best_params == {"temperature": 0} and report.best.score == 1.0
    # mod$state$best_score, best_trial; trials as a table
    assert mod.state.best_score == 1.0 and mod.state.best_trial == report.best.number
    assert len(mod.state.trials_table()) == 4
    # mod$state$optimization_history: the trials are the history, each naming its optimizer
    assert {t["optimizer"] for t in mod.state.trials} == {mod.state.optimizer} != {None}


async def test_optimize_grid_short_form_and_is_compiled_snippet() -> None:
    async with scripted(sentiment_at_temperature_zero) as (_server, manager):
        mod = Predict(signature("text -> sentiment")).bind(manager)
        assert mod.is_compiled() is False  # mod$is_compiled() #> [1] FALSE
        await mod.optimize_grid(SENTIMENTS, metric_exact_match())  # no parameters
        assert mod.is_compiled() is True  # #> [1] TRUE
    assert mod.temperature == 0.0


def test_predict_template_snippet() -> None:
    # dsprrr's PredictModule has a glue `template`; plait builds the prompt from the
    # signature through its adapter (docs/how-to/porting.md says why), so template= is refused.
    with pytest.raises(TypeError, match="template"):
        Predict("question -> answer", template="Q: {question}")  # type: ignore[call-arg]
    assert isinstance(Predict("question -> answer", adapter=ChatAdapter()).adapter, ChatAdapter)
