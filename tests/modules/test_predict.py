"""Predict against the scripted server: the wire, typed outputs, re-asks, parameters."""

import asyncio
import json
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from plait import (
    History,
    InputField,
    Module,
    OutputField,
    Predict,
    Prediction,
    ResourceConfig,
    ResourceManager,
    Signature,
    run,
)
from plait.backends.types import Message
from plait.errors import PlaitError, StructuredOutputError
from plait.signatures import ChatAdapter
from plait.testing._replies import count_words

from .scripted import bodies, last_user, scripted


class Address(BaseModel):
    city: str
    country: str


class Profile(Signature):
    """Extract a profile from the text."""

    text: str = InputField(description="A short biography")
    age: int = OutputField()
    height: float = OutputField(description="In metres")
    role: Literal["engineer", "artist"] = OutputField()
    skills: list[str] = OutputField()
    address: Address = OutputField()


PROFILE_REPLY = {
    "age": 36,
    "height": 1.7,
    "role": "engineer",
    "skills": ["math", "poetry"],
    "address": {"city": "London", "country": "UK"},
}


class QA(Signature):
    """Answer the question."""

    question: str = InputField()
    answer: str = OutputField()


def replying(*texts: str):
    """A responder that answers with ``texts`` in order (the last one repeats)."""
    queue = list(texts)

    def responder(body: dict[str, Any]) -> str:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return responder


def schema_reply(body: dict[str, Any]) -> str:
    """A responder that fills the requested schema: "x" strings, 1 ints, first enum values."""
    schema = body["response_format"]["json_schema"]["schema"]

    def value(prop: dict[str, Any]) -> Any:
        if "enum" in prop:
            return prop["enum"][0]
        return {"string": "x", "integer": 1, "number": 0.5, "boolean": True}.get(
            prop.get("type"), ["x"] if prop.get("type") == "array" else None
        )

    return json.dumps({name: value(prop) for name, prop in schema["properties"].items()})


# ---------------------------------------------------------------- the wire
async def test_the_request_carries_schema_instructions_and_inputs():
    async with scripted(replying(json.dumps(PROFILE_REPLY))) as (server, manager):
        predict = Predict(Profile, temperature=0.1, max_tokens=50)
        await run(predict, text="Ada, 36, engineer in London.", resources=manager)

    (body,) = bodies(server)
    system, user = body["messages"]
    assert system["role"] == "system" and system["content"].startswith(
        "Extract a profile from the text.\n\nInput fields:\n- text (str): A short biography"
    )
    assert "- role (one of: engineer, artist)" in system["content"]
    assert user == {"role": "user", "content": "text: Ada, 36, engineer in London."}
    assert (body["temperature"], body["max_tokens"]) == (0.1, 50)
    schema = body["response_format"]["json_schema"]
    assert schema["name"] == "ProfileOutput"
    assert schema["schema"]["required"] == ["age", "height", "role", "skills", "address"]


async def test_typed_outputs_are_parsed():
    async with scripted(replying(json.dumps(PROFILE_REPLY))) as (_, manager):
        pred = await run(Predict(Profile), text="Ada", resources=manager)

    assert isinstance(pred, Prediction)
    assert (pred.age, pred.height, pred.role, pred.skills) == (
        36,
        1.7,
        "engineer",
        ["math", "poetry"],
    )
    assert pred.address == Address(city="London", country="UK")
    assert pred.raw == json.dumps(PROFILE_REPLY)
    assert [m.role for m in pred.messages] == ["system", "user"]
    assert pred.usage.output_tokens == count_words(json.dumps(PROFILE_REPLY))


async def test_a_string_signature_and_a_positional_input_work():
    async with scripted(replying('{"answer": 4}')) as (server, manager):
        predict = Predict("question -> answer: int").bind(manager)
        pred = await predict("What is 2 + 2?")
    assert pred.answer == 4
    assert last_user(bodies(server)[0]) == "question: What is 2 + 2?"


async def test_a_dict_positional_input_carries_every_field_so_batches_work():
    async with scripted(schema_reply) as (server, manager):
        predict = Predict("context, question -> answer").bind(manager)
        preds = await predict(
            [{"context": "c1", "question": "q1"}, {"context": "c2", "question": "q2"}]
        )
    assert [p.answer for p in preds] == ["x", "x"]
    assert sorted(last_user(b) for b in bodies(server)) == [
        "context: c1\nquestion: q1",
        "context: c2\nquestion: q2",
    ]


async def test_a_dict_of_the_only_input_by_name_is_that_input_not_its_value():
    # A dataset of ({"question": ...}, target) pairs, as a DSPy port writes it, must ask the
    # question, not send the dict as the question's text.
    async with scripted(replying('{"answer": 4}')) as (server, manager):
        predict = Predict("question -> answer: int").bind(manager)
        preds = await predict([{"question": "What is 2 + 2?"}, "What is 1 + 3?"])
    assert [p.answer for p in preds] == [4, 4]
    assert sorted(last_user(b) for b in bodies(server)) == [
        "question: What is 1 + 3?",
        "question: What is 2 + 2?",
    ]


# ----------------------------------------------------------------- re-asks
async def test_a_bad_reply_is_reasked_once_with_the_error():
    good = json.dumps(PROFILE_REPLY)
    bad = json.dumps({**PROFILE_REPLY, "age": "thirty-six"})
    async with scripted(replying(bad, good)) as (server, manager):
        predict = Predict(Profile)
        pred = await run(predict, text="Ada", resources=manager)

    assert server.stats.requests == 2
    assert pred.age == 36
    retry = bodies(server)[1]["messages"]
    assert retry[-2] == {"role": "assistant", "content": bad}
    assert retry[-1]["role"] == "user"
    assert "field `age`: Input should be a valid integer" in retry[-1]["content"]
    assert "thirty-six" in retry[-1]["content"]
    assert pred.usage.output_tokens == count_words(bad) + count_words(good)
    assert [t.error is None for t in predict.traces()] == [False, True]


async def test_two_bad_replies_raise_a_structured_output_error_naming_the_field():
    bad = json.dumps({**PROFILE_REPLY, "role": "pilot"})
    async with scripted(replying(bad)) as (server, manager):
        predict = Predict(Profile)
        with pytest.raises(StructuredOutputError) as info:
            await run(predict, text="Ada", resources=manager)

    assert server.stats.requests == 2
    cause = info.value
    assert isinstance(cause, StructuredOutputError)
    assert "still invalid after one re-ask" in str(cause)
    assert "field `role`: Input should be 'engineer' or 'artist'" in str(cause)
    assert cause.raw == bad and cause.target == "Profile"
    assert "field `role`" in str(info.value)


async def test_the_chat_adapter_sends_no_schema_and_reads_markers():
    reply = "[[ ## answer ## ]]\nParis\n\n[[ ## completed ## ]]"
    async with scripted(replying(reply)) as (server, manager):
        pred = await run(Predict(QA, adapter=ChatAdapter()), question="Capital?", resources=manager)
    assert pred.answer == "Paris"
    body = bodies(server)[0]
    assert "response_format" not in body
    assert last_user(body).startswith("[[ ## question ## ]]\nCapital?")


# ---------------------------------------------------------- learnable state
async def test_learned_instructions_change_the_next_request():
    async with scripted(schema_reply) as (server, manager):
        predict = Predict(QA).bind(manager)
        await predict(question="q")
        predict.instructions.value = "Answer in French."
        await predict(question="q")

    first, second = (b["messages"][0]["content"] for b in bodies(server))
    assert first.startswith("Answer the question.\n\n")
    assert second.startswith("Answer in French.\n\n")
    assert predict.signature is QA and QA.instructions == "Answer the question."
    assert predict.current_signature().instructions == "Answer in French."


async def test_demos_appear_in_the_request_and_are_learnable():
    demo = {"question": "2 + 2?", "answer": "4"}
    async with scripted(schema_reply) as (server, manager):
        predict = Predict(QA, demos=[demo]).bind(manager)
        await predict(question="3 + 3?")
        predict.demos.value = []
        await predict(question="3 + 3?")

    with_demo, without = (b["messages"] for b in bodies(server))
    assert with_demo[1:] == [
        {"role": "user", "content": "question: 2 + 2?"},
        {"role": "assistant", "content": '{"answer": "4"}'},
        {"role": "user", "content": "question: 3 + 3?"},
    ]
    assert [m["role"] for m in without] == ["system", "user"]


def test_parameters_are_registered_with_descriptions():
    predict = Predict(QA, demos=[{"question": "q", "answer": "a"}])
    params = dict(predict.named_parameters())
    assert set(params) == {"instructions", "demos"}
    assert params["instructions"].value == QA.instructions
    assert "question -> answer" in params["instructions"].description
    assert predict.state_dict() == {
        "instructions": "Answer the question.",
        "demos": [{"question": "q", "answer": "a"}],
    }


def test_bad_demos_are_refused_with_the_key():
    with pytest.raises(ValueError, match=r"demos\[0\] has key\(s\) 'qestion'"):
        Predict(QA, demos=[{"qestion": "q"}])
    with pytest.raises(ValueError, match="must be a list of dicts"):
        Predict(QA, demos={"question": "q"})  # type: ignore[arg-type]


# ------------------------------------------------------------------ history
async def test_history_turns_are_sent_and_a_history_object_grows():
    async with scripted(replying('{"answer": "Ada"}', '{"answer": "You said Ada"}')) as (
        server,
        manager,
    ):
        predict = Predict(QA).bind(manager)
        history = History("You are terse.")
        await predict(question="My name is Ada. Name?", history=history)
        await predict(question="What did I say?", history=history)
        await predict(
            question="Plain list?", history=[Message("user", "u"), Message("assistant", "a")]
        )

    first, second, third = (b["messages"] for b in bodies(server))
    assert first[0]["content"].startswith("You are terse.\n\nAnswer the question.")
    assert second[1:] == [
        {"role": "user", "content": "question: My name is Ada. Name?"},
        {"role": "assistant", "content": '{"answer": "Ada"}'},
        {"role": "user", "content": "question: What did I say?"},
    ]
    assert len(history) == 4
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user"]


# ------------------------------------------------------------------ errors
async def test_input_mistakes_name_the_fields():
    predict = Predict("context, question -> answer")
    async with scripted(schema_reply) as (server, manager):
        predict.bind(manager)
        with pytest.raises(
            TypeError, match="missing input\\(s\\): question; unknown input\\(s\\): questoin"
        ):
            predict(context="c", questoin="x")
        with pytest.raises(TypeError, match="takes its inputs by keyword \\(context, question\\)"):
            predict("a", "b")
        with pytest.raises(TypeError, match="missing input\\(s\\): question"):
            await run(predict, context="c", resources=manager)
    assert server.stats.requests == 0


def test_a_call_without_resources_says_how_to_bind():
    with pytest.raises(PlaitError, match="has no resources: bind them"):
        Predict(QA)(question="q")


def test_construction_errors():
    with pytest.raises(ValueError, match="non-empty alias"):
        Predict(QA, alias="")
    with pytest.raises(TypeError, match="adapter must have format"):
        Predict(QA, adapter=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a signature with an output field"):
        Predict(QA.without("answer"))


def test_repr_names_signature_and_alias():
    assert (
        repr(Predict(QA, alias="fast")) == "Predict(QA(question: str -> answer: str), alias='fast')"
    )


# --------------------------------------------------------- in a composite
class Panel(Module):
    """Three independent Predict steps over the same text, then a plain dict."""

    def __init__(self) -> None:
        super().__init__()
        self.summary = Predict("text -> summary")
        self.mood = Predict("text -> mood: Literal['calm', 'angry']")
        self.topics = Predict("text -> topics: list[str]")

    def forward(self, text: str) -> dict[str, Any]:
        return {
            "summary": self.summary(text=text).summary,
            "mood": self.mood(text=text).mood,
            "topics": self.topics(text=text)["topics"],
        }


async def test_predict_nodes_of_a_traced_composite_run_concurrently():
    async with scripted(schema_reply, latency=0.2) as (server, manager):
        out = await run(Panel(), "A quiet morning.", resources=manager)

    assert out == {"summary": "x", "mood": "calm", "topics": ["x"]}
    assert server.stats.peak_concurrency == 3
    log = server.stats.log
    assert max(r.arrived for r in log) < min(r.finished for r in log)  # all three overlapped


async def test_predict_called_inside_an_async_module_uses_the_same_resources():
    class TwoSteps(Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = Predict("text -> summary")
            self.second = Predict("summary -> title")

        async def forward(self, text: str) -> str:
            summary = (await self.first(text=text)).summary
            return (await self.second(summary=summary)).title

    async with scripted(schema_reply) as (server, manager):
        program = TwoSteps()
        title = await run(program, "text", resources=manager)
    assert title == "x"
    assert [t.module for t in program.traces()] == ["first", "second"]
    assert server.stats.requests == 2


async def test_concurrent_calls_of_one_predict_are_independent():
    async with scripted(lambda body: json.dumps({"answer": last_user(body)}), latency=0.05) as (
        _,
        manager,
    ):
        predict = Predict(QA).bind(manager)
        preds = await asyncio.gather(*(predict(question=f"q{i}") for i in range(5)))
    assert [p.answer for p in preds] == [f"question: q{i}" for i in range(5)]


# ------------------------------------------------------- the embedded model
ShortText = Annotated[str, Field(max_length=24)]


class Place(BaseModel):
    city: ShortText
    country: ShortText


class Locate(Signature):
    """Say where the landmark is."""

    landmark: str = InputField()
    place: Place = OutputField()
    tags: Annotated[list[Literal["old", "tall", "famous"]], Field(max_length=2)] = OutputField()


class Review(Signature):
    """Classify the review."""

    review: str = InputField()
    sentiment: Literal["positive", "negative"] = OutputField()
    stars: int = OutputField(description="1 to 5")


@pytest.mark.slow
async def test_typed_outputs_on_the_local_model():
    # Schema-constrained decoding (a llama.cpp grammar) makes even a 135M model
    # answer in shape; the asserts are about types, never about wording.
    pytest.importorskip("llama_cpp")
    async with ResourceManager(ResourceConfig({"llm": {"provider": "local"}})) as manager:
        review = Predict(Review, max_tokens=48, temperature=0.0).bind(manager)
        locate = Predict(Locate, max_tokens=64, temperature=0.0).bind(manager)
        rated = await review(review="Loved it. Best purchase this year.")
        located = await locate(landmark="The Eiffel Tower")

    assert rated.sentiment in ("positive", "negative") and isinstance(rated.stars, int)
    assert isinstance(located.place, Place) and 0 < len(located.place.city) <= 24
    assert set(located.tags) <= {"old", "tall", "famous"} and len(located.tags) <= 2
    for record in (*review.traces(), *locate.traces()):
        assert record.output_tokens > 0 and record.latency > 0
    Locate.output_model().model_validate_json(located.raw)  # the reply itself fits the schema


async def test_a_checkpointed_batch_resumes_with_predictions(tmp_path):
    async with scripted(schema_reply) as (server, manager):
        predict = Predict("question -> answer, count: int").bind(manager)
        first = await predict(["a", "b"], checkpoint_dir=tmp_path)
        again = await predict(["a", "b"], checkpoint_dir=tmp_path)
    assert server.stats.requests == 2  # the second run read the checkpoint
    assert all(isinstance(p, Prediction) for p in again)
    assert (
        [p.to_dict() for p in again]
        == [p.to_dict() for p in first]
        == [{"answer": "x", "count": 1}] * 2
    )


def test_demos_are_kept_as_json_data():
    demo = {"text": "Ada", **PROFILE_REPLY, "address": Address(city="London", country="UK")}
    predict = Predict(Profile, demos=[Prediction(demo)])
    assert predict.demos.value == [{"text": "Ada", **PROFILE_REPLY}]
    json.dumps(predict.state_dict())
