"""MCP, both ways: use an MCP server's tools in plait, and serve plait programs over MCP.

`MCPToolset` (in `plait.mcp.client`) turns the tools of a server, started as a
command (stdio) or reached at a URL (streamable HTTP), into plait `Tool`s;
`WithServers` keeps toolsets open for each call of a module. `server` (in
`plait.mcp.serving`) exposes programs and `Tool`s as MCP tools; the ``plait mcp``
command serves one from the command line.

Needs the ``mcp`` extra (``pip install 'plait[mcp]'``); ``import plait`` never
loads this package, and the SDK (`plait.mcp._sdk`) is imported only when a server is
opened, or when `server` or `ProgramServer` is first read.
"""

from __future__ import annotations

from typing import Any

from plait.mcp.client import (
    DEFAULT_CONNECT_TIMEOUT,
    MCPTool,
    MCPToolOutput,
    MCPToolset,
    WithServers,
)

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "MCPTool",
    "MCPToolOutput",
    "MCPToolset",
    "ProgramServer",
    "WithServers",
    "server",
]


def __getattr__(name: str) -> Any:
    if name in ("server", "ProgramServer"):  # the server side imports the SDK and pydantic
        from plait.mcp import serving  # optional extra (plait[mcp]): the server side loads the SDK

        return getattr(serving, name)
    raise AttributeError(f"module 'plait.mcp' has no attribute {name!r}")
