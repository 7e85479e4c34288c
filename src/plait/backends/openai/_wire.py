"""The chat-completions wire format: request bodies, replies and stream assembly.

Pure functions over dicts, shared by both transports of
`OpenAICompatBackend` (plait's HTTP client and the official SDK), so the two cannot
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

from plait.backends._shapes import MalformedReply, expect, optional_text, preview, token_count
from plait.backends.types import (
    Message,
    Part,
    Request,
    Response,
    ResponseSchema,
    StreamChunk,
    ToolCall,
    Usage,
    message_to_dict,
)
from plait.errors import BackendError, MediaError
from plait.media import Audio, File, Image

__all__ = [
    "GENERIC",
    "LLAMA_CPP",
    "OPENAI",
    "StreamAssembler",
    "WireDialect",
    "build_body",
    "decode_event",
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
        "messages": [_message_body(m) for m in request.messages],
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


def _message_body(message: Message) -> dict[str, Any]:
    out = message_to_dict(message)
    if message.parts:
        out["content"] = [_content_part(part, message.role) for part in message.parts]
    return out


def _content_part(part: Part, role: str) -> dict[str, Any]:
    """Returns one chat-completions content part: text, ``image_url``, ``input_audio`` or ``file``.

    Raises:
        MediaError: the part cannot be sent in this API: media in a turn that
            is not the user's, or audio or a document given as a URL (the API
            takes those only as data).
    """
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if role != "user":
        raise MediaError(f"{part!r} is in a {role} turn; images, audio and files go in user turns")
    if isinstance(part, Image):
        image: dict[str, Any] = {"url": part.data_uri()}
        if part.detail is not None:
            image["detail"] = part.detail
        return {"type": "image_url", "image_url": image}
    if isinstance(part, Audio):
        return {
            "type": "input_audio",
            "input_audio": {"data": part.base64(), "format": part.format},
        }
    if isinstance(part, File):
        data = f"data:{part.media_type};base64,{part.base64()}"  # the API takes no file URL
        return {"type": "file", "file": {"filename": part.filename, "file_data": data}}
    raise MediaError(f"{part!r} is not an input the chat-completions API takes")


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

    ``content`` may be a string, null, or a list of text parts
    (``[{"type": "text", "text": ...}]``, which some servers send); the parts
    are joined. Usage counts must be integers >= 0: a reply that reports
    ``"ten"`` tokens is garbled, and recording 0 instead would let budgets
    and token limits be overrun without a word.

    Raises:
        BackendError: the reply does not have the shape of a completion (no
            ``choices[0].message``, as when a proxy answers 200 with an error
            object; a ``message`` that is a string; ``usage`` that is not an
            object ...). It names the field and shows the start of the body.
            Not retryable, because the same request will get the same answer.
    """
    try:
        return _read_completion(data)
    except MalformedReply as exc:
        shown = preview(data)
        raise BackendError(
            f"{where} answered HTTP 200 with a malformed reply ({exc}): {shown}",
            status=200,
            body=data,
            detail=shown,
        ) from None


def _read_completion(data: Any) -> Response:
    expect(data, dict, "the reply")
    if "choices" not in data:
        raise MalformedReply("it has no choices")
    choices = expect(data["choices"], list, "choices")
    if not choices:
        raise MalformedReply("choices is empty")
    choice = expect(choices[0], dict, "choices[0]")
    if "message" not in choice:
        raise MalformedReply("choices[0] has no message")
    message = expect(choice["message"], dict, "choices[0].message")
    return Response(
        text=_content_text(message.get("content"), "choices[0].message.content"),
        tool_calls=_map_tool_calls(message.get("tool_calls"), "choices[0].message.tool_calls"),
        usage=_map_usage(data.get("usage")),
        finish_reason=optional_text(choice.get("finish_reason"), "choices[0].finish_reason"),
        model=optional_text(data.get("model"), "model"),
    )


def _content_text(content: Any, path: str) -> str:
    """Returns the text of a message's content: a string, null, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = expect(content, list, path)
    texts = []
    for i, part in enumerate(parts):
        expect(part, dict, f"{path}[{i}]")
        if part.get("type") != "text":
            raise MalformedReply(
                f"{path}[{i}] is a part of type {part.get('type')!r}, expected 'text'"
            )
        texts.append(expect(part.get("text"), str, f"{path}[{i}].text"))
    return "".join(texts)


def _map_tool_calls(raw: Any, path: str) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    calls = []
    for i, call in enumerate(expect(raw, list, path)):
        expect(call, dict, f"{path}[{i}]")
        function = expect(call.get("function"), dict, f"{path}[{i}].function")
        calls.append(
            ToolCall(
                id=optional_text(call.get("id"), f"{path}[{i}].id") or f"call_{i}",
                name=expect(function.get("name"), str, f"{path}[{i}].function.name"),
                arguments=_arguments_text(
                    function.get("arguments"), f"{path}[{i}].function.arguments"
                ),
            )
        )
    return tuple(calls)


def _arguments_text(arguments: Any, path: str) -> str:
    # The protocol says a JSON string; a few servers send the object itself.
    if arguments is None:
        return ""
    if isinstance(arguments, str):
        return arguments
    try:
        return orjson.dumps(arguments).decode()
    except TypeError:  # orjson writes at most 255 levels (the reader took 1024)
        raise MalformedReply(f"{path} is nested too deeply") from None


def _map_usage(raw: Any) -> Usage:
    if raw is None:
        return Usage()
    expect(raw, dict, "usage")
    return Usage(
        input_tokens=token_count(raw.get("prompt_tokens"), "usage.prompt_tokens"),
        output_tokens=token_count(raw.get("completion_tokens"), "usage.completion_tokens"),
    )


def decode_event(data: bytes, where: str) -> Any:
    """Returns the decoded JSON of one streamed event's data.

    Raises:
        BackendError: the event is not UTF-8 JSON. Retryable: unlike a reply
            of the wrong shape, which the server means and would send again,
            garbled bytes in a 200 stream come from a cut or corrupted
            transfer (a proxy buffer, a dropped packet), and a fresh request
            usually streams cleanly; max_retries bounds a server that always
            garbles. (After the first chunk the resource layer never retries.)
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        shown = preview(data)
        raise BackendError(
            f"{where} streamed an event that is not UTF-8 JSON: {shown}",
            status=200,
            retryable=True,
            body=data.decode("utf-8", "replace"),
            detail=shown,
        ) from exc


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

    def feed(self, chunk: Any, where: str) -> str:
        """Takes one decoded chunk; returns its new text ("" if none).

        Raises:
            BackendError: the server sent an error event inside the stream
                (retryable), or an event of the wrong shape, such as a JSON
                list or a ``delta`` that is a string (not retryable, as in
                `parse_completion`); the message shows the start of the event.
        """
        if isinstance(chunk, dict) and chunk.get("error"):
            error = chunk["error"]
            message = str(error.get("message") if isinstance(error, dict) else error)
            raise BackendError(
                f"{where} sent an error inside the stream: {message}",
                retryable=True,
                body=chunk,
                detail=message,
            )
        try:
            return self._read(chunk)
        except MalformedReply as exc:
            shown = preview(chunk)
            raise BackendError(
                f"{where} streamed a malformed event ({exc}): {shown}",
                status=200,
                body=chunk,
                detail=shown,
            ) from None

    def _read(self, chunk: Any) -> str:
        expect(chunk, dict, "the event")
        usage = chunk.get("usage")
        if usage:  # vLLM sends "usage": null on every chunk but the last
            self.usage = _map_usage(usage)
        if self.model is None:
            self.model = optional_text(chunk.get("model"), "model")
        choices = chunk.get("choices")
        if not choices:
            return ""
        choice = expect(expect(choices, list, "choices")[0], dict, "choices[0]")
        finish = choice.get("finish_reason")
        if finish:
            self.finish_reason = expect(finish, str, "choices[0].finish_reason")
        delta = choice.get("delta")
        if not delta:
            return ""
        expect(delta, dict, "choices[0].delta")
        fragments = delta.get("tool_calls")
        if fragments:
            path = "choices[0].delta.tool_calls"
            for i, fragment in enumerate(expect(fragments, list, path)):
                self._add_fragment(expect(fragment, dict, f"{path}[{i}]"), f"{path}[{i}]")
        return _content_text(delta.get("content"), "choices[0].delta.content")

    def _add_fragment(self, fragment: dict[str, Any], path: str) -> None:
        index = fragment.get("index")
        if index is None:  # not in the protocol, but seen: a new id starts a new call
            index = len(self._calls) if fragment.get("id") or not self._calls else max(self._calls)
        expect(index, int, f"{path}.index")
        slot = self._calls.get(index)
        if slot is None:
            slot = self._calls[index] = [None, "", []]
        if fragment.get("id"):
            slot[0] = expect(fragment["id"], str, f"{path}.id")
        function = fragment.get("function")
        if function:
            expect(function, dict, f"{path}.function")
            if function.get("name"):
                slot[1] = expect(function["name"], str, f"{path}.function.name")
            arguments = function.get("arguments")
            if arguments:
                slot[2].append(_arguments_text(arguments, f"{path}.function.arguments"))

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
