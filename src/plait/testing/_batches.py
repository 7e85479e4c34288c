"""The scripted server's Batch API: ``/v1/files`` and ``/v1/batches``, answered like OpenAI's.

A batch is answered by the server's own responder, line by line, as if each
line were a chat-completions request (faults do not apply to batch lines; a
responder that raises puts the line in the error file with status 500). It
stays ``in_progress`` for ``batch_delay`` seconds after creation, so clients
really poll, and a test can stop a client while its batch is running.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from plait.testing._replies import RawReply, completion_payload, error_payload

if TYPE_CHECKING:
    from aiohttp import web

    from plait.testing.scripted_server import ScriptedServer

__all__ = ["BatchStore"]


@dataclass
class BatchStore:
    """Files and batches the server holds, and how often they were asked about."""

    files: dict[str, bytes] = field(default_factory=dict)
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    polls: int = 0
    """``GET /v1/batches/{id}`` requests answered."""
    batch_delay: float = 0.0
    """Seconds a new batch stays ``in_progress`` before it completes."""
    _serial: itertools.count = field(default_factory=lambda: itertools.count(1))
    _ready_at: dict[str, float] = field(default_factory=dict)
    _server: Any = None

    def routes(self, app: web.Application, server: ScriptedServer) -> None:
        """Adds the Batch API routes (with and without ``/v1``) to ``app``."""
        self._server = server
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/files", self._upload)
            app.router.add_get(f"{prefix}/files/{{file_id}}/content", self._content)
            app.router.add_post(f"{prefix}/batches", self._create)
            app.router.add_get(f"{prefix}/batches/{{batch_id}}", self._get)

    @staticmethod
    def _json(payload: Any, status: int = 200) -> web.Response:
        from aiohttp import web

        return web.Response(
            status=status, body=orjson.dumps(payload), content_type="application/json"
        )

    async def _upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        upload = form.get("file")
        if form.get("purpose") != "batch" or upload is None or isinstance(upload, str):
            return self._json(error_payload(400, "send purpose=batch and a file"), 400)
        content = upload.file.read()
        file_id = f"file-{next(self._serial)}"
        self.files[file_id] = content
        info = {"id": file_id, "object": "file", "bytes": len(content), "purpose": "batch"}
        return self._json(info)

    async def _content(self, request: web.Request) -> web.Response:
        from aiohttp import web

        content = self.files.get(request.match_info["file_id"])
        if content is None:
            return self._json(error_payload(404, "No such file"), 404)
        return web.Response(body=content, content_type="application/jsonl")

    async def _create(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        file_id = body.get("input_file_id")
        if file_id not in self.files or body.get("endpoint") != "/v1/chat/completions":
            return self._json(error_payload(400, "unknown input_file_id or endpoint"), 400)
        batch_id = f"batch_{next(self._serial)}"
        lines = [line for line in self.files[file_id].splitlines() if line.strip()]
        self.batches[batch_id] = {
            "id": batch_id,
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "input_file_id": file_id,
            "completion_window": body.get("completion_window"),
            "status": "in_progress",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": int(time.time()),
            "metadata": body.get("metadata") or {},
            "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
        }
        self._ready_at[batch_id] = time.monotonic() + self.batch_delay
        return self._json(self.batches[batch_id])

    async def _get(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["batch_id"])
        if batch is None:
            return self._json(error_payload(404, "No such batch"), 404)
        self.polls += 1
        if batch["status"] == "in_progress" and time.monotonic() >= self._ready_at[batch["id"]]:
            await self._finish(batch, self._server)
        return self._json(batch)

    async def _finish(self, batch: dict[str, Any], server: ScriptedServer) -> None:
        outputs, errors = [], []
        for number, line in enumerate(self.files[batch["input_file_id"]].splitlines()):
            if not line.strip():
                continue
            item = orjson.loads(line)
            result = await self._answer(item, server, f"batch_req_{number}")
            (outputs if result["response"]["status_code"] == 200 else errors).append(result)
        for key, results in (("output_file_id", outputs), ("error_file_id", errors)):
            if results:
                file_id = f"file-{next(self._serial)}"
                self.files[file_id] = b"\n".join(orjson.dumps(r) for r in results) + b"\n"
                batch[key] = file_id
        batch["request_counts"].update(completed=len(outputs), failed=len(errors))
        batch["status"] = "completed"

    async def _answer(self, item: dict[str, Any], server: ScriptedServer, request_id: str):
        body = item.get("body") or {}
        try:
            reply = await server._ask_responder(body)
            if isinstance(reply, RawReply):
                raise TypeError("a RawReply cannot answer a batch line")
        except Exception as exc:
            message = f"scripted server responder raised {type(exc).__name__}: {exc}"
            response = {"status_code": 500, "request_id": request_id,
                        "body": error_payload(500, message)}  # fmt: skip
        else:
            payload = completion_payload(
                reply, model=str(body.get("model") or server.model), request_id=request_id,
                created=int(time.time()),
            )  # fmt: skip
            response = {"status_code": 200, "request_id": request_id, "body": payload}
        return {"id": request_id, "custom_id": item.get("custom_id"), "response": response,
                "error": None}  # fmt: skip
