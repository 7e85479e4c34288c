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
the same text. When the reply's call starts again after some of its text was sent (an
upstream stream cut and retried), the new text is held back until it has repeated what was
sent; a retry that says something else ends the stream with an ``error`` (`_SentText`).
A run that pauses for approval answers its question as the reply text with
``finish_reason: "stop"`` and the paused run (its id and pending calls) in an extra ``plait``
field, which OpenAI clients ignore.
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
from starlette.types import Scope

from plait.serve.errors import error_response, request_id_of
from plait.serve.owners import owner_of
from plait.serve.programs import ChatMessage, ServedProgram
from plait.serve.responses import ClientLeft, JsonResponse, until_disconnected
from plait.serve.run_route import admitted_stream, run_failure
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
        reply = _Reply(served, body.model, request.scope)
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

    def __init__(self, served: ServedProgram, model: str, scope: Scope) -> None:
        self.served = served
        self.scope = scope
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
        """Yields the ``data:`` lines of a streamed completion, then ``[DONE]``; or, when the
        text sent cannot become the reply (`_SentText`), an ``error`` line instead."""
        sent = _SentText()
        started = False
        try:
            async for name, data, in_reply in events:
                if not started:
                    started = True
                    yield self._chunk({"role": "assistant", "content": ""}, None)
                if name == "restart" and in_reply:
                    sent.restart()
                elif name == "text" and in_reply:
                    more = sent.add(data["delta"], data.get("keep"))
                    if more:
                        yield self._chunk({"content": more}, None)
                elif name in ("output", "paused", "rejected"):
                    rest = sent.rest(self._final_text(name, data))
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
        except _NotTheReply as exc:
            error = {"type": "reply_diverged", "message": str(exc), "status": 502}
            yield _sse_data({"error": {**error, "request_id": request_id_of(self.scope)}})
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


class _NotTheReply(Exception):
    """The text a client was sent is not the start of the reply; the stream cannot be mended."""


class _SentText:
    """The reply's text as a streaming client has it, which it cannot take back.

    An OpenAI client adds up the deltas it is sent, and has no way to drop them. So when
    the reply's call starts again (a stream cut, a reply re-asked: a ``restart``), the new
    attempt's text is held back until it passes what the client has, and must repeat it (at
    temperature 0 a retry usually does); what it adds beyond is sent. An attempt that says
    something else, or an output that does not begin with the text sent, ends the stream
    with an error: the client then knows its text is not the reply, where the deltas that
    added the failed attempt and the retry up (as they once did) read as one wrong reply.
    Trailing whitespace waits for the text after it, as a finished field may drop it.

    While no restart happened, what the client has is the attempt's first ``sent``
    characters, so a piece costs what it adds; only after a restart is the client's text
    kept apart (``held``) and the new attempt compared with it, each character once.
    """

    def __init__(self) -> None:
        self.attempt = ""
        """The reply's text in the current attempt."""
        self.sent = 0
        """Characters the client has."""
        self.held: str | None = None
        """The client's text while the current attempt has not passed it (after a
        restart, or text taken back by ``keep``); None when it is ``attempt[:sent]``."""
        self.checked = 0
        """Characters of the attempt found equal to ``held``."""
        self.restarts = 0

    def restart(self) -> None:
        """Starts the reply's text again from empty (the client keeps what it has)."""
        if self.held is None:
            self.held = self.attempt[: self.sent]
        self.attempt = ""
        self.checked = 0
        self.restarts += 1

    def add(self, delta: str, keep: int | None = None) -> str:
        """Takes a text event of the reply (`plait.serve.events`); returns the text to send.

        Raises:
            _NotTheReply: the attempt's text differs from what the client has.
        """
        attempt, self.attempt = self.attempt, ""  # the only reference: += grows it in place
        if keep is not None and keep < len(attempt):
            if self.held is None and keep < self.sent:
                self.held = attempt[: self.sent]
            attempt = attempt[:keep]
            self.checked = min(self.checked, keep)
        attempt += delta
        self.attempt = attempt
        held = self.held
        if held is not None:
            upto = min(len(attempt), len(held))
            if attempt[self.checked : upto] != held[self.checked : upto]:
                raise self._not_the_reply()
            self.checked = upto
            if len(attempt) <= len(held):
                return ""
            self.held = None  # passed it: the client's text is attempt[:sent] again
        end = len(attempt)
        while end > self.sent and attempt[end - 1].isspace():
            end -= 1
        if end <= self.sent:
            return ""
        more = attempt[self.sent : end]
        self.sent = end
        return more

    def rest(self, final: str) -> str:
        """Returns what the reply ``final`` adds to the text sent.

        Raises:
            _NotTheReply: ``final`` does not begin with the text sent.
        """
        has = self.held if self.held is not None else self.attempt[: self.sent]
        if not final.startswith(has):
            raise self._not_the_reply()
        return final[self.sent :]

    def _not_the_reply(self) -> _NotTheReply:
        sent = self.sent
        if self.restarts:
            return _NotTheReply(
                f"the reply was cut off and asked again after {sent} characters of it had been "
                "streamed, and the new reply differs from them, so the text streamed is not the "
                "reply; ask again"
            )
        return _NotTheReply(
            f"the program's output does not begin with the {sent} characters streamed, so the "
            "text streamed is not the reply; ask again, or without stream"
        )


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
