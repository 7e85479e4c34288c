"""The MCP SDK's names that plait uses, imported in one place, and only once needed.

The SDK is the optional ``mcp`` extra and heavy (``import mcp`` loads some 600
modules), so ``import plait.mcp`` never loads this module: `plait.mcp.client`
loads it when a toolset opens a server, and `plait.mcp.serving` when a program
is served. Without the extra, importing it raises one ImportError that says
what to install. ``anyio`` and ``uvicorn`` come with the SDK.
"""

from __future__ import annotations

try:
    import anyio
    import uvicorn
    from jsonschema import SchemaError, validators
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server import Server
    from mcp.server.stdio import stdio_server
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.exceptions import MCPError as SDKError
    from mcp.types import (
        CONNECTION_CLOSED,
        INVALID_PARAMS,
        CallToolResult,
        Implementation,
        ListToolsResult,
        TextContent,
    )
    from mcp.types import Tool as ToolInfo
    from pydantic import ValidationError  # what the SDK raises on a malformed answer
except ModuleNotFoundError as error:
    raise ImportError(
        "plait's MCP support needs the official MCP SDK: pip install 'plait[mcp]'"
    ) from error

__all__ = [
    "CONNECTION_CLOSED",
    "INVALID_PARAMS",
    "CallToolResult",
    "Client",
    "Implementation",
    "ListToolsResult",
    "SDKError",
    "SchemaError",
    "Server",
    "StdioServerParameters",
    "TextContent",
    "ToolInfo",
    "ValidationError",
    "anyio",
    "create_mcp_http_client",
    "stdio_server",
    "streamable_http_client",
    "uvicorn",
    "validators",
]
