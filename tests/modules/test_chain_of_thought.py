"""ChainOfThought: a reasoning field before the outputs, on the wire and in the Prediction."""

import json
from typing import Annotated

import pytest
from pydantic import Field

from plait import (
    ChainOfThought,
    InputField,
    OutputField,
    ResourceConfig,
    ResourceManager,
    Signature,
    run,
)
from plait.signatures import ChatAdapter

from .scripted import bodies, scripted


class Count(Signature):
    """Count the items."""

    items: str = InputField()
    count: int = OutputField()


async def test_reasoning_comes_first_and_is_returned():
    reply = json.dumps({"reasoning": "a, b and c are three", "count": 3})
    async with scripted(lambda body: reply) as (server, manager):
        cot = ChainOfThought(Count)
        pred = await run(cot, items="a, b, c", resources=manager)

    assert (pred.reasoning, pred.count) == ("a, b and c are three", 3)
    assert list(pred) == ["reasoning", "count"]
    body = bodies(server)[0]
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["reasoning", "count"]
    system = body["messages"][0]["content"]
    assert system.startswith("Count the items.\n\n")
    assert "- reasoning (str): Think step by step" in system
    assert system.index("- reasoning") < system.index("- count")


def test_the_original_signature_is_unchanged():
    cot = ChainOfThought(Count)
    assert list(Count.output_fields) == ["count"]
    assert cot.original_signature is Count
    assert list(cot.signature.output_fields) == ["reasoning", "count"]
    assert cot.instructions.value == Count.instructions


def test_reasoning_description_type_and_predict_options():
    cot = ChainOfThought(
        "question -> answer", reasoning="Explain in one line.", reasoning_type=list[str],
        alias="smart", temperature=0.3, adapter=ChatAdapter(),
    )  # fmt: skip
    spec = cot.signature.output_fields["reasoning"]
    assert (spec.description, spec.annotation) == ("Explain in one line.", list[str])
    assert (cot.alias, cot.temperature, type(cot.adapter)) == ("smart", 0.3, ChatAdapter)


def test_a_signature_that_already_reasons_is_refused():
    with pytest.raises(ValueError, match="already has one"):
        ChainOfThought("question -> reasoning, answer")


async def test_the_chat_adapter_asks_for_the_reasoning_section_first():
    reply = "[[ ## reasoning ## ]]\nTwo items.\n[[ ## count ## ]]\n2\n[[ ## completed ## ]]"
    async with scripted(lambda body: reply) as (server, manager):
        pred = await run(
            ChainOfThought(Count, adapter=ChatAdapter()), items="x, y", resources=manager
        )
    assert (pred.reasoning, pred.count) == ("Two items.", 2)
    user = bodies(server)[0]["messages"][-1]["content"]
    assert user.endswith(
        "Respond with [[ ## reasoning ## ]], [[ ## count ## ]], then [[ ## completed ## ]]."
    )


@pytest.mark.slow
async def test_chain_of_thought_on_the_local_model():
    pytest.importorskip("llama_cpp")
    short = Annotated[str, Field(max_length=100)]  # keeps the reasoning within max_tokens
    async with ResourceManager(ResourceConfig({"llm": {"provider": "local"}})) as manager:
        cot = ChainOfThought(
            "question -> answer: int", reasoning_type=short, max_tokens=64, temperature=0.0
        ).bind(manager)
        pred = await cot(question="What is 12 + 30?")

    assert isinstance(pred.reasoning, str) and 0 < len(pred.reasoning) <= 100
    assert isinstance(pred.answer, int)
    assert json.loads(pred.raw).keys() == {"reasoning", "answer"}
