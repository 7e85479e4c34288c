"""plait programs and tools served over MCP, called by the SDK's own client.

``plait mcp`` runs as a process (over stdio, and over streamable HTTP on
loopback); ``plait.mcp.server`` is also checked in-process with a program
whose model is the scripted server.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from mcp import Client, StdioServerParameters

from media.samples import GIF
from plait import (
    InputField,
    Module,
    OutputField,
    Predict,
    ReAct,
    ResourceConfig,
    Signature,
    tool,
)
from plait.errors import MCPError
from plait.mcp import MCPToolset, server
from plait.testing import Fault, ScriptedServer

from .served_programs import answerer, invoice_reader
from .support import SRC, free_port, http_process

HERE = Path(__file__).parent
PLAIT_MCP = [sys.executable, "-m", "plait", "mcp"]


def stdio_params(*args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=PLAIT_MCP[0], args=[*PLAIT_MCP[1:], *args], env={"PYTHONPATH": SRC}, cwd=HERE
    )


async def check_served_tools(client: Client) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert list(tools) == ["Shout", "Mirror", "add"]
    assert tools["Shout"].description == "Shouts the text back, a number of times."
    assert tools["Shout"].input_schema["properties"] == {
        "text": {"type": "string"},
        "times": {"default": 1, "type": "integer"},
    }
    assert tools["Shout"].input_schema["required"] == ["text"]
    assert tools["Mirror"].input_schema["properties"]["point"] == {"$ref": "#/$defs/Point"}
    assert tools["Mirror"].output_schema == {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
    }
    assert tools["Shout"].output_schema is None  # text: no structured content promised

    shouted = await client.call_tool("Shout", {"text": "hi", "times": 2})
    assert (shouted.is_error, shouted.content[0].text) == (False, "HI HI")
    mirrored = await client.call_tool("Mirror", {"point": {"x": 1, "y": 2}})
    assert mirrored.structured_content == {"x": 2, "y": 1}
    assert json.loads(mirrored.content[0].text) == {"x": 2, "y": 1}
    added = await client.call_tool("add", {"a": 2, "b": 3})
    assert (added.content[0].text, added.structured_content) == ("5", {"result": 5})

    failed = await client.call_tool("Mirror", {"point": {"x": -1, "y": 2}})
    assert failed.is_error
    assert failed.content[0].text == "Mirror failed: ValueError: x must not be negative"
    invalid = await client.call_tool("Shout", {"times": "many"})
    assert invalid.is_error and "argument 'text': Field required" in invalid.content[0].text


async def test_plait_mcp_over_stdio() -> None:
    async with Client(stdio_params("served_programs.py:ALL")) as client:
        await check_served_tools(client)


async def test_plait_mcp_over_streamable_http() -> None:
    port = free_port()
    command = [*PLAIT_MCP, str(HERE / "served_programs.py:ALL"), "--transport", "http",
               "--port", str(port)]  # fmt: skip
    with http_process(command, port) as url:
        async with Client(url) as client:
            await check_served_tools(client)
        async with httpx.AsyncClient(timeout=30) as plain:  # what a web page could send
            large = await plain.get(url, headers={"x-big": "a" * 100_000})
            rebound = await plain.post(url, json={}, headers={"host": f"rebound.example:{port}"})
            page = await plain.post(url, json={}, headers={"origin": "http://rebound.example"})
            text = await plain.post(url, content="{}", headers={"content-type": "text/plain"})
    assert large.status_code == 431  # the head bound `plait serve` has
    assert (rebound.status_code, page.status_code, text.status_code) == (421, 403, 400)


async def test_a_served_predict_takes_its_signature_inputs_and_uses_the_resources() -> None:
    async with ScriptedServer(responder=lambda body: '{"answer": "Paris"}') as llm:
        resources = ResourceConfig({"*": llm.endpoint(max_retries=0)})
        mcp_server = server(answerer(), resources)
        async with Client(mcp_server.sdk_server) as client:
            (info,) = (await client.list_tools()).tools
            assert info.name == "Predict"
            assert info.input_schema["required"] == ["question"]
            result = await client.call_tool("Predict", {"question": "Capital of France?"})
    assert not result.is_error
    assert result.structured_content == {"answer": "Paris"}
    assert "Capital of France?" in json.dumps(llm.stats.log[0].body)


class Count(Module):
    """Counts the words of a text."""

    def forward(self, text: str) -> int:
        return len(text.split())


class Triage(Signature):
    """Sort a ticket."""

    ticket: str = InputField()
    queue: Literal["billing", "bug"] = OutputField("Where the ticket goes.")


async def test_typed_programs_give_an_output_schema_their_structured_content_follows() -> None:
    async with ScriptedServer(responder=lambda body: '{"queue": "bug"}') as llm:
        resources = ResourceConfig({"*": llm.endpoint(max_retries=0)})
        mcp_server = server({"count": Count(), "triage": Predict(Triage)}, resources)
        async with Client(mcp_server.sdk_server) as client:  # it checks results by the schema
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            counted = await client.call_tool("count", {"text": "one two three"})
            sorted_ = await client.call_tool("triage", {"ticket": "it crashes"})
    assert tools["count"].output_schema == {
        "type": "object",
        "properties": {"result": {"type": "integer"}},
        "required": ["result"],
    }
    queue = tools["triage"].output_schema["properties"]["queue"]
    assert queue["enum"] == ["billing", "bug"] and queue["description"] == "Where the ticket goes."
    assert (counted.is_error, counted.structured_content) == (False, {"result": 3})
    assert (sorted_.is_error, sorted_.structured_content) == (False, {"queue": "bug"})


def test_plait_mcp_names_a_bad_program_on_one_line() -> None:
    done = subprocess.run(
        [*PLAIT_MCP, "served_programs.py:Nothing"],
        cwd=HERE,
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("plait: error: program 'served_programs.py:Nothing': ")
    assert "has no 'Nothing'" in line


async def test_plait_mcp_serves_programs_under_the_names_given(tmp_path: Path) -> None:
    """`NAME=PROGRAM` names a program's tool, as for `plait serve`: two programs of one
    class (two Predicts) are served side by side, each with its own signature."""
    async with ScriptedServer(responder=lambda body: '{"queue": "bug", "answer": "4"}') as llm:
        resources = tmp_path / "res.toml"
        resources.write_text(
            f'[llm]\nprovider = "openai"\nmodel = "m"\nbase_url = "{llm.base_url}"\napi_key = "k"\n'
        )
        specs = ["triage=served_programs.py:triage", "qa=served_programs.py:qa"]
        async with Client(stdio_params(*specs, "-r", str(resources))) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            answered = await client.call_tool("qa", {"question": "2 + 2?"})
    assert list(tools) == ["triage", "qa"]
    assert tools["triage"].input_schema["required"] == ["ticket"]
    assert tools["qa"].input_schema["required"] == ["question"]
    assert (answered.is_error, answered.structured_content) == (False, {"answer": "4"})


def test_plait_mcp_mistakes_are_one_line_with_exit_2(tmp_path: Path) -> None:
    """Two programs that would share a tool name are told how to name them; a program that
    calls a model and has no resources is refused before serving (every call would fail);
    a name given to a list of programs is refused."""
    resources = tmp_path / "res.toml"  # a server of your own: no key needed, none called
    resources.write_text(
        '[llm]\nprovider = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\n'
    )
    cases = [
        (
            ["served_programs.py:triage", "served_programs.py:qa", "-r", str(resources)],
            "name them (on the command line NAME=PROGRAM, e.g. predict2=prog.py:Name",
        ),
        (["served_programs.py:triage"], "Predict calls the alias 'llm' and has no resources"),
        (["all=served_programs.py:ALL"], "NAME=PROGRAM names one program"),
    ]
    for args, expected in cases:
        done = subprocess.run(
            [*PLAIT_MCP, *args], cwd=HERE, env={**os.environ, "PYTHONPATH": SRC},
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode == 2, (args, done.stderr)
        (line,) = done.stderr.splitlines()
        assert line.startswith("plait: error: ") and expected in line, line


async def test_a_served_program_takes_an_image_argument_as_a_data_uri() -> None:
    """An `Image` argument is a string in the tool's schema, a ``data:`` URI or URL that
    reaches the model as an image; a path is an error result, never read."""
    uri = "data:image/gif;base64," + base64.b64encode(GIF).decode()
    async with ScriptedServer(responder=lambda body: '{"total": 3.0}') as llm:
        mcp_server = server(invoice_reader(), ResourceConfig({"*": llm.endpoint()}))
        async with Client(mcp_server.sdk_server) as client:
            (info,) = (await client.list_tools()).tools
            read = await client.call_tool("Predict", {"scan": uri})
            path = await client.call_tool("Predict", {"scan": "/etc/hosts"})
    assert info.input_schema["properties"]["scan"]["format"] == "uri"
    assert (read.is_error, read.structured_content) == (False, {"total": 3.0})
    assert {"type": "image_url", "image_url": {"url": uri}} in llm.stats.log[0].body["messages"][
        -1
    ]["content"]
    assert path.is_error and "a path is not read from a request" in path.content[0].text
    assert llm.stats.requests == 1


async def test_plait_mcp_over_http_to_other_machines_needs_api_keys(tmp_path: Path) -> None:
    """Over HTTP a served program is run by whoever reaches it: off loopback `plait mcp`
    refuses to start without API keys (as `plait serve` does), and with keys a request
    without the bearer token is refused."""
    refused = subprocess.run(
        [*PLAIT_MCP, "served_programs.py:ALL", "--transport", "http", "--host", "0.0.0.0"],
        cwd=HERE, env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        "plait: error: refusing to serve MCP on 0.0.0.0 without API keys: anyone who can "
        "reach it could run the programs at your expense; pass --api-key-env NAME or "
        "--api-key-file PATH, or bind 127.0.0.1"
    ]
    port = free_port()
    command = [*PLAIT_MCP, str(HERE / "served_programs.py:ALL"), "--transport", "http",
               "--port", str(port), "--api-key-env", "MCP_TEST_KEYS"]  # fmt: skip
    with http_process(command, port, MCP_TEST_KEYS="first-key-1234,second-key-5678") as url:
        async with MCPToolset(url, headers={"Authorization": "Bearer second-key-5678"}) as keyed:
            added = await next(tool for tool in keyed if tool.name == "add")(a=2, b=3)
        with pytest.raises(MCPError, match="could not be started or reached"):
            async with MCPToolset(url, connect_timeout=20):
                pass
    assert added == "5"


async def test_a_program_that_asks_for_a_confirmation_ends_as_an_error_saying_why() -> None:
    """A call over MCP cannot pause for a person: the result says so and what to do,
    and the tool that needed the yes never runs."""
    ran: list[str] = []

    @tool(require_confirmation=True)
    def delete_file(path: str) -> str:
        """Deletes a file."""
        ran.append(path)
        return "deleted"

    def call_then_answer(body: dict[str, Any]) -> Any:
        if any(message["role"] == "tool" for message in body["messages"]):
            return '{"answer": "done"}'
        return {"tool_calls": [{"name": "delete_file", "arguments": {"path": "/tmp/x"}}]}

    async with ScriptedServer(responder=call_then_answer) as llm:
        agent = ReAct("request -> answer", tools=[delete_file])
        mcp_server = server({"agent": agent}, ResourceConfig({"*": llm.endpoint()}))
        async with Client(mcp_server.sdk_server) as client:
            result = await client.call_tool("agent", {"request": "clean up"})
    assert result.is_error
    assert result.content[0].text == (
        'agent stopped to ask a person: Run the tool delete_file with {"path": "/tmp/x"}? '
        "A call over MCP cannot pause for an answer; serve the program with plait serve "
        "(which keeps the run for its approval), or make the tool without "
        "require_confirmation"
    )
    assert ran == []


async def test_a_tool_that_needs_confirmation_served_alone_says_why_it_cannot_run() -> None:
    """Served on its own (not inside a program), such a tool answered "Internal server
    error": its result says why it cannot run over MCP, as a program's does."""
    ran: list[str] = []

    @tool(require_confirmation=True)
    def delete_file(path: str) -> str:
        """Deletes a file."""
        ran.append(path)
        return "deleted"

    async with Client(server(delete_file).sdk_server) as client:
        result = await client.call_tool("delete_file", {"path": "/tmp/x"})
    assert result.is_error
    assert result.content[0].text.startswith(
        'delete_file stopped to ask a person: Run the tool delete_file with {"path": "/tmp/x"}? '
        "A call over MCP cannot pause for an answer;"
    )
    assert ran == []


async def test_a_failing_program_s_error_keeps_its_reason_not_the_upstream_address() -> None:
    async with ScriptedServer(faults=[Fault(status=500)]) as llm:
        port = llm.base_url.rsplit(":", 1)[1].split("/")[0]
        base_url = f"{llm.base_url}?api-key=hunter2-secret"  # a key inside the URL
        resources = ResourceConfig({"*": llm.endpoint(max_retries=0, base_url=base_url)})
        async with Client(server({"qa": answerer()}, resources).sdk_server) as client:
            result = await client.call_tool("qa", {"question": "Capital of France?"})
    text = result.content[0].text
    assert result.is_error and text.startswith("qa failed: ") and "500" in text, text
    assert "<address>" in text
    for leak in ("127.0.0.1", port, "hunter2", "/v1"):
        assert leak not in text, (leak, text)
