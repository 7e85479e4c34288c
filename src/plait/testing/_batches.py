"""The scripted server's Batch API: ``/v1/files`` and ``/v1/batches``, answered like OpenAI's.

Anthropic's Message Batches (``/v1/messages/batches``, its ``results``) are
served too, in Anthropic's shapes, so its official SDK can be tested here.
A batch is answered by the server's own responder, line by line, as if each
line were a chat-completions request (faults do not apply to batch lines; a
responder that raises puts the line in the error file with status 500). It
stays ``in_progress`` for ``batch_delay`` seconds after creation, so clients
really poll, and a test can stop a client while its batch is running.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import orjson
from aiohttp import web

from plait.testing._flood import send_flood
from plait.testing._replies import Flood, RawReply, completion_payload, error_payload

if TYPE_CHECKING:
    from plait.testing.scripted_server import ScriptedServer

__all__ = ["BatchStore"]


@dataclass
class BatchStore:
    """Files and batches the server holds, and how often they were asked about."""

    files: dict[str, bytes | Flood] = field(default_factory=dict)
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    polls: int = 0
    """``GET /v1/batches/{id}`` requests answered."""
    batch_delay: float = 0.0
    """Seconds a new batch stays ``in_progress`` before it completes (``math.inf``: never)."""
    batch_id_format: str = "batch_{n}"
    """How new OpenAI batch ids are spelled (``{n}`` is a serial number); a hostile
    server's ids may hold ``/`` or be ``..``."""
    stuck_status: str | None = None
    """When set, every poll of a batch reports this status (OpenAI's ``status``,
    Anthropic's ``processing_status``) and no batch finishes: a server that
    speaks a status its clients do not know."""
    edit_results: Callable[[list[dict[str, Any]]], list[Any] | Flood] | None = None
    """Rewrites a finished batch's result lines before they are served: it gets
    them as objects, in the provider's shape (OpenAI: ``custom_id``,
    ``response``, ``error``, output and error lines together; Anthropic:
    ``custom_id``, ``result``) and returns the lines to serve instead (objects
    are sent as JSON, bytes as they are; OpenAI serves them all in the output
    file), or a `Flood` to serve as the whole file: a server that repeats,
    invents or garbles result lines, or sends a file too large to hold."""
    log: list[str] = field(default_factory=list)
    """``"<METHOD> <raw path>"`` of every Batch API request, as it arrived (still escaped)."""
    _serial: itertools.count = field(default_factory=lambda: itertools.count(1))
    _ready_at: dict[str, float] = field(default_factory=dict)
    message_batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Anthropic Message Batches (``/v1/messages/batches``), by id."""
    _requests: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _results: dict[str, bytes | Flood] = field(default_factory=dict)
    _server: Any = None

    def routes(self, app: web.Application, server: ScriptedServer) -> None:
        """Adds the Batch API routes (with and without ``/v1``) to ``app``."""
        self._server = server
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/files", self._upload)
            app.router.add_get(f"{prefix}/files/{{file_id}}/content", self._content)
            app.router.add_post(f"{prefix}/batches", self._create)
            app.router.add_get(f"{prefix}/batches/{{batch_id}}", self._get)
        app.router.add_post("/v1/messages/batches", self._create_messages)
        app.router.add_get("/v1/messages/batches/{batch_id}", self._get_messages)
        app.router.add_get("/v1/messages/batches/{batch_id}/results", self._messages_results)

    @staticmethod
    def _json(payload: Any, status: int = 200) -> web.Response:
        return web.Response(
            status=status, body=orjson.dumps(payload), content_type="application/json"
        )

    def _note(self, request: web.Request) -> None:
        self.log.append(f"{request.method} {request.raw_path}")

    async def _upload(self, request: web.Request) -> web.Response:
        self._note(request)
        form = await request.post()
        upload = form.get("file")
        if form.get("purpose") != "batch" or not isinstance(upload, web.FileField):
            return self._json(error_payload(400, "send purpose=batch and a file"), 400)
        content = upload.file.read()
        file_id = f"file-{next(self._serial)}"
        self.files[file_id] = content
        info = {"id": file_id, "object": "file", "bytes": len(content), "purpose": "batch"}
        return self._json(info)

    async def _content(self, request: web.Request) -> web.StreamResponse:
        self._note(request)
        content = self.files.get(request.match_info["file_id"])
        if content is None:
            return self._json(error_payload(404, "No such file"), 404)
        if isinstance(content, Flood):
            return await send_flood(request, content)
        return web.Response(body=content, content_type="application/jsonl")

    async def _create(self, request: web.Request) -> web.Response:
        self._note(request)
        body = orjson.loads(await request.read())
        file_id = body.get("input_file_id")
        content = self.files.get(file_id)
        if not isinstance(content, bytes) or body.get("endpoint") != "/v1/chat/completions":
            return self._json(error_payload(400, "unknown input_file_id or endpoint"), 400)
        batch_id = self.batch_id_format.format(n=next(self._serial))
        lines = [line for line in content.splitlines() if line.strip()]
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
        self._note(request)
        batch = self.batches.get(request.match_info["batch_id"])
        if batch is None:
            return self._json(error_payload(404, "No such batch"), 404)
        self.polls += 1
        if self.stuck_status is not None:
            return self._json({**batch, "status": self.stuck_status})
        if batch["status"] == "in_progress" and time.monotonic() >= self._ready_at[batch["id"]]:
            await self._finish(batch, self._server)
        return self._json(batch)

    async def _finish(self, batch: dict[str, Any], server: ScriptedServer) -> None:
        outputs: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        # An uploaded file, not a Flood: _create accepted only such an input file.
        requests = cast(bytes, self.files[batch["input_file_id"]])
        for number, line in enumerate(requests.splitlines()):
            if not line.strip():
                continue
            item = orjson.loads(line)
            result = await self._answer(item, server, f"batch_req_{number}")
            (outputs if result["response"]["status_code"] == 200 else errors).append(result)
        files: dict[str, list[Any] | Flood] = {"output_file_id": outputs, "error_file_id": errors}
        if self.edit_results is not None:
            files = {"output_file_id": self.edit_results(outputs + errors)}
        for key, results in files.items():
            if results:
                file_id = f"file-{next(self._serial)}"
                self.files[file_id] = _jsonl(results)
                batch[key] = file_id
        batch["request_counts"].update(completed=len(outputs), failed=len(errors))
        batch["status"] = "completed"

    async def _answer(
        self, item: dict[str, Any], server: ScriptedServer, request_id: str
    ) -> dict[str, Any]:
        body = item.get("body") or {}
        try:
            reply = await server._ask_responder(body)
            if isinstance(reply, RawReply | Flood):
                raise TypeError(f"a {type(reply).__name__} cannot answer a batch line")
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

    # -- Anthropic Message Batches ------------------------------------------------------

    async def _create_messages(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests:
            return self._json(_anthropic_error("invalid_request_error", "no requests"), 400)
        batch_id = f"msgbatch_{next(self._serial):06d}"
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.message_batches[batch_id] = {
            "id": batch_id,
            "type": "message_batch",
            "processing_status": "in_progress",
            "request_counts": {"processing": len(requests), "succeeded": 0, "errored": 0,
                               "canceled": 0, "expired": 0},
            "created_at": now,
            "expires_at": now,
            "ended_at": None,
            "archived_at": None,
            "cancel_initiated_at": None,
            "results_url": None,
        }  # fmt: skip
        self._requests[batch_id] = requests
        self._ready_at[batch_id] = time.monotonic() + self.batch_delay
        return self._json(self.message_batches[batch_id])

    async def _get_messages(self, request: web.Request) -> web.Response:
        batch_id = request.match_info["batch_id"]
        batch = self.message_batches.get(batch_id)
        if batch is None:
            return self._json(_anthropic_error("not_found_error", "No such batch"), 404)
        self.polls += 1
        if self.stuck_status is not None:
            return self._json({**batch, "processing_status": self.stuck_status})
        ready = time.monotonic() >= self._ready_at[batch_id]
        if batch["processing_status"] == "in_progress" and ready:
            results = [await self._answer_message(entry) for entry in self._requests[batch_id]]
            succeeded = sum(r["result"]["type"] == "succeeded" for r in results)
            edited = results if self.edit_results is None else self.edit_results(results)
            self._results[batch_id] = _jsonl(edited)
            batch["request_counts"].update(
                processing=0, succeeded=succeeded, errored=len(results) - succeeded
            )
            batch["processing_status"] = "ended"
            batch["ended_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            origin = str(request.url.origin())
            batch["results_url"] = f"{origin}/v1/messages/batches/{batch_id}/results"
        return self._json(batch)

    async def _messages_results(self, request: web.Request) -> web.StreamResponse:
        content = self._results.get(request.match_info["batch_id"])
        if content is None:
            return self._json(_anthropic_error("not_found_error", "No results yet"), 404)
        if isinstance(content, Flood):
            return await send_flood(request, content)
        return web.Response(body=content, content_type="application/x-jsonl")

    async def _answer_message(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Answers one ``{"custom_id", "params"}`` with the responder, as Anthropic would."""
        params = entry.get("params") or {}
        messages = [{"role": "system", "content": params["system"]}] if params.get("system") else []
        messages += [
            {"role": m.get("role"), "content": m.get("content")} for m in params.get("messages", [])
        ]
        body = {"model": params.get("model"), "messages": messages,
                "max_tokens": params.get("max_tokens")}  # fmt: skip
        server = self._server
        try:
            reply = await server._ask_responder(body)
            if isinstance(reply, RawReply | Flood):
                raise TypeError(f"a {type(reply).__name__} cannot answer a batch request")
        except Exception as exc:
            problem = f"scripted server responder raised {type(exc).__name__}: {exc}"
            error = _anthropic_error("api_error", problem)
            return {"custom_id": entry.get("custom_id"), "result": {"type": "errored",
                                                                      "error": error}}  # fmt: skip
        choice = params.get("tool_choice") or {}
        content: list[dict[str, Any]] = [{"type": "text", "text": reply.content}]
        stop = "max_tokens" if reply.finish_reason == "length" else "end_turn"
        if choice.get("type") == "tool":
            try:
                data = orjson.loads(reply.content)
            except orjson.JSONDecodeError:
                data = None
            if isinstance(data, dict):
                content = [{"type": "tool_use", "id": f"toolu_{next(self._serial)}",
                            "name": choice["name"], "input": data}]  # fmt: skip
                stop = "tool_use"
        message = {
            "id": f"msg_{next(self._serial)}",
            "type": "message",
            "role": "assistant",
            "model": params.get("model") or server.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": reply.usage.get("prompt_tokens", 0),
                      "output_tokens": reply.usage.get("completion_tokens", 0)},
        }  # fmt: skip
        return {"custom_id": entry.get("custom_id"), "result": {"type": "succeeded",
                                                                  "message": message}}  # fmt: skip


def _anthropic_error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _jsonl(lines: list[Any] | Flood) -> bytes | Flood:
    """Returns result lines as a JSONL file (objects as JSON, bytes as they are), or the Flood."""
    if isinstance(lines, Flood):
        return lines
    return b"".join(
        (line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines
    )
