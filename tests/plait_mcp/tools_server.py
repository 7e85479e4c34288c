"""An MCP server written with the SDK, started by the tests: ``python tools_server.py stdio``
or ``python tools_server.py http PORT``.

It writes its process id to the file named by ``PID_FILE`` (when set), so a test
can check that the process is gone once plait closed it.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from pathlib import Path

from mcp.server import MCPServer
from mcp.types import ImageContent, TextContent

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYPj/HwADAgH/aDmHJgAAAABJRU5ErkJggg=="
)

app = MCPServer("tools")


@app.tool()
def add(a: int, b: int) -> str:
    """Adds two integers."""
    return str(a + b)


@app.tool(name="files.delete")
def delete(path: str) -> str:
    """Deletes a file (the test only pretends)."""
    log = os.environ.get("DELETE_LOG")
    if log:
        with open(log, "a") as file:
            file.write(path + "\n")
    return f"deleted {path}"


@app.tool()
async def hang() -> str:
    """Never answers."""
    await asyncio.sleep(3600)
    return "never"


@app.tool()
def crash() -> str:
    """Ends the server's process mid-call."""
    os._exit(3)


@app.tool()
def picture() -> list[TextContent | ImageContent]:
    """Returns a caption and a one-pixel PNG."""
    return [
        TextContent(text="a red dot"),
        ImageContent(data=base64.b64encode(PNG).decode(), mime_type="image/png"),
    ]


if __name__ == "__main__":
    pid_file = os.environ.get("PID_FILE")
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()))
    if sys.argv[1] == "http":
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()
