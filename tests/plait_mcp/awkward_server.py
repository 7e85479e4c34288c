"""An MCP server on the SDK's low-level `Server`, awkward in the ways a client must survive:
``python awkward_server.py loop`` lists a tool whose argument schema refers to itself in a
loop (``$ref``), ``python awkward_server.py hang`` never gets past ``initialize`` (its
lifespan, which the SDK enters before it reads a message, waits for an hour).

It writes its process id to the file named by ``PID_FILE`` (when set).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__" and os.environ.get("PID_FILE"):  # first: the SDK takes a while to load
    Path(os.environ["PID_FILE"]).write_text(str(os.getpid()))

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

LOOP = {
    "type": "object",
    "properties": {"node": {"$ref": "#/$defs/a"}},
    "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
}
"""``node`` is ``a``, which is ``b``, which is ``a``: checking a value never ends."""


@contextlib.asynccontextmanager
async def hanging(server: Any) -> AsyncIterator[dict[str, Any]]:
    await asyncio.sleep(3600)
    yield {}


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    tools = [
        types.Tool(name="loop", description="Takes a node.", input_schema=LOOP),
        types.Tool(
            name="echo",
            description="Says its text back.",
            input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        ),
    ]
    return types.ListToolsResult(tools=tools)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    text = str((params.arguments or {}).get("text", "called"))
    return types.CallToolResult(content=[types.TextContent(text=text)])


async def main(mode: str) -> None:
    options: dict[str, Any] = {"lifespan": hanging} if mode == "hang" else {}
    server: Server[Any] = Server(
        "awkward", on_list_tools=list_tools, on_call_tool=call_tool, **options
    )
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
