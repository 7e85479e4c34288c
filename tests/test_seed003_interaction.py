"""Seed 003's own snippets for streaming, confirmation, callbacks and settings, run on plait.

Each snippet is the seed's, with only the changes plait's resources need, said in
a comment: ``lm=`` gets an endpoint of the scripted server instead of an OpenAI
key. A call made from synchronous code runs to completion there, as in udspy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import plait
from plait import (
    BaseCallback,
    ConfirmationRejected,
    ConfirmationRequired,
    Module,
    OutputStreamChunk,
    Predict,
    Prediction,
    ReAct,
    ResumeState,
    StreamEvent,
    ToolCallEvent,
    ToolResultEvent,
    confirm_first,
    emit_event,
    tool,
)
from plait.porting import LM, OpenAILM
from plait.testing import ScriptedServer, server_in_thread


@pytest.fixture(autouse=True)
def _reset_settings():
    yield
    plait.settings.reset()


async def test_streaming_snippet(capsys: pytest.CaptureFixture[str]) -> None:
    async with ScriptedServer(responder=lambda body: '{"answer": "AI is software."}') as server:
        plait.settings.configure(lm=server.endpoint())  # plait: an endpoint, not an API key
        predictor = Predict("question -> answer")
        result = None
        async for event in predictor.astream(question="What is AI?"):
            if isinstance(event, OutputStreamChunk):
                print(event.delta, end="", flush=True)  # Real-time output
            elif isinstance(event, Prediction):
                result = event  # Final result
    assert capsys.readouterr().out == "AI is software."
    assert result is not None and result.answer == "AI is software."


@dataclass
class ToolProgress(StreamEvent):
    tool_name: str
    progress: float
    message: str


async def test_custom_stream_events_snippet() -> None:
    @tool
    async def search(query: str) -> str:
        """Searches."""
        emit_event(ToolProgress("search", 0.5, "Searching..."))  # Emit from anywhere
        return "found"

    replies = iter(
        [{"tool_calls": [{"name": "search", "arguments": {"query": "x"}}]}, '{"answer": "ok"}']
    )
    async with ScriptedServer(responder=lambda body: next(replies)) as server:
        plait.settings.configure(lm=server.endpoint())
        agent = ReAct("question -> answer", tools=[search])
        events = [event async for event in agent.astream(question="find x")]
    progress = [e for e in events if isinstance(e, ToolProgress)]
    assert progress == [ToolProgress("search", 0.5, "Searching...")]


async def test_the_stream_is_all_stream_events_and_each_names_its_module_object() -> None:
    @tool
    def search(query: str) -> str:
        """Searches."""
        return "found"

    replies = iter(
        [{"tool_calls": [{"name": "search", "arguments": {"query": "x"}}]}, '{"answer": "ok"}']
    )
    async with ScriptedServer(responder=lambda body: next(replies)) as server:
        plait.settings.configure(lm=server.endpoint())
        agent = ReAct("question -> answer", tools=[search])
        # udspy: the Prediction is the stream's last event, a StreamEvent like the others
        events = [e async for e in agent.astream(question="x?") if isinstance(e, StreamEvent)]
    assert isinstance(events[-1], Prediction) and events[-1].answer == "ok"
    named = [
        e for e in events if isinstance(e, OutputStreamChunk | ToolCallEvent | ToolResultEvent)
    ]
    assert {type(e) for e in named} == {OutputStreamChunk, ToolCallEvent, ToolResultEvent}
    assert all(e.module is agent and e.module_path == "ReAct" for e in named)
    assert "module=" not in repr(named[0]) and "module_path='ReAct'" in repr(named[0])


def delete_files_responder(body: dict[str, Any]) -> Any:
    if not any(m["role"] == "tool" for m in body["messages"]):
        return {"tool_calls": [{"name": "delete_file", "arguments": {"path": "old.log"}}]}
    return '{"answer": "' + body["messages"][-1]["content"].replace('"', "'") + '"}'


def test_confirmation_loop_snippet(tmp_path: Path) -> None:
    target = tmp_path / "old.log"
    target.write_text("x")

    @tool(require_confirmation=True)
    def delete_file(path: str) -> str:
        os.remove(tmp_path / path)
        return f"Deleted {path}"

    answers = iter(["yes"])
    with server_in_thread(responder=delete_files_responder) as server:
        plait.settings.configure(lm=server.endpoint())
        agent = ReAct("question -> answer", tools=[delete_file])
        resume_state = None
        while True:
            try:
                result = agent(question="Delete all files", resume_state=resume_state)
                break  # Success
            except ConfirmationRequired as e:
                user_input = next(answers)  # input("Approve? (yes/no): ")
                resume_state = ResumeState(e, user_input)
    assert result.answer == "Deleted old.log" and not target.exists()


async def test_streaming_confirmation_snippet(tmp_path: Path) -> None:
    @confirm_first  # "Or manually"
    def delete_file(path: str) -> str:
        return f"Deleted {path}"

    async def ask_user(tool_call: Any) -> bool:
        return tool_call.name == "delete_file"

    async with ScriptedServer(responder=delete_files_responder) as server:
        plait.settings.configure(lm=server.endpoint())
        agent = ReAct("question -> answer", tools=[delete_file])
        seen = []
        async for event in agent.astream(question="Delete files"):
            if isinstance(event, Prediction) and not event.is_final:
                for tc in event.native_tool_calls:
                    approved = await ask_user(tc)
                    # plait: the pause travels on the event (the seed leaves `exception` open)
                    resume_state = ResumeState(event.confirmation, "yes" if approved else "no")
                    async for event2 in agent.astream(resume_state=resume_state):
                        seen.append(event2)
    assert seen[-1].is_final and seen[-1].answer == "Deleted old.log"


class MyModule(Module):
    """Seed 003's "Module Implementation" of suspend/resume; its work deletes a file.

    plait: the seed's ``self.state`` is ``self.saved`` here, because ``Module.state`` is
    what optimizers record (seed 002); assigning it says so.
    """

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.saved: dict[str, Any] = {}

        @tool(require_confirmation=True)
        def delete_file(path: str) -> str:
            os.remove(folder / path)
            return f"Deleted {path}"

        self.delete_file = delete_file

    async def do_work(self) -> dict[str, Any]:
        return {"answer": await self.delete_file.acall(path=self.saved["path"])}

    # plait: `forward` is the seed's `aexecute` (streaming needs no flag)
    async def forward(self, *, resume_state: Any = None, **inputs: Any) -> Any:
        # Check for resume
        if resume_state:
            return await self.aresume(
                user_response=resume_state.user_response,
                saved_state=resume_state.exception.context,
            )

        # Normal execution
        try:
            self.saved = {"path": inputs["path"]}
            result = await self.do_work()
            return Prediction(**result)
        except ConfirmationRequired as e:
            # Save state in exception context
            e.context["saved_data"] = self.saved
            raise  # Let user handle

    async def aresume(self, user_response: str, saved_state: dict[str, Any]) -> Any:
        # Restore state
        self.saved = saved_state["saved_data"]

        # Process user response
        if user_response == "yes":
            # Continue
            return await self.do_work()
        else:
            # Abort
            raise ConfirmationRejected("User rejected")


def test_assigning_module_state_says_what_to_write() -> None:
    class Keeper(Module):
        def __init__(self) -> None:
            super().__init__()
            self.state = {"step": 1}  # seed 003's name for a module's own data

    with pytest.raises(AttributeError, match=r"keep the module's own data under another name"):
        Keeper()


def run_loop(agent: Module, answers: list[str]) -> Any:
    """Seed 003's "Usage: Loop Pattern", the person's answers given in order."""
    replies = iter(answers)
    resume_state = None
    while True:
        try:
            result = agent(path="old.log", resume_state=resume_state)
            break  # Success
        except ConfirmationRequired as e:
            user_input = next(replies)  # input("Approve? (yes/no): ")
            resume_state = ResumeState(e, user_input)
    return result


def test_module_implementation_snippet_resumes_after_yes(tmp_path: Path) -> None:
    (tmp_path / "old.log").write_text("x")
    with server_in_thread(responder=lambda body: "unused") as server:
        plait.settings.configure(lm=server.endpoint())
        result = run_loop(MyModule(tmp_path), ["yes"])
    assert result == {"answer": "Deleted old.log"}
    assert not (tmp_path / "old.log").exists()


def test_module_implementation_snippet_raises_confirmation_rejected_after_no(
    tmp_path: Path,
) -> None:
    (tmp_path / "old.log").write_text("x")
    with server_in_thread(responder=lambda body: "unused") as server:
        plait.settings.configure(lm=server.endpoint())
        with pytest.raises(ConfirmationRejected, match="User rejected"):
            run_loop(MyModule(tmp_path), ["no"])
    assert (tmp_path / "old.log").exists()


async def test_a_module_without_resources_resumes_through_the_same_checks(tmp_path: Path) -> None:
    (tmp_path / "old.log").write_text("x")
    agent = MyModule(tmp_path)  # no LLM inside, no resources anywhere: forward runs directly
    with pytest.raises(ConfirmationRequired) as paused:
        await agent.aforward(path="old.log")
    state = ResumeState(paused.value, "yes")
    assert await agent.aforward(resume_state=state) == {"answer": "Deleted old.log"}
    with pytest.raises(plait.errors.ResumeRefusedError, match="already used"):
        await agent.aforward(resume_state=state)


class Cleaner(Module):
    """A module that resumes by doing its work again: the paused call is the person's to decide."""

    def __init__(self, folder: Path) -> None:
        super().__init__()

        @tool(require_confirmation=True)
        def delete_file(path: str) -> str:
            os.remove(folder / path)
            return f"Deleted {path}"

        self.delete_file = delete_file

    async def forward(self, path: str, resume_state: Any = None) -> str:
        return await self.delete_file.acall(path=path)


async def test_a_declined_call_raises_confirmation_rejected_in_the_tool(tmp_path: Path) -> None:
    (tmp_path / "old.log").write_text("x")
    cleaner = Cleaner(tmp_path)
    with pytest.raises(ConfirmationRequired) as paused:
        await cleaner.aforward("old.log")
    with pytest.raises(ConfirmationRejected, match="declined to run delete_file") as rejected:
        await cleaner.aforward("old.log", resume_state=ResumeState(paused.value, "no"))
    assert rejected.value.tool_call == {
        "id": paused.value.confirmation_id,
        "name": "delete_file",
        "arguments": {"path": "old.log"},
    }
    assert (tmp_path / "old.log").exists()


async def test_a_yes_runs_the_paused_call_once_and_edited_arguments_run_instead(
    tmp_path: Path,
) -> None:
    for name in ("old.log", "other.log"):
        (tmp_path / name).write_text("x")
    cleaner = Cleaner(tmp_path)
    with pytest.raises(ConfirmationRequired) as paused:
        await cleaner.aforward("old.log")
    edited = ResumeState(paused.value, {"path": "other.log"})
    assert await cleaner.aforward(resume_state=edited) == "Deleted other.log"
    assert (tmp_path / "old.log").exists() and not (tmp_path / "other.log").exists()


async def test_react_can_raise_confirmation_rejected_on_no(tmp_path: Path) -> None:
    target = tmp_path / "old.log"
    target.write_text("x")

    @tool(require_confirmation=True)
    def delete_file(path: str) -> str:
        os.remove(tmp_path / path)
        return f"Deleted {path}"

    async with ScriptedServer(responder=delete_files_responder) as server:
        plait.settings.configure(lm=server.endpoint())
        agent = ReAct("question -> answer", tools=[delete_file], on_decline="raise")
        with pytest.raises(ConfirmationRequired) as paused:
            await agent(question="Delete all files")
        with pytest.raises(ConfirmationRejected, match="declined to run delete_file") as rejected:
            await agent(resume_state=ResumeState(paused.value, "no, keep it"))
        asked = len(server.stats.log)
    assert rejected.value.confirmation_id == paused.value.confirmation_id
    assert "keep it" in str(rejected.value) and target.exists() and asked == 1


async def test_a_custom_module_pause_streams_as_a_non_final_prediction(tmp_path: Path) -> None:
    (tmp_path / "old.log").write_text("x")
    async with ScriptedServer(responder=lambda body: "unused") as server:
        plait.settings.configure(lm=server.endpoint())
        agent = MyModule(tmp_path)
        events = [event async for event in agent.astream(path="old.log")]
        pause = events[-1]
        assert isinstance(pause, Prediction) and not pause.is_final
        assert [call.name for call in pause.native_tool_calls] == ["delete_file"]
        resumed = [e async for e in agent.astream(resume_state=ResumeState(pause.confirmation))]
    assert resumed[-1] == {"answer": "Deleted old.log"}


class LoggingCallback(BaseCallback):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_lm_start(self, call_id, instance, inputs):  # type: ignore[no-untyped-def]
        self.lines.append(f"[{call_id}] LLM called")
        self.lines.append(f"  Model: {inputs.get('model')}")
        self.lines.append(f"  Messages: {len(inputs.get('messages', []))}")

    def on_lm_end(self, call_id, outputs, exception):  # type: ignore[no-untyped-def]
        if exception:
            self.lines.append(f"[{call_id}] LLM failed: {exception}")
        else:
            self.lines.append(f"[{call_id}] LLM completed")


async def test_callbacks_snippet() -> None:
    async with ScriptedServer(responder=lambda body: '{"answer": "4"}') as server:
        plait.settings.configure(lm=server.endpoint())
        predictor = Predict("question -> answer")
        everywhere, here = LoggingCallback(), LoggingCallback()
        plait.settings.configure(callbacks=[everywhere])  # Configure globally
        await predictor(question="2+2?")
        with plait.settings.context(callbacks=[here]):  # Or per-context
            result = await predictor(question="...")
    assert result.answer == "4"
    for callback in (everywhere, here):
        assert callback.lines[1:3] == ["  Model: scripted-model", "  Messages: 2"]
        assert callback.lines[3].endswith("LLM completed")


async def test_settings_snippet() -> None:
    async with (
        ScriptedServer(responder=lambda b: '{"answer": "global"}') as global_server,
        ScriptedServer(responder=lambda b: '{"answer": "custom"}') as custom_server,
    ):
        global_lm = global_server.endpoint()  # plait: LM(model=..., api_key=...)
        plait.settings.configure(lm=global_lm)
        predictor = Predict("question -> answer")
        custom_lm = custom_server.endpoint()
        with plait.settings.context(lm=custom_lm):
            result = await predictor(question="...")  # Uses custom_lm
        assert result.answer == "custom"
        result = await predictor(question="...")  # Uses global LM
        assert result.answer == "global"


# ------------------------------------------------------------ the LM layer's spellings
QA_REPLY = '{"answer": "4"}'


async def test_lm_snippet() -> None:
    async with ScriptedServer(responder=lambda b: QA_REPLY, api_key="sk-seed") as server:
        # plait: base_url points at the scripted server instead of api.openai.com
        lm = LM(model="scripted-model", api_key="sk-seed", base_url=server.base_url)
        plait.settings.configure(lm=lm)
        result = await Predict("question -> answer")(question="2+2?")
        keyless = LM(model="other-model", base_url=server.base_url)
        with (
            plait.settings.context(lm=keyless),
            pytest.raises(plait.errors.BackendError, match="401"),
        ):
            await Predict("question -> answer")(question="2+2?")  # no key: refused
    assert result.answer == "4"
    assert server.stats.log[0].body["model"] == "scripted-model"


async def test_openai_lm_snippet() -> None:
    from openai import AsyncOpenAI

    async with ScriptedServer(responder=lambda b: QA_REPLY, api_key="sk-seed") as server:
        client = AsyncOpenAI(api_key="sk-seed", base_url=server.base_url)
        for lm in (OpenAILM(client, default_model="scripted-model"), OpenAILM(client, "m2")):
            plait.settings.configure(lm=lm)
            assert (await Predict("question -> answer")(question="2+2?")).answer == "4"
        await client.close()
    assert [record.body["model"] for record in server.stats.log] == ["scripted-model", "m2"]


def test_an_async_openai_client_as_lm_says_what_to_write() -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key="sk-seed", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(plait.errors.ConfigError, match=r"OpenAILM\(client, model="):
        plait.settings.configure(lm=client)
    with pytest.raises(plait.errors.ConfigError, match=r"OpenAILM\(client, model="):
        plait.settings.context(lm=client)


async def test_environment_snippet(monkeypatch: pytest.MonkeyPatch) -> None:
    async with ScriptedServer(responder=lambda b: QA_REPLY, api_key="sk-env") as server:
        # Set: UDSPY_LM_MODEL=gpt-4o, UDSPY_LM_API_KEY=sk-... (plait: and the server's URL)
        monkeypatch.setenv("UDSPY_LM_MODEL", "env-model")
        monkeypatch.setenv("UDSPY_LM_API_KEY", "sk-env")
        monkeypatch.setenv("UDSPY_LM_BASE_URL", server.base_url)
        plait.settings.configure()
        result = await Predict("question -> answer")(question="2+2?")
    assert result.answer == "4" and server.stats.log[0].body["model"] == "env-model"
    assert "sk-env" not in repr(plait.settings.resources)


def test_configure_with_nothing_to_set_says_what_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UDSPY_LM_MODEL", raising=False)
    with pytest.raises(plait.errors.ConfigError, match="UDSPY_LM_MODEL is not set"):
        plait.settings.configure()


async def test_with_callbacks_snippet() -> None:
    from plait.callback import BaseCallback as SeedBaseCallback
    from plait.callback import with_callbacks

    class Starts(SeedBaseCallback):
        def __init__(self) -> None:
            self.modules: list[str] = []

        def on_module_start(self, call_id, instance, inputs):  # type: ignore[no-untyped-def]
            self.modules.append(type(instance).__name__)

    class Echo(Module):
        @with_callbacks
        async def forward(self, text: str) -> str:
            # Callbacks automatically called before/after
            return text

    seen = Starts()
    async with ScriptedServer(responder=lambda b: QA_REPLY) as server:
        plait.settings.configure(lm=server.endpoint(), callbacks=[seen])
        assert await Echo()(text="hi") == "hi"
    assert seen.modules == ["Echo"]  # told once: plait reports every module call itself

    with pytest.raises(TypeError, match="reports every module call"):

        class Helper(Module):
            @with_callbacks
            async def prepare(self, text: str) -> str:
                return text


def test_adapter_module_path() -> None:
    from plait.adapter import ChatAdapter, JSONAdapter
    from plait.signatures import ChatAdapter as PlaitChatAdapter

    assert (
        ChatAdapter is PlaitChatAdapter
        and JSONAdapter().format_inputs(
            plait.Signature.from_string("question -> answer"), {"question": "hi"}
        )
        == "question: hi"
    )
