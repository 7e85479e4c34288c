"""The chat-completions wire format: request bodies, replies and stream assembly.

Pure functions over dicts, shared by both transports of
`OpenAICompatBackend` (aiohttp and the official SDK), so the two cannot
drift apart: the same `Request` produces the same JSON body, and the same
JSON reply the same `Response`.

Servers that call themselves OpenAI-compatible differ in a few places; each
difference is one field of `WireDialect`, and the dialects are:

* ``openai`` — OpenAI proper (and Azure OpenAI): ``response_format`` of type
  ``json_schema``, and the token limit as ``max_completion_tokens`` (OpenAI
  rejects ``max_tokens`` for its reasoning models).
* ``generic`` — any other server until it shows otherwise: ``json_schema``
  structured output, and ``max_tokens``, which every compatible server reads
  (llama.cpp's server silently ignores ``max_completion_tokens``).
* ``llama_cpp`` — llama.cpp's Python server: structured output only as
  ``{"type": "json_object", "schema": {...}}`` (it refuses type
  ``json_schema``; SPEC §8), and ``max_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from plait.backends.types import (
    Message,
    Request,
    Response,
    ResponseSchema,
    StreamChunk,
    ToolCall,
    Usage,
)
from plait.errors import BackendError

__all__ = [
    "GENERIC",
    "LLAMA_CPP",
    "OPENAI",
    "StreamAssembler",
    "WireDialect",
    "build_body",
    "parse_completion",
]


@dataclass(frozen=True, slots=True)
class WireDialect:
    """How one family of servers spells the parts of a request that differ."""

    name: str
    """``openai``, ``generic`` or ``llama_cpp``, as `OpenAICompatBackend.dialect` shows it."""
    json_schema: bool
    """Send structured output as ``json_schema`` (else as ``json_object`` + ``schema``)."""
    token_field: str
    """The body key that carries `SamplingOptions.max_tokens`."""


OPENAI = WireDialect("openai", json_schema=True, token_field="max_completion_tokens")
GENERIC = WireDialect("generic", json_schema=True, token_field="max_tokens")
LLAMA_CPP = WireDialect("llama_cpp", json_schema=False, token_field="max_tokens")

_TOOL_CHOICE_KEYWORDS = frozenset({"auto", "none", "required"})


def build_body(
    request: Request, default_model: str, dialect: WireDialect, *, stream: bool
) -> dict[str, Any]:
    """Returns the chat-completions JSON body for ``request`` in ``dialect``.

    Only options that are set are sent, so the server's defaults apply to the
    rest (and a cache key built from the body does not change when a default
    does).
    """
    body: dict[str, Any] = {
        "model": request.model or default_model,
        "messages": [_map_message(m) for m in request.messages],
    }
    options = request.options.as_dict()
    if options:
        if "max_tokens" in options and dialect.token_field != "max_tokens":
            options[dialect.token_field] = options.pop("max_tokens")
        body.update(options)
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in request.tools
        ]
    if request.tool_choice is not None:
        body["tool_choice"] = _map_tool_choice(request.tool_choice)
    if request.response_schema is not None:
        body["response_format"] = _map_response_format(request.response_schema, dialect)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _map_message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        out: dict[str, Any] = {
            "role": "tool",
            "content": message.content,
            "tool_call_id": message.tool_call_id,
        }
        if message.name:
            out["name"] = message.name
        return out
    out = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    return out


def _map_tool_choice(choice: str) -> Any:
    if choice in _TOOL_CHOICE_KEYWORDS:
        return choice
    return {"type": "function", "function": {"name": choice}}


def _map_response_format(schema: ResponseSchema, dialect: WireDialect) -> dict[str, Any]:
    if dialect.json_schema:
        return {
            "type": "json_schema",
            "json_schema": {"name": schema.name, "schema": schema.schema, "strict": schema.strict},
        }
    return {"type": "json_object", "schema": schema.schema}


def parse_completion(data: Any, where: str) -> Response:
    """Returns the `Response` for a decoded (non-streamed) chat-completions reply.

    Raises:
        BackendError: the reply has no ``choices[0].message`` (some proxies
            answer 200 with an error object); not retryable, because the
            same request will get the same answer.
    """
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise BackendError(
            f"{where} answered 200 without choices[0].message: {_preview(data)}",
            status=200,
            body=data,
        ) from exc
    return Response(
        text=message.get("content") or "",
        tool_calls=_map_tool_calls(message.get("tool_calls")),
        usage=_map_usage(data.get("usage")),
        finish_reason=choice.get("finish_reason"),
        model=data.get("model"),
    )


def _map_tool_calls(raw: Any) -> tuple[ToolCall, ...]:
    if not raw:
        return ()
    calls = []
    for i, call in enumerate(raw):
        function = call.get("function") or {}
        calls.append(
            ToolCall(
                id=call.get("id") or f"call_{i}",
                name=function.get("name") or "",
                arguments=_arguments_text(function.get("arguments")),
            )
        )
    return tuple(calls)


def _arguments_text(arguments: Any) -> str:
    # The protocol says a JSON string; a few servers send the object itself.
    if arguments is None:
        return ""
    if isinstance(arguments, str):
        return arguments
    return orjson.dumps(arguments).decode()


def _map_usage(raw: Any) -> Usage:
    if not raw:
        return Usage()
    return Usage(
        input_tokens=raw.get("prompt_tokens") or 0,
        output_tokens=raw.get("completion_tokens") or 0,
    )


def _preview(data: Any) -> str:
    text = data if isinstance(data, str) else orjson.dumps(data).decode()
    return text if len(text) <= 300 else text[:300] + "…"


class StreamAssembler:
    """Folds streamed chat-completion chunks into text deltas and one final chunk.

    Tool calls arrive as fragments keyed by ``index``: the first carries id
    and name, later ones pieces of the arguments. They are joined here and
    delivered whole on the final chunk, together with the finish reason and
    usage (OpenAI sends usage in a separate chunk with no choices, after the
    finish reason, when ``stream_options.include_usage`` is set).
    """

    __slots__ = ("_calls", "finish_reason", "model", "usage")

    def __init__(self) -> None:
        self._calls: dict[int, list[Any]] = {}  # index -> [id, name, [argument pieces]]
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.model: str | None = None

    def feed(self, chunk: dict[str, Any], where: str) -> str:
        """Takes one decoded chunk; returns its new text ("" if none).

        Raises:
            BackendError: the server sent an error event inside the stream.
        """
        error = chunk.get("error")
        if error:
            message = error.get("message") if isinstance(error, dict) else error
            raise BackendError(
                f"{where} sent an error inside the stream: {message}", retryable=True, body=chunk
            )
        if chunk.get("usage"):
            self.usage = _map_usage(chunk["usage"])
        if self.model is None:
            self.model = chunk.get("model")
        choices = chunk.get("choices")
        if not choices:
            return ""
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        if not delta:
            return ""
        fragments = delta.get("tool_calls")
        if fragments:
            for fragment in fragments:
                self._add_fragment(fragment)
        return delta.get("content") or ""

    def _add_fragment(self, fragment: dict[str, Any]) -> None:
        index = fragment.get("index")
        if index is None:  # not in the protocol, but seen: a new id starts a new call
            index = len(self._calls) if fragment.get("id") or not self._calls else max(self._calls)
        slot = self._calls.get(index)
        if slot is None:
            slot = self._calls[index] = [None, "", []]
        if fragment.get("id"):
            slot[0] = fragment["id"]
        function = fragment.get("function")
        if function:
            if function.get("name"):
                slot[1] = function["name"]
            arguments = function.get("arguments")
            if arguments:
                slot[2].append(_arguments_text(arguments))

    @property
    def has_finished(self) -> bool:
        """Whether the server said why it stopped (a stream cut short has not)."""
        return self.finish_reason is not None

    def final_chunk(self) -> StreamChunk:
        """Returns the last chunk: whole tool calls, finish reason and usage."""
        calls = tuple(
            ToolCall(id=slot[0] or f"call_{index}", name=slot[1], arguments="".join(slot[2]))
            for index, slot in sorted(self._calls.items())
        )
        return StreamChunk(tool_calls=calls, finish_reason=self.finish_reason, usage=self.usage)
