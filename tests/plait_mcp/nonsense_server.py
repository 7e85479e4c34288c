"""A stdio server that speaks JSON-RPC well enough to be listed, then answers a tool call
with something that is not a tool result (``content`` is not a list), as a broken server would.
"""

from __future__ import annotations

import json
import sys


def reply(message_id: object, **body: object) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message_id, **body}) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    request = json.loads(line)
    method, message_id = request.get("method"), request.get("id")
    if message_id is None:
        continue  # a notification
    if method == "initialize":
        reply(
            message_id,
            result={
                "protocolVersion": request["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "nonsense", "version": "0"},
            },
        )
    elif method == "tools/list":
        reply(message_id, result={"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]})
    elif method == "tools/call":
        reply(message_id, result={"content": "this should be a list of blocks"})
    else:
        reply(message_id, error={"code": -32601, "message": f"no method {method}"})
