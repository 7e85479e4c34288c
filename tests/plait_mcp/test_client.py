"""MCP servers' tools used from plait: real servers written with the SDK, started by the tests.

Each test starts a server as a process (stdio) or on loopback (streamable HTTP)
and checks what plait makes of it: tools with the server's schemas, calls from
code and from an agent whose model is the scripted server, confirmations, and
a crash, a hang and a malformed reply turning into plait errors; and that the
server's process is gone once the toolset is closed or its user cancelled.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plait import ConfirmationRequired, Image, Predict, ReAct, ResourceConfig, ResumeState
from plait.errors import MCPError
from plait.mcp import MCPToolOutput, MCPToolset, WithServers
from plait.testing import ScriptedServer

from .support import (
    AWKWARD_SERVER,
    NONSENSE_SERVER,
    TOOLS_SERVER,
    free_port,
    http_process,
    is_running,
)

BOUND = 60.0
"""Generous limit for anything that must not hang (the hanging tool sleeps an hour)."""


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


def call_then_answer(*calls: dict[str, Any]) -> Any:
    """A responder: the given tool calls first; then an answer made of the tool results."""

    def responder(body: dict[str, Any]) -> Any:
        results = [m["content"] for m in tool_messages(body)]
        if not results:
            return {"tool_calls": list(calls)}
        return json.dumps({"answer": " / ".join(results)})

    return responder


def pid_of(path: Path) -> int:
    return int(path.read_text())


@pytest.fixture
def pid_file(tmp_path: Path) -> Path:
    return tmp_path / "server.pid"


def tools_server(pid_file: Path, **options: Any) -> MCPToolset:
    return MCPToolset(TOOLS_SERVER, env={"PID_FILE": str(pid_file)}, **options)


async def test_a_stdio_server_s_tools_are_plait_tools_and_its_process_ends_on_close(
    pid_file: Path,
) -> None:
    toolset = tools_server(pid_file)
    async with toolset:
        tools = {tool.name: tool for tool in toolset.tools}
        assert list(tools) == ["add", "files_delete", "hang", "crash", "picture"]
        assert tools["files_delete"].server_name == "files.delete"  # '.' is not a tool name
        assert tools["add"].description == "Adds two integers."
        assert tools["add"].parameters["properties"]["a"]["type"] == "integer"
        assert tools["add"].parameters["required"] == ["a", "b"]

        assert await tools["add"](a=2, b=3) == "5"
        refused = await tools["add"].call({"a": "two"})
        assert not refused.ok and refused.error == "invalid_arguments"
        assert "'b' is a required property" in refused.content
        assert "argument 'a': 'two' is not of type 'integer'" in refused.content

        pid = pid_of(pid_file)
        assert is_running(pid)
    assert not is_running(pid)
    with pytest.raises(MCPError, match="is not open"):
        await tools["add"](a=1, b=1)


async def test_a_streamable_http_server_s_tools_are_plait_tools() -> None:
    port = free_port()
    command = [sys.executable, TOOLS_SERVER[1], "http", str(port)]
    with http_process(command, port) as url:
        async with MCPToolset(url) as toolset:
            assert toolset.name == "127.0.0.1"
            add = next(tool for tool in toolset if tool.name == "add")
            assert await add(a=20, b=22) == "42"
            result = await add.call('{"a": 1, "b": 1}', call_id="c1")
            assert (result.ok, result.content, result.call_id) == (True, "2", "c1")


async def test_predict_calls_an_mcp_tool_the_scripted_model_asks_for(pid_file: Path) -> None:
    responder = call_then_answer({"id": "call_1", "name": "add", "arguments": {"a": 2, "b": 5}})
    async with ScriptedServer(responder=responder) as llm, tools_server(pid_file) as toolset:
        resources = ResourceConfig({"*": llm.endpoint(max_retries=0)})
        agent = Predict("question -> answer", tools=toolset.tools).bind(resources)
        prediction = await agent(question="What is 2 + 5?")

    first, second = (record.body for record in llm.stats.log)
    offered = {tool["function"]["name"]: tool["function"] for tool in first["tools"]}
    assert offered["add"]["parameters"]["required"] == ["a", "b"]
    (result,) = tool_messages(second)
    assert (result["content"], result["tool_call_id"]) == ("7", "call_1")
    assert prediction.answer == "7"


async def test_only_the_named_tools_need_confirmation(pid_file: Path, tmp_path: Path) -> None:
    deleted = tmp_path / "deleted.txt"
    responder = call_then_answer(
        {"id": "call_add", "name": "add", "arguments": {"a": 1, "b": 1}},
        {"id": "call_del", "name": "files_delete", "arguments": {"path": "notes.txt"}},
    )
    toolset = MCPToolset(
        TOOLS_SERVER, env={"DELETE_LOG": str(deleted)}, require_confirmation={"files.delete"}
    )
    async with ScriptedServer(responder=responder) as llm, toolset:
        tools = {tool.name: tool for tool in toolset.tools}
        assert tools["files_delete"].require_confirmation
        assert not tools["add"].require_confirmation
        agent = ReAct("request -> answer", tools=toolset.tools)
        with pytest.raises(ConfirmationRequired) as paused:
            await agent.bind(ResourceConfig({"*": llm.endpoint(max_retries=0)}))(request="tidy up")
    assert paused.value.tool_name == "files_delete"
    assert not deleted.exists()  # nothing ran before a person said yes


async def test_a_confirmation_policy_naming_an_unknown_tool_is_refused(pid_file: Path) -> None:
    toolset = tools_server(pid_file, require_confirmation={"rm"})
    with pytest.raises(MCPError, match=r"require_confirmation names 'rm'.*its tools: add, crash"):
        async with toolset:
            pass
    assert not is_running(pid_of(pid_file))


async def test_a_crashing_server_is_a_tool_error_for_the_model_and_an_mcp_error_for_code(
    pid_file: Path,
) -> None:
    async with asyncio.timeout(BOUND), tools_server(pid_file) as toolset:
        tools = {tool.name: tool for tool in toolset.tools}
        result = await tools["crash"].call({})
        assert not result.ok and result.error == "exception"
        assert "MCP server 'tools_server.py', tool 'crash'" in result.content
        assert "connection to the server ended (it may have crashed)" in result.content
        with pytest.raises(MCPError, match="it may have crashed"):
            await tools["add"](a=1, b=2)


async def test_a_hanging_tool_times_out(pid_file: Path) -> None:
    async with asyncio.timeout(BOUND), tools_server(pid_file, timeout=0.5) as toolset:
        hang = next(tool for tool in toolset if tool.name == "hang")
        result = await hang.call({})
        assert (result.ok, result.error) == (False, "timeout")
        assert result.content == "Error: tool 'hang' did not finish within 0.5 seconds"
        with pytest.raises(MCPError, match=r"tool 'hang': no answer within 0.5 seconds"):
            await hang()
        add = next(tool for tool in toolset if tool.name == "add")
        assert await add(a=1, b=2) == "3"  # the session goes on after a call was given up


async def test_a_malformed_reply_is_an_mcp_error() -> None:
    async with asyncio.timeout(BOUND), MCPToolset(NONSENSE_SERVER, name="broken") as toolset:
        (echo,) = toolset.tools
        with pytest.raises(MCPError, match=r"'broken', tool 'echo'.*not an MCP tool result"):
            await echo()
        result = await echo.call({})
        assert not result.ok and "not an MCP tool result" in result.content


async def test_a_server_that_does_not_start_is_an_mcp_error() -> None:
    with pytest.raises(MCPError, match=r"'no-such-mcp-server' could not be started.*check the"):
        async with MCPToolset(["no-such-mcp-server", "--stdio"]):
            pass


async def test_a_tool_whose_schema_loops_is_an_error_result_the_agent_reads() -> None:
    """A ``$ref`` loop in a tool's schema made checking its arguments recurse until a bare
    RecursionError ended the agent's run: it is the call's error result; the agent goes on
    and the server's other tools work."""
    calls = [{"id": "c1", "name": "loop", "arguments": {"node": {"left": 1}}}]
    async with (
        ScriptedServer(responder=call_then_answer(*calls)) as llm,
        MCPToolset([*AWKWARD_SERVER, "loop"]) as toolset,
    ):
        tools = {tool.name: tool for tool in toolset}
        refused = await tools["loop"].call({"node": {"left": 1}})
        resources = ResourceConfig({"*": llm.endpoint(max_retries=0)})
        agent = Predict("request -> answer", tools=toolset.tools).bind(resources)
        answer = await agent(request="go")
        echoed = await tools["echo"](text="still here")
    assert not refused.ok and refused.error == "invalid_arguments"
    assert "its tool 'loop' with a JSON schema whose $ref leads back to itself" in refused.content
    assert "$ref leads back to itself" in answer.answer  # the model was told, the run went on
    assert echoed == "still here"


async def test_a_server_hung_in_initialize_fails_at_connect_timeout(pid_file: Path) -> None:
    """The error comes when ``connect_timeout`` has passed, not once the SDK's shutdown of the
    hung process (its input closed, 2 s of grace, then a signal) is over, which made a
    2-second timeout fail after ~20 s; the process still ends."""
    toolset = MCPToolset(
        [*AWKWARD_SERVER, "hang"], env={"PID_FILE": str(pid_file)}, connect_timeout=1
    )
    with pytest.raises(MCPError, match="did not start and list its tools within 1 seconds"):
        async with toolset:
            pass
    for _ in range(int(BOUND * 10)):  # the process was started: it writes its id first
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.1)
    pid = pid_of(pid_file)
    assert is_running(pid)  # the error did not wait for the shutdown
    for _ in range(int(BOUND * 10)):
        if not is_running(pid):
            break
        await asyncio.sleep(0.1)
    assert not is_running(pid)


async def test_images_in_a_result_are_plait_images(pid_file: Path) -> None:
    async with tools_server(pid_file) as toolset:
        picture = next(tool for tool in toolset if tool.name == "picture")
        output = await picture()
        result = await picture.call({})
    assert isinstance(output, MCPToolOutput)
    assert output.text == "a red dot"
    (image,) = output.images
    assert isinstance(image, Image) and image.media_type == "image/png"
    assert image.data is not None and image.data.startswith(b"\x89PNG")
    assert result.content == f"a red dot\n[{image.describe()}]"
    assert result.media == (image,)


async def test_an_image_a_tool_returns_reaches_the_model_as_an_image_input(
    pid_file: Path,
) -> None:
    responder = call_then_answer({"id": "call_pic", "name": "picture", "arguments": {}})
    async with ScriptedServer(responder=responder) as llm, tools_server(pid_file) as toolset:
        agent = ReAct("request -> answer", tools=toolset.tools)
        await agent.bind(ResourceConfig({"*": llm.endpoint(max_retries=0)}))(request="draw")

    after_the_tool = llm.stats.log[1].body["messages"]
    roles = [message["role"] for message in after_the_tool]
    assert roles[-2:] == ["tool", "user"]  # the tool's answer, then its image as a user turn
    parts = after_the_tool[-1]["content"]
    assert parts[0] == {"type": "text", "text": "The image returned by tool 'picture':"}
    assert parts[1]["type"] == "image_url"
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")


async def test_an_image_shown_before_a_pause_is_still_shown_after_the_resume(
    tmp_path: Path,
) -> None:
    steps = [
        {"tool_calls": [{"id": "call_pic", "name": "picture", "arguments": {}}]},
        {"tool_calls": [{"id": "call_del", "name": "files_delete", "arguments": {"path": "a"}}]},
        json.dumps({"answer": "done"}),
    ]

    def responder(body: dict[str, Any]) -> Any:
        return steps[len(tool_messages(body))]

    toolset = MCPToolset(
        TOOLS_SERVER,
        env={"DELETE_LOG": str(tmp_path / "deleted.txt")},
        require_confirmation={"files.delete"},
    )
    async with ScriptedServer(responder=responder) as llm, toolset:
        agent = ReAct("request -> answer", tools=toolset.tools)
        agent.bind(ResourceConfig({"*": llm.endpoint(max_retries=0)}))
        with pytest.raises(ConfirmationRequired) as paused:
            await agent(request="draw, then tidy up")
        stored = ResumeState(paused.value, "yes").to_json()  # kept by the application
        result = await agent(
            request="draw, then tidy up", resume_state=ResumeState.from_json(stored)
        )

    assert result.answer == "done"
    after_resume = llm.stats.log[-1].body["messages"]
    shown = [m for m in after_resume if m["role"] == "user" and isinstance(m["content"], list)]
    (image_turn,) = shown
    assert image_turn["content"][1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")


async def test_cancelling_the_user_ends_the_server_process(pid_file: Path) -> None:
    started = asyncio.Event()

    async def user() -> None:
        async with tools_server(pid_file) as toolset:
            hang = next(tool for tool in toolset if tool.name == "hang")
            started.set()
            await hang()

    task = asyncio.create_task(user())
    async with asyncio.timeout(BOUND):
        await started.wait()
        pid = pid_of(pid_file)
        await asyncio.sleep(0.2)  # let the call reach the server
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not is_running(pid)


async def test_with_servers_opens_for_each_call_and_closes_after(pid_file: Path) -> None:
    responder = call_then_answer({"id": "c", "name": "add", "arguments": {"a": 3, "b": 4}})
    toolset = tools_server(pid_file)
    agent = ReAct("question -> answer", tools=await toolset.list_tools())
    first_pid = pid_of(pid_file)
    assert not is_running(first_pid)  # listing opened it only for as long as it took
    async with ScriptedServer(responder=responder) as llm:
        program = WithServers(agent, toolset).bind(ResourceConfig({"*": llm.endpoint()}))
        prediction = await program(question="3 + 4?")
    assert prediction.answer == "7"
    second_pid = pid_of(pid_file)
    assert second_pid != first_pid and not is_running(second_pid)


def test_import_plait_does_not_import_the_mcp_sdk() -> None:
    code = "import sys, plait, plait.tools; print('mcp' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False"
