"""The OpenAI-compatible routes: ``POST /v1/chat/completions`` and ``GET /v1/models``.

A program that takes a conversation or a text is a model named after the program, so the
official ``openai`` client, plait's own ``openai`` provider or any OpenAI-compatible tool can
call it. How the conversation reaches the program (`ServedProgram.chat_form`): a `History`
input gets the messages as a History, an ``LLMInference`` the list of messages, a text input
the last user message. The reply is the output's text (a single text field as its text,
anything else as JSON).

Sampling options of the request (``temperature``, ``max_tokens`` …) are accepted and ignored:
the program sets its own. A streamed reply sends the text of the call whose output the program
returns as it is written (the program's own, or the one inner call its ``forward`` returns
as it is), and whatever the final output adds at the end; a reply that is JSON (an output of
several fields, or of one that is not text) arrives whole, so streamed and plain replies are
the same text. A run that pauses for
approval answers its question as the reply text with ``finish_reason: "stop"`` and the
paused run (its id and pending calls) in an extra ``plait`` field, which OpenAI clients ignore.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from plait.serve.errors import error_response
from plait.serve.owners import owner_of
from plait.serve.programs import ChatMessage, ServedProgram
from plait.serve.responses import ClientLeft, JsonResponse, until_disconnected
from plait.serve.runs import RunService

__all__ = ["ChatCompletionRequest", "add_openai_routes"]


class ChatCompletionRequest(BaseModel):
    """The fields of an OpenAI chat-completions request that a served program uses."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(description="The name of the served program.")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None


def add_openai_routes(app: FastAPI, service: RunService) -> None:
    """Adds ``/v1/chat/completions`` and ``/v1/models`` for the programs that can chat."""
    from plait.serve.run_route import admitted_stream, run_failure

    chat = {name: p for name, p in service.programs.items() if p.chat_form is not None}

    @app.get("/v1/models", tags=["openai"], summary="The programs that chat, as models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "plait"} for name in chat
            ],
        }

    @app.post("/v1/chat/completions", tags=["openai"], summary="Chat with a program")
    async def completions(request: Request, body: ChatCompletionRequest) -> Response:
        served = chat.get(body.model)
        if served is None:
            return _openai_error(request, 404, "model_not_found", _unknown_model(body.model, chat))
        messages = [message.model_dump(exclude_none=True) for message in body.messages]
        try:
            arguments = served.chat_arguments(messages)
        except ValueError as exc:
            return _openai_error(request, 400, "invalid_messages", str(exc))
        reply = _Reply(served, body.model)
        if body.stream:
            usage_wanted = bool((body.stream_options or {}).get("include_usage"))
            events = service.stream(served, arguments, owner=owner_of(request.scope))
            chunks = reply.chunks(events, usage_wanted)
            return await admitted_stream(request.scope, service, chunks, _sse_data)
        try:
            async with service.admitted():
                run = service.run(served, arguments, owner=owner_of(request.scope))
                outcome = await until_disconnected(request.receive, run)
                name, data = await service.finish(served, arguments, outcome)
        except ClientLeft:
            return Response(status_code=499)
        except Exception as exc:
            failure = run_failure(exc, request.scope, service.options.retry_after)
            return _as_openai_error(failure)
        return JsonResponse(reply.completion(name, data))


class _Reply:
    """Writes one program run as an OpenAI chat completion, whole or as chunks."""

    def __init__(self, served: ServedProgram, model: str) -> None:
        self.served = served
        self.model = model
        self.created = int(time.time())
        self.id = f"chatcmpl-{uuid.uuid4().hex}"

    def completion(self, name: str, data: dict[str, Any]) -> dict[str, Any]:
        """Returns the completion of a run that ended as ``name`` with the body ``data``."""
        paused = data if name == "paused" else None
        body = self._envelope("chat.completion")
        body["choices"] = [
            {
                "index": 0,
                "message": {"role": "assistant", "content": self._final_text(name, data)},
                "finish_reason": "stop",
            }
        ]
        body["usage"] = _usage(data["usage"])
        if paused:
            body["plait"] = paused
        return body

    async def chunks(
        self, events: AsyncIterator[tuple[str, Any, bool]], usage_wanted: bool
    ) -> AsyncIterator[bytes]:
        """Yields the ``data:`` lines of a streamed completion, then ``[DONE]``."""
        sent = ""
        started = False
        try:
            async for name, data, in_reply in events:
                if not started:
                    started = True
                    yield self._chunk({"role": "assistant", "content": ""}, None)
                if name == "text" and in_reply:
                    sent += data["delta"]
                    if data["delta"]:
                        yield self._chunk({"content": data["delta"]}, None)
                elif name in ("output", "paused", "rejected"):
                    final = self._final_text(name, data)
                    rest = final[len(sent) :] if final.startswith(sent) else ""
                    if rest:
                        yield self._chunk({"content": rest}, None)
                    last = self._chunk({}, "stop", plait=data if name == "paused" else None)
                    yield last
                    if usage_wanted:
                        envelope = self._envelope("chat.completion.chunk")
                        envelope["choices"] = []
                        envelope["usage"] = _usage(data["usage"])
                        yield _sse_data(envelope)
            yield b"data: [DONE]\n\n"
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    def _final_text(self, name: str, data: dict[str, Any]) -> str:
        """The reply of a run's last event: the output as text, the question of a pause, or
        what a rejection stopped."""
        if name == "paused":
            return _pause_text(data)
        if name == "rejected":
            return str(data["message"])
        return self.served.reply_text(data["output"])

    def _chunk(self, delta: dict[str, Any], finish: str | None, **extra: Any) -> bytes:
        body = self._envelope("chat.completion.chunk")
        body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
        body.update({key: value for key, value in extra.items() if value is not None})
        return _sse_data(body)

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def _pause_text(paused: dict[str, Any]) -> str:
    return " ".join(call["question"] for call in paused["pending"])


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    return {
        "prompt_tokens": usage["input_tokens"],
        "completion_tokens": usage["output_tokens"],
        "total_tokens": usage["input_tokens"] + usage["output_tokens"],
    }


def _sse_data(data: Any) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def _unknown_model(model: str, chat: dict[str, ServedProgram]) -> str:
    known = ", ".join(repr(name) for name in chat) or "none"
    return f"no served program that chats is named {model!r}; models: {known}"


def _openai_error(request: Request, status: int, code: str, message: str) -> JsonResponse:
    """Returns an error in OpenAI's shape (``error.message``, ``error.type``, ``error.code``)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return error_response(status, kind, message, request.scope, code=code)


def _as_openai_error(failure: JsonResponse) -> JsonResponse:
    body = json.loads(bytes(failure.body))
    body["error"]["code"] = body["error"]["type"]
    body["error"]["type"] = "server_error" if failure.status_code >= 500 else "rate_limit_error"
    headers = {k: v for k, v in failure.headers.items() if k.lower() == "retry-after"}
    return JsonResponse(body, status_code=failure.status_code, headers=headers)
