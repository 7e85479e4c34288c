"""Translates plait requests into Anthropic Messages API bodies, and replies back.

Pure data mapping with no SDK import, so it is cheap to load and to test.
The facts it relies on (Messages API, 2023-06-01 version):

* the system prompt is the top-level ``system`` field, not a turn;
* tool results are ``tool_result`` blocks inside a *user* turn, and all
  results answering one assistant turn must sit in the turn right after it;
* ``max_tokens`` is required;
* a tool's ``input_schema`` must be a JSON-schema ``object``.

Structured output forces one extra tool whose ``input_schema`` is the
response schema; the tool's input is the reply. This works on every Claude
model with tool use, unlike the newer native output formats.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from plait._jsontext import loads
from plait.backends._shapes import MalformedReply, expect, kind_of, optional_text, token_count
from plait.backends.types import (
    Message,
    Part,
    Request,
    Response,
    StreamChunk,
    ToolCall,
    Usage,
)
from plait.errors import MediaError
from plait.media import File, Image, Media

__all__ = ["StreamAssembler", "WirePlan", "build_body", "read_message"]

# end_turn and stop_sequence are both a normal stop; refusal is the model declining.
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}

_TOOL_NAME = re.compile(r"[^a-zA-Z0-9_-]")


@dataclass(slots=True)
class WirePlan:
    """How to read the reply of the body built alongside it."""

    schema_tool: str | None = None
    """Name of the forced tool that carries a structured reply, if any."""
    wrapped: bool = False
    """The response schema was not an object and sits under ``{"value": ...}``."""


class WireError(ValueError):
    """A request that cannot be expressed in the Messages API (the backend wraps it)."""


def build_body(
    request: Request, *, model: str, max_tokens_default: int
) -> tuple[dict[str, Any], WirePlan]:
    """Returns the keyword arguments of ``messages.create`` and how to read the reply.

    Temperature and top_p travel in ``extra_body``: newer SDKs (2.x) dropped
    them from ``create``'s signature, older ones accept both ways. Options the
    API lacks (seed, presence and frequency penalties) are not sent.

    Raises:
        WireError: a tool choice names no tool of the request, or an assistant
            turn holds tool-call arguments that are not a JSON object.
    """
    system, turns = _map_messages(request.messages)
    opts = request.options
    body: dict[str, Any] = {
        "model": request.model or model,
        "max_tokens": opts.max_tokens if opts.max_tokens is not None else max_tokens_default,
        "messages": turns,
    }
    if system:
        body["system"] = system
    if opts.stop:
        body["stop_sequences"] = list(opts.stop)
    extra = {
        k: v for k, v in (("temperature", opts.temperature), ("top_p", opts.top_p)) if v is not None
    }
    if extra:
        body["extra_body"] = extra
    tools: list[dict[str, Any]] = [
        {"name": t.name, "description": t.description, "input_schema": t.parameters}
        for t in request.tools
    ]
    plan = WirePlan()
    choice = _map_tool_choice(request)
    if request.response_schema is not None and choice is None:
        plan = _schema_plan(request, {t["name"] for t in tools})
        schema = request.response_schema.schema
        if plan.wrapped:
            schema = {"type": "object", "properties": {"value": schema}, "required": ["value"]}
        tools.append(
            {
                "name": plan.schema_tool,
                "description": f"Give the answer as {request.response_schema.name}.",
                "input_schema": schema,
            }
        )
        choice = {"type": "tool", "name": plan.schema_tool}
    if tools:
        body["tools"] = tools
    if choice is not None:
        body["tool_choice"] = choice
    return body, plan


def _map_tool_choice(request: Request) -> dict[str, Any] | None:
    """Maps plait's choice; None means "not forced" (the API's own default, auto)."""
    choice = request.tool_choice
    if choice is None or not request.tools:
        return None
    if choice == "auto":
        return {"type": "auto"}
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        return {"type": "none"}
    names = [t.name for t in request.tools]
    if choice not in names:
        known = ", ".join(repr(n) for n in names)
        raise WireError(f"tool_choice {choice!r} is not among the request's tools ({known})")
    return {"type": "tool", "name": choice}


def _schema_plan(request: Request, taken: set[str]) -> WirePlan:
    assert request.response_schema is not None
    name = _TOOL_NAME.sub("_", request.response_schema.name)[:64] or "structured_output"
    while name in taken:
        name = f"{name[:60]}_out"
    wrapped = request.response_schema.schema.get("type") != "object"
    return WirePlan(schema_tool=name, wrapped=wrapped)


def _map_messages(messages: tuple[Message, ...]) -> tuple[str, list[dict[str, Any]]]:
    """Returns the system text and the turns, consecutive same-role turns merged."""
    system: list[str] = []
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    for index, message in enumerate(messages):
        if message.role == "system":
            if message.parts:
                raise MediaError(
                    f"messages[{index}] is a system turn with {message.media[0]!r}; the "
                    "system prompt is text only: put media in a user turn"
                )
            # The API has no mid-conversation system turn; every system text joins `system`.
            system.append(message.content)
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message, index)
        if not blocks:
            continue
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    out = []
    for role, blocks in turns:
        if len(blocks) == 1 and blocks[0]["type"] == "text":
            out.append({"role": role, "content": blocks[0]["text"]})
        else:
            out.append({"role": role, "content": blocks})
    return "\n\n".join(s for s in system if s), out


def _blocks(message: Message, index: int) -> list[dict[str, Any]]:
    if message.role == "tool":
        result: Any = message.content
        if message.parts:  # a tool that returned images: the API takes them inside the result
            result = [_part_block(part, index) for part in message.parts]
        return [
            {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id or "",
                "content": result,
            }
        ]
    blocks: list[dict[str, Any]] = []
    if message.parts:
        if message.role != "user":
            raise MediaError(
                f"messages[{index}] is a {message.role} turn with {message.media[0]!r}; "
                "images and documents go in user turns"
            )
        blocks.extend(_part_block(part, index) for part in message.parts)
    elif message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call, index)}
        )
    return blocks


def _part_block(part: Part, index: int) -> dict[str, Any]:
    """Returns the content block of one part: text, ``image`` or ``document``.

    Raises:
        MediaError: audio, which the Messages API does not take.
    """
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if isinstance(part, Image):
        return {"type": "image", "source": _source(part)}
    if isinstance(part, File):
        block = {"type": "document", "source": _source(part)}
        if part.name:
            block["title"] = part.name
        return block
    raise MediaError(
        f"messages[{index}] holds {part!r}; the Anthropic Messages API takes images and "
        "documents (PDF, text), not audio: transcribe it first, or use a provider that "
        "takes audio"
    )


def _source(part: Media) -> dict[str, Any]:
    if part.url is not None:
        return {"type": "url", "url": part.url}
    if part.media_type == "application/pdf" or isinstance(part, Image):
        return {"type": "base64", "media_type": part.media_type, "data": part.base64()}
    # A text document travels as its text (the API's "plain text" source).
    assert part.data is not None
    return {"type": "text", "media_type": "text/plain", "data": part.data.decode("utf-8")}


def _input(call: ToolCall, index: int) -> dict[str, Any]:
    try:
        value = loads(call.arguments or "{}")
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise WireError(
            f"messages[{index}] calls tool {call.name!r} with arguments that are not a JSON "
            f"object ({call.arguments[:80]!r}); Anthropic needs an object as tool input"
        )
    return value


# -- reading replies ------------------------------------------------------------------------
# The SDK builds its reply objects without validating them, so a field may be
# missing or hold any JSON; every field used is checked (`expect`) and a wrong
# one raises `MalformedReply` naming its path. The same readers take the
# reply's JSON as dicts.


def _field(container: Any, name: str) -> Any:
    """Returns a field of an SDK object or of a dict; None when it is absent."""
    if isinstance(container, dict):
        return container.get(name)
    return getattr(container, name, None)


def _object(value: Any, path: str) -> Any:
    """Returns ``value`` if it is an object (an SDK object or a dict); raises `MalformedReply`."""
    if value is None or isinstance(value, str | bytes | int | float | list | tuple):
        raise MalformedReply(f"{path} is {kind_of(value)}, expected an object")
    return value


def _text_field(container: Any, name: str, path: str) -> str:
    return expect(_field(container, name), str, f"{path}.{name}")


def _usage(usage: Any, path: str) -> Usage:
    if usage is None:
        return Usage()
    _object(usage, path)
    # Cached prompt tokens are reported apart from input_tokens; all of them were read.
    total_in = sum(
        token_count(_field(usage, name), f"{path}.{name}")
        for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    output = token_count(_field(usage, "output_tokens"), f"{path}.output_tokens")
    return Usage(input_tokens=total_in, output_tokens=output)


def _finish(stop_reason: str | None, plan: WirePlan) -> str | None:
    if stop_reason is None:
        return None
    if plan.schema_tool and stop_reason == "tool_use":
        return "stop"
    return _FINISH.get(stop_reason, stop_reason)


def _schema_text(data: Any, plan: WirePlan) -> str:
    if plan.wrapped and isinstance(data, dict):
        data = data.get("value")
    return json.dumps(data, ensure_ascii=False)


def read_message(message: Any, plan: WirePlan) -> Response:
    """Turns a Messages API reply (the SDK's ``Message``, or its JSON) into a `Response`.

    Blocks of other kinds (``thinking`` ...) are skipped.

    Raises:
        MalformedReply: a field it uses is missing or of the wrong kind (named by its path).
    """
    _object(message, "the reply")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(expect(_field(message, "content"), list, "content")):
        path = f"content[{index}]"
        kind = _field(_object(block, path), "type")
        if kind == "text":
            texts.append(_text_field(block, "text", path))
        elif kind == "tool_use":
            arguments = expect(_field(block, "input"), dict, f"{path}.input")
            name = _text_field(block, "name", path)
            if name == plan.schema_tool:
                texts = [_schema_text(arguments, plan)]
            else:
                call_id = _text_field(block, "id", path)
                calls.append(ToolCall(id=call_id, name=name, arguments=json.dumps(arguments)))
    return Response(
        text="".join(texts),
        tool_calls=tuple(calls),
        usage=_usage(_field(message, "usage"), "usage"),
        finish_reason=_finish(optional_text(_field(message, "stop_reason"), "stop_reason"), plan),
        model=optional_text(_field(message, "model"), "model"),
    )


@dataclass(slots=True)
class _OpenBlock:
    kind: str
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)


class StreamAssembler:
    """Turns raw Messages API stream events into `StreamChunk`s.

    Text deltas pass straight through; a tool call's input JSON arrives in
    fragments and is handed on whole when its block closes. Usage comes from
    ``message_start`` (input) and ``message_delta`` (cumulative output).
    A structured reply (the forced schema tool) is also delivered whole, as
    text, so streamed and whole replies carry the same JSON. Events of other
    types (``ping``, ``message_stop`` ...) carry nothing used here.
    """

    def __init__(self, plan: WirePlan) -> None:
        self._plan = plan
        self._blocks: dict[int, _OpenBlock] = {}
        self._usage = Usage()
        self._stop_reason: str | None = None
        self.model: str | None = None

    def feed(self, event: Any) -> StreamChunk | None:
        """Takes one event; returns the chunk it completes, if any.

        Raises:
            MalformedReply: a field it uses is missing or of the wrong kind
                (named by its path, e.g. ``message_start.message.usage``).
        """
        kind = _field(_object(event, "the event"), "type")
        if kind == "message_start":
            message = _object(_field(event, "message"), "message_start.message")
            self.model = optional_text(_field(message, "model"), "message_start.message.model")
            self._usage = _usage(_field(message, "usage"), "message_start.message.usage")
        elif kind == "content_block_start":
            block = _object(_field(event, "content_block"), f"{kind}.content_block")
            return self._start(_index(event, kind), block)
        elif kind == "content_block_delta":
            return self._delta(
                _index(event, kind), _object(_field(event, "delta"), f"{kind}.delta")
            )
        elif kind == "content_block_stop":
            return self._stop(_index(event, kind))
        elif kind == "message_delta":
            delta = _object(_field(event, "delta"), f"{kind}.delta")
            stop_reason = optional_text(_field(delta, "stop_reason"), f"{kind}.delta.stop_reason")
            self._stop_reason = stop_reason or self._stop_reason
            self._merge_usage(_field(event, "usage"), f"{kind}.usage")
        return None

    def finish(self) -> StreamChunk:
        """Returns the last chunk, with finish reason and usage."""
        return StreamChunk(finish_reason=_finish(self._stop_reason, self._plan), usage=self._usage)

    def _start(self, index: int, block: Any) -> StreamChunk | None:
        path = "content_block_start.content_block"
        kind = _field(block, "type")
        if kind == "tool_use":
            call_id, name = _text_field(block, "id", path), _text_field(block, "name", path)
            self._blocks[index] = _OpenBlock("tool_use", call_id, name)
            return None
        self._blocks[index] = _OpenBlock(kind if isinstance(kind, str) else "")
        text = _text_field(block, "text", path) if kind == "text" else ""
        return StreamChunk(text=text) if text else None

    def _delta(self, index: int, delta: Any) -> StreamChunk | None:
        path = "content_block_delta.delta"
        block = self._blocks.get(index)
        kind = _field(delta, "type")
        if kind == "text_delta":
            text = _text_field(delta, "text", path)
            return StreamChunk(text=text) if text else None
        if kind == "input_json_delta" and block is not None:
            block.parts.append(_text_field(delta, "partial_json", path))
        return None

    def _stop(self, index: int) -> StreamChunk | None:
        block = self._blocks.pop(index, None)
        if block is None or block.kind != "tool_use":
            return None
        arguments = "".join(block.parts) or "{}"
        if block.name == self._plan.schema_tool:
            try:
                return StreamChunk(text=_schema_text(loads(arguments), self._plan))
            except ValueError:
                return StreamChunk(text=arguments)  # cut short by max_tokens: shown as sent
        return StreamChunk(
            tool_calls=(ToolCall(id=block.id, name=block.name, arguments=arguments),)
        )

    def _merge_usage(self, usage: Any, path: str) -> None:
        if usage is None:
            return
        _object(usage, path)
        output = token_count(_field(usage, "output_tokens"), f"{path}.output_tokens")
        self._usage.output_tokens = output or self._usage.output_tokens
        if _field(usage, "input_tokens"):
            # Newer API versions repeat cumulative input counts here.
            self._usage = Usage(
                input_tokens=_usage(usage, path).input_tokens,
                output_tokens=self._usage.output_tokens,
            )


def _index(event: Any, kind: str) -> int:
    index: int = expect(_field(event, "index"), int, f"{kind}.index")
    return index
