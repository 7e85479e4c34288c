"""Seeds 000 and 001 (plait's own design): modules, values, parameter refs, records, run on plait.

Programs are the seed's (``seed_programs``); LLM calls go to the scripted
OpenAI-compatible server over loopback. Where the seed writes
``ResourceConfig({... "provider": "openai" ...})`` the test binds the
scripted server's endpoint instead.
"""

from __future__ import annotations

import copy
import pickle
import typing
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

import pytest

import plait.functional as F
import seed_programs
from plait import (
    LLMInference,
    Module,
    Parameter,
    ParameterList,
    ResourceConfig,
    Value,
    ValueKind,
    run,
    valueify,
)
from plait.execution import ExecutionSettings
from plait.execution.tape import Tape
from plait.porting import get_execution_settings, get_trace_context
from plait.testing import ScriptedServer, server_in_thread
from plait.tracing import Tracer


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as running:
        yield running


def config_for(server: ScriptedServer) -> ResourceConfig:
    return ResourceConfig({"*": server.endpoint(max_retries=0)})


class AssistantGeneration(Module):
    """Seed 000's parameterized module (its optimizer LLM left out)."""

    def __init__(self, assistant_instructions: str, temperature: float = 1.0) -> None:
        super().__init__()
        self.assistant_instructions = Parameter(
            assistant_instructions,
            description="Defines the assistant's core behavior and tone.",
        )
        self.llm = LLMInference(alias="assistant_llm", temperature=temperature)

    def forward(self, request: str) -> str:
        full_prompt = f"{self.assistant_instructions}\n\nUser: {request}"
        return self.llm(full_prompt)


class Outer(Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = AssistantGeneration("Be kind.")
        self.prompts = ParameterList(
            [Parameter("one", description="First prompt."), Parameter("two", description="2nd.")]
        )

    def forward(self, request: str) -> str:
        return self.inner(request)


# ------------------------------------------------------------ parameter refs
def test_parameter_refs_are_dotted_paths_outside_a_trace_too() -> None:
    program = Outer()
    # valueify(param) -> Value(..., ref="param:module.path.name")
    assert valueify(program.inner.assistant_instructions).ref == (
        "param:inner.assistant_instructions"
    )
    assert valueify(program.prompts[0]).ref == "param:prompts.0"
    lifted = valueify(program.inner.assistant_instructions)
    assert lifted.meta == {
        "param_name": "inner.assistant_instructions",
        "param_id": id(program.inner.assistant_instructions),
    }
    assert {name for name, _ in program.named_parameters()} == {
        "inner.assistant_instructions",
        "prompts.0",
        "prompts.1",
    }
    del program.prompts[0]  # re-numbered: the old "1" is now "0"
    assert valueify(program.prompts[0]).ref == "param:prompts.0"


def test_paths_survive_deep_copies_and_pickles_and_follow_moves() -> None:
    program = Outer()
    for clone in (program.copy(), copy.deepcopy(program), pickle.loads(pickle.dumps(program))):
        assert clone.inner.assistant_instructions.path == "inner.assistant_instructions"
        assert clone.prompts[1].path == "prompts.1"
    alone = program.inner.copy()  # a copied child is a root of its own
    assert alone.assistant_instructions.path == "assistant_instructions"
    shallow = program.copy(deep=False)  # shares its children, which stay the original's
    assert shallow.inner is program.inner
    assert program.inner.assistant_instructions.path == "inner.assistant_instructions"

    other = Module()
    other.stage = program.inner  # the same module under a second parent: the newest link
    assert program.inner.assistant_instructions.path == "stage.assistant_instructions"
    loose = Parameter("x", description="Unregistered.")
    assert loose.path == "<unnamed>" and valueify(loose).ref == "param:<unnamed>"


def test_inside_a_trace_refs_stay_relative_to_the_traced_program() -> None:
    program = Outer()
    graph = Tracer().trace(program, "hi")
    assert graph.nodes["inner.llm"].parameters == ("param:inner.assistant_instructions",)
    graph = Tracer().trace(program.inner, "hi")
    assert graph.nodes["llm"].parameters == ("param:assistant_instructions",)


# --------------------------------------------------------------- run(record=)
async def test_run_with_record_returns_the_outputs_and_the_forward_record(
    server: ScriptedServer,
) -> None:
    program = seed_programs.SummarizeAndAnalyze()
    assert program.training is False
    output, record = await run(program, "A long text.", resources=config_for(server), record=True)
    assert isinstance(record, Tape) and program.training is False
    assert output.payload == "echo: echo: A long text."
    assert output.meta["_tape_ids"] == [record.id]
    assert set(record.graph.nodes) == {"input:text", "summarizer", "analyzer"}
    assert record.results["summarizer"].payload == "echo: A long text."

    outputs, records = await run(program, ["a", "b"], resources=config_for(server), record=True)
    assert [o.payload for o in outputs] == ["echo: echo: a", "echo: echo: b"]
    assert [r.index for r in records] == [0, 1]
    plain = await run(program, "c", resources=config_for(server))
    assert plain == "echo: echo: c"  # without record=, a raw output as before


# -------------------------------------------------------------- functional ops
class Summarize(Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference(alias="llm")

    def forward(self, text: str) -> Any:
        template = valueify("Summarize: {text}", kind=ValueKind.FSTRING)
        variables = valueify({"text": text})
        prompt = F.render(template, variables)  # -> Value(TEXT, ref=...)
        summary = self.llm(prompt)  # -> Value(RESPONSE, ref=...)
        return F.chat_complete(summary, alias="llm", system_prompt="Shorten it.")


async def test_render_then_chat_complete_snippet(server: ScriptedServer) -> None:
    graph = Tracer().trace(Summarize(), "long doc")
    assert list(graph.nodes) == ["input:text", "F.render", "llm", "F.chat_complete"]
    assert graph.nodes["F.chat_complete"].dependencies == ("llm",)
    result = await Summarize().bind(config_for(server))("long doc")
    assert result == "echo: echo: Summarize: long doc"
    assert server.stats.log[1].body["messages"][0] == {"role": "system", "content": "Shorten it."}


class AskTwice(Module):
    def __init__(self) -> None:
        super().__init__()
        self.kinds: list[ValueKind] = []
        self.metas: list[dict[str, Any]] = []

    async def forward(self, question: str) -> Value:
        first = await F.chat_complete(question, alias="llm")
        self.kinds.append(first.kind)
        self.metas.append(first.meta)
        return await F.chat_complete(f"Again: {first.payload}", alias="llm")


async def test_chat_complete_in_an_async_forward_returns_a_response_value(
    server: ScriptedServer,
) -> None:
    program = AskTwice()
    reply = await program.bind(config_for(server))("hi")
    assert reply == "echo: Again: echo: hi" and program.kinds == [ValueKind.RESPONSE]
    # Seed 001: "LLM response object → RESPONSE: includes tokens, model in meta".
    meta = program.metas[0]
    assert meta["model"] and meta["input_tokens"] > 0 and meta["output_tokens"] > 0
    with pytest.raises(RuntimeError, match="has no resources"):
        F.chat_complete("hi", alias="llm")


# ----------------------------------------------------------------- Value[...]
Input = TypeVar("Input")
Output = TypeVar("Output")


class TypedModule(Module, Generic[Input, Output]):
    """Base class for type-annotated modules."""

    def forward(self, input: Input) -> Output:
        raise NotImplementedError


class Summarizer(TypedModule[str, str]):
    """Strongly typed summarizer."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference(alias="llm")

    def forward(self, text: str) -> str:
        return self.llm(f"Summarize: {text}")


def trained_output(module: Module) -> Value[str]:
    return valueify("text")


async def test_typed_modules_and_value_annotations(server: ScriptedServer) -> None:
    assert typing.get_type_hints(trained_output)["return"] == Value[str]
    assert typing.get_origin(Value[str]) is Value and typing.get_args(list[Value[str]])
    summarizer = Summarizer().bind(config_for(server))
    assert await summarizer("x") == "echo: Summarize: x"
    summarizer.train()  # Training single: module.train(); await module("x") -> Value[T]
    trained = await summarizer("x")
    assert isinstance(trained, Value) and trained.meta["_tape_ids"]


# ----------------------------------------------------------------- binding
async def test_binding_a_composite_reaches_its_children(server: ScriptedServer) -> None:
    pipeline = seed_programs.DeepPipeline().bind(resources=config_for(server))
    # "Binding is propagated to all child modules automatically."
    assert await pipeline.stage1("doc") == "echo: echo: doc"
    assert await pipeline.stage2.technical("doc") == "echo: doc"
    with pytest.raises(RuntimeError, match="has no resources"):
        seed_programs.SummarizeAndAnalyze().summarizer("doc")  # never bound: said so


def test_execution_patterns_from_synchronous_code() -> None:
    with server_in_thread() as server:
        pipeline = seed_programs.SummarizeAndAnalyze().bind(resources=config_for(server))
        result = pipeline.run_sync("Analyze this document...")
        results = pipeline.run_sync(["Doc 1...", "Doc 2..."])
        direct = pipeline("Doc 3...")  # no event loop: runs and returns, like run_sync
    assert result == "echo: echo: Analyze this document..."
    assert results == ["echo: echo: Doc 1...", "echo: echo: Doc 2..."]
    assert direct == "echo: echo: Doc 3..."


def test_a_module_starts_in_eval_mode() -> None:
    # Seed 000's Module.training defaults to True, but its own table of execution
    # patterns has `await module("x")` return T (eval) and `module.train()` first
    # for Value[T]; plait keeps eval as the default (see docs/how-to/porting.md).
    assert Module().training is False
    assert seed_programs.DeepPipeline().train().stage3.synthesizer.training is True


# ---------------------------------------------------------------- Parameter
def test_parameter_feedback_buffer_snippet() -> None:
    param = Parameter("Be concise.", description="Tone of the summary.")
    param.accumulate_feedback("too long")
    assert param._feedback_buffer == ["too long"]  # the seed's private buffer
    assert param.get_accumulated_feedback() == list(param._feedback_buffer)
    param.apply_update("Be brief.")  # "self._feedback_buffer.clear()"
    assert param._feedback_buffer == [] and str(param) == "Be brief."


def test_a_learnable_parameter_without_a_description_says_what_to_write() -> None:
    # Seed 000: `description: str | None = None  # Required when requires_grad=True`
    with pytest.raises(ValueError) as info:
        Parameter("Be concise.")
    message = str(info.value)
    assert "Parameter('Be concise.')" in message and "\n" not in message
    assert "description=" in message and "requires_grad=False" in message
    assert Parameter("fixed", description=None, requires_grad=False).description is None


def test_parameters_are_equal_only_to_themselves_and_same_as_compares_fields() -> None:
    # The seed's dataclass compares fields; plait's Parameter compares identity,
    # because optimizers key their state by parameter: two parameters holding the
    # same text are still two parameters (see docs/how-to/porting.md).
    param1 = Parameter("value", description="Test description", requires_grad=True)
    param2 = Parameter("value", description="Test description", requires_grad=True)
    assert param1 != param2 and param1.same_as(param2)
    assert len({param1, param2}) == 2 and {param1: 1, param2: 2}[param1] == 1
    param1.accumulate_feedback("feedback")  # feedback and names are not what it is
    Module().prompt = param2
    assert param1.same_as(param2)
    for other in (
        Parameter("value2", description="Test description"),
        Parameter("value", description="Description 2"),
        Parameter("value", description="Test description", requires_grad=False),
        Parameter("value", description="Test description", value_type=str),
    ):
        assert not param1.same_as(other)
    assert not param1.same_as("value")


# ------------------------------------------------- the seed's context readers
class Recorded(Module):
    """The seed's ``Module.__call__`` sketch: while tracing, a call is recorded on the context."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference(alias="llm")
        self.seen: list[Any] = []

    def forward(self, text: str) -> Any:
        ctx = get_trace_context()
        self.seen.append(ctx)
        return ctx.record_call(self.llm, (text,), {})


async def test_get_trace_context_and_get_execution_settings_snippet(
    server: ScriptedServer,
) -> None:
    assert get_trace_context() is None and get_execution_settings() is None
    program = Recorded()
    graph = Tracer().trace(program, "x")
    assert list(graph.nodes) == ["input:text", "llm"] and program.seen[0] is not None
    config = config_for(server)
    async with ExecutionSettings(resources=config, max_concurrent=7):
        settings = get_execution_settings()
        assert settings.resources is config and settings.max_concurrent == 7
        assert await program("hi") == "echo: hi"  # the recorded call ran for real
    assert get_execution_settings() is None


def test_execution_settings_scheduler_snippet() -> None:
    # plait has one scheduler; what the seed's would hold is max_concurrent and the
    # endpoints' limits (docs/how-to/porting.md, "Different on purpose").
    with pytest.raises(TypeError, match="scheduler"):
        ExecutionSettings(scheduler=object())  # type: ignore[call-arg]
