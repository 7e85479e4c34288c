"""Translates plait requests into llama-cpp-python chat calls, and replies back.

Kept apart from `backend.py` because none of it needs llama_cpp: it is pure
data mapping, testable and importable without the compiled library.

How tools reach a model that has no tool-calling chat template (SmolLM2's
template renders only ``role`` and ``content``):

* the tools are described in a note appended to the system turn;
* a *forced* call (``tool_choice`` is a tool name, or ``"required"`` with one
  tool) constrains decoding to the tool's parameter schema, so the reply is
  always JSON of the right shape;
* ``"required"`` with several tools constrains decoding to
  ``{"name": <one of the tools>, "arguments": {...}}``;
* ``"auto"`` cannot be constrained (the model may answer in prose), so the
  note asks for ``<tool_call>{...}</tool_call>`` and the reply is scanned for
  such blocks; a small model rarely writes them, and then the reply is text.

How a conversation reaches a chat format that shows fewer turns: some
formats have no system turn (llama-cpp-python's ``"gemma"``) and most named
formats no ``tool`` turn; they leave those messages out of the prompt. Turns a
format does not show (`ChatTurns`, found once per loaded model) are rewritten
into user turns, so a program's instructions and a tool's results still reach
the model: system text goes at the head of the next user turn, a tool result
becomes a user turn of its own.

How a choice among labels is decoded: a response schema whose only field is
an enum (``Literal["True", "False"]``, an ``Enum``, a signature with one
``Literal`` output) is decoded with a grammar of the *bare* labels, and the
label is then written back as the JSON object the schema describes
(``{"value": "True"}``), so parsing is unchanged. Decoding the JSON instead
makes the model choose the label after ``{"value": "``, where a small model's
preference no longer follows the question. Measured on SmolLM2-135M, BBH
``boolean_expressions`` (100 test items, the same prompt, greedy): text 0.64,
JSON grammar 0.56 (96 of 100 answers "True"), bare labels 0.64; on
``sports_understanding`` 0.59 / 0.57 / 0.59 (``benchmarks/labels_bench.py``).

llama-cpp-python's own tool paths (0.3.36) are not used: its template handler
forces a tool by grammar but never shows the tool to a template like
SmolLM2's, and its ``chatml-function-calling`` handler constrains an "auto"
text reply to the function-name grammar (the text comes back empty), drops
``max_tokens`` on that path, and raises when "auto" is streamed.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from plait._jsontext import loads
from plait.backends.types import Message, Request, ToolCall, ToolSpec

__all__ = ["ChatPlan", "ChatTurns", "ToolCallFilter", "build_plan"]

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"

Mode = Literal["text", "schema", "label", "forced", "choose", "auto"]


@dataclass(frozen=True, slots=True)
class ChatTurns:
    """What the loaded model's chat format shows of a conversation."""

    tools: bool = False
    """It renders ``tools`` and assistant ``tool_calls`` itself (else they go in the text)."""
    system: bool = True
    """It shows a system turn."""
    tool_results: bool = True
    """It shows a ``tool`` turn."""


@dataclass(slots=True)
class ChatPlan:
    """What to send to llama-cpp-python and how to read its reply."""

    mode: Mode
    """``text`` plain reply; ``schema`` JSON reply; ``label`` one of `labels`,
    bare, given back as JSON; ``forced`` the reply is the arguments of `tool`;
    ``choose`` the reply names one of several tools; ``auto`` the reply may
    contain ``<tool_call>`` blocks."""
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool: ToolSpec | None = None
    """The forced tool (mode ``forced``)."""
    note: str | None = None
    """Tool description appended to the system turn when the template cannot render tools."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``create_chat_completion`` except ``messages``, ``tools``
    and ``grammar``."""
    labels: LabelChoice | None = None
    """The labels to choose from (mode ``label``)."""

    def chat_messages(self, turns: ChatTurns) -> list[dict[str, Any]]:
        """Returns the conversation in the OpenAI-style dicts llama-cpp-python expects.

        Every turn is written as one the chat format shows (`ChatTurns`).
        """
        inline = not turns.tools
        out = [_map_message(m, inline_tool_calls=inline) for m in self.messages]
        if inline and self.note:
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{self.note}"}
            else:
                out.insert(0, {"role": "system", "content": self.note})
        if turns.system and turns.tool_results:
            return out
        return _as_shown_turns(out, turns)

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """Returns the tools in OpenAI shape, for chat templates that render them."""
        if not self.tools:
            return None
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in self.tools
        ]

    def read_reply(self, text: str) -> tuple[str, tuple[ToolCall, ...]]:
        """Splits a finished reply into text and tool calls, as this plan's mode implies."""
        if self.mode == "forced":
            assert self.tool is not None
            return "", (ToolCall(id=_call_id(), name=self.tool.name, arguments=text),)
        if self.mode == "choose":
            return _read_choice(text, self.tools)
        if self.mode == "label":
            assert self.labels is not None
            return self.labels.as_json(text), ()
        if self.mode == "auto":
            reader = ToolCallFilter(self.tools)
            head = reader.feed(text)
            tail, calls = reader.finish()
            return head + tail, calls
        return text, ()


def build_plan(request: Request, *, seed: int | None) -> ChatPlan:
    """Decides how a request is decoded: plain, JSON schema, forced or free tool use.

    Args:
        request: the provider-neutral request.
        seed: the sampling seed for this call (the backend derives it).

    Raises:
        ValueError: ``tool_choice`` names a tool the request does not carry.
    """
    options = _sampling(request, seed)
    tools = request.tools
    choice = request.tool_choice
    if not tools or choice == "none":
        return _schema_or_text(request, options)
    by_name = {t.name: t for t in tools}
    if choice not in (None, "auto", "required"):
        if choice not in by_name:
            known = ", ".join(repr(n) for n in by_name)
            raise ValueError(f"tool_choice {choice!r} is not among the request's tools ({known})")
        tool = by_name[choice]
        options["response_format"] = _json_format(tool.parameters)
        return ChatPlan(
            "forced", request.messages, tools, tool, _forced_note(tool), options=options
        )
    if choice == "required":
        if len(tools) == 1:
            tool = tools[0]
            options["response_format"] = _json_format(tool.parameters)
            return ChatPlan(
                "forced", request.messages, tools, tool, _forced_note(tool), options=options
            )
        options["response_format"] = _json_format(_choice_schema(tools))
        return ChatPlan("choose", request.messages, tools, None, _choose_note(tools), options)
    if request.response_schema is not None:
        # A schema constrains every token to JSON, so no <tool_call> block could appear.
        return _schema_or_text(request, options)
    return ChatPlan("auto", request.messages, tools, None, _auto_note(tools), options=options)


def _schema_or_text(request: Request, options: dict[str, Any]) -> ChatPlan:
    if request.response_schema is None:
        return ChatPlan("text", request.messages, options=options)
    labels = LabelChoice.of(request.response_schema.schema)
    if labels is not None:
        return ChatPlan("label", request.messages, options=options, labels=labels)
    options["response_format"] = _json_format(request.response_schema.schema)
    return ChatPlan("schema", request.messages, options=options)


@dataclass(frozen=True, slots=True)
class LabelChoice:
    """A schema whose one field takes one of a few values: decoded as a bare label."""

    key: str
    """The field the label is written back under."""
    values: tuple[Any, ...]
    """The allowed JSON values (strings, numbers, booleans)."""

    @classmethod
    def of(cls, schema: dict[str, Any]) -> LabelChoice | None:
        """Returns the choice a schema describes, or None when it is not one enum field."""
        properties = schema.get("properties")
        if schema.get("type") != "object" or not isinstance(properties, dict):
            return None
        if len(properties) != 1:
            return None
        ((key, spec),) = properties.items()
        if key not in schema.get("required", ()):
            return None
        spec = _resolve(spec, schema)
        values = spec.get("enum") if "const" not in spec else [spec["const"]]
        if not isinstance(values, list) or not values:
            return None
        if not all(isinstance(v, str | int | float) and v == v for v in values):
            return None  # bool is an int; NaN is no label
        texts = [cls._text(v) for v in values]
        if len(set(texts)) != len(texts) or not all(texts):
            return None
        return cls(key, tuple(values))

    @staticmethod
    def _text(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value)

    @property
    def counts(self) -> bool:
        """Whether every label is a whole number written in digits (a count, a rating)."""
        return all(self._text(v).isdigit() for v in self.values)

    def grammar(self) -> str:
        """Returns a GBNF grammar that accepts exactly the labels, bare; counts after a lead-in.

        For numbers the reply may start with a few words without digits and
        may end the number with one non-digit: ``There are 3.``. Why: a model
        writes a count after words ("There are …"), and bare digits put it in
        a bind where one label is a prefix of another ("1" of "10"): after a
        "1" it may only stop or add a digit. SmolLM2-135M, counting objects
        (BBH ``object_counting``, labels 0–20, 100 test items): bare digits
        0.04 (87 answers "10"), text 0.07, with the lead-in 0.12.
        """
        labels = " | ".join(_gbnf_literal(self._text(v)) for v in self.values)
        if not self.counts:
            return f"root ::= {labels}"
        return f"root ::= lead? ({labels}) [^0-9]?\nlead ::= [^0-9\\n]{{1,{COUNT_LEAD_IN_CHARS}}}"

    def as_json(self, text: str) -> str:
        """Returns the reply as the JSON object of the schema; a cut-off label stays text."""
        if self.counts and (number := re.search(r"[0-9]+", text)) is not None:
            text = number.group(0)
        for value in self.values:
            if self._text(value) == text:
                return json.dumps({self.key: value}, ensure_ascii=False)
        return json.dumps({self.key: text}, ensure_ascii=False)


COUNT_LEAD_IN_CHARS = 60
"""Most characters of words a count's reply may start with (see `LabelChoice.grammar`)."""


def _resolve(spec: Any, schema: dict[str, Any]) -> dict[str, Any]:
    """Follows one local ``$ref`` (pydantic puts an Enum's values under ``$defs``)."""
    if not isinstance(spec, dict):
        return {}
    ref = spec.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = schema.get("$defs", {}).get(ref.removeprefix("#/$defs/"))
        return target if isinstance(target, dict) else {}
    return spec


def _gbnf_literal(text: str) -> str:
    """Returns ``text`` as a GBNF string literal (quotes, backslashes, controls escaped)."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _sampling(request: Request, seed: int | None) -> dict[str, Any]:
    opts = request.options
    out: dict[str, Any] = {}
    for name in ("temperature", "max_tokens", "top_p", "presence_penalty", "frequency_penalty"):
        value = getattr(opts, name)
        if value is not None:
            out[name] = value
    if opts.stop:
        out["stop"] = list(opts.stop)
    if seed is not None:
        out["seed"] = seed
    return out


def _json_format(schema: dict[str, Any]) -> dict[str, Any]:
    # llama-cpp-python 0.3.36 turns {"type": "json_object", "schema": ...} into a GBNF
    # grammar (llama_chat_format._grammar_for_response_format); "json_schema" is not read.
    return {"type": "json_object", "schema": schema}


def _choice_schema(tools: tuple[ToolSpec, ...]) -> dict[str, Any]:
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                "required": ["name", "arguments"],
            }
            for t in tools
        ]
    }


def _describe(tools: tuple[ToolSpec, ...]) -> str:
    lines = []
    for t in tools:
        lines.append(f"- {t.name}: {t.description}")
        lines.append(f"  arguments (JSON schema): {json.dumps(t.parameters)}")
    return "\n".join(lines)


def _forced_note(tool: ToolSpec) -> str:
    return (
        f"Call the tool {tool.name!r} now: {tool.description}\n"
        f"Reply with only its arguments, a JSON object following this schema: "
        f"{json.dumps(tool.parameters)}"
    )


def _choose_note(tools: tuple[ToolSpec, ...]) -> str:
    return (
        "Call exactly one of these tools:\n"
        f"{_describe(tools)}\n"
        'Reply with only {"name": <tool name>, "arguments": <its arguments>}.'
    )


def _auto_note(tools: tuple[ToolSpec, ...]) -> str:
    return (
        "You can call these tools:\n"
        f"{_describe(tools)}\n"
        "To call one, reply with exactly "
        f'{TOOL_OPEN}{{"name": <tool name>, "arguments": <its arguments>}}{TOOL_CLOSE}; '
        "otherwise answer normally."
    )


def _map_message(message: Message, *, inline_tool_calls: bool) -> dict[str, Any]:
    if message.role == "tool":
        return {
            "role": "tool",
            "content": message.content,
            "tool_call_id": message.tool_call_id or "",
        }
    if message.role != "assistant" or not message.tool_calls:
        return {"role": message.role, "content": message.content}
    if inline_tool_calls:
        # The template prints only content, so the call must be in the text to be seen.
        blocks = "".join(
            f'{TOOL_OPEN}{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}{TOOL_CLOSE}'
            for c in message.tool_calls
        )
        content = f"{message.content}\n{blocks}" if message.content else blocks
        return {"role": "assistant", "content": content}
    return {
        "role": "assistant",
        "content": message.content,
        "tool_calls": [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in message.tool_calls
        ],
    }


def _as_shown_turns(messages: list[dict[str, Any]], turns: ChatTurns) -> list[dict[str, Any]]:
    """Rewrites the turns a chat format would leave out into user turns it shows.

    System text is held until the next user turn and put at its head (or
    becomes a user turn at the end when none follows); a tool result becomes
    a user turn.
    """
    out: list[dict[str, Any]] = []
    held: list[str] = []
    for message in messages:
        role = message["role"]
        if role == "system" and not turns.system:
            held.append(message["content"])
            continue
        if role == "tool" and not turns.tool_results:
            message = {"role": "user", "content": f"Tool result: {message['content']}"}
        if message["role"] == "user" and held:
            message = {**message, "content": "\n\n".join([*held, message["content"]])}
            held = []
        out.append(message)
    if held:
        out.append({"role": "user", "content": "\n\n".join(held)})
    return out


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _read_choice(text: str, tools: tuple[ToolSpec, ...]) -> tuple[str, tuple[ToolCall, ...]]:
    """Reads ``{"name": ..., "arguments": ...}``; a truncated reply stays text."""
    call = _parse_call(text, {t.name for t in tools})
    return (text, ()) if call is None else ("", (call,))


def _parse_call(text: str, names: set[str]) -> ToolCall | None:
    """Returns the call of a known tool that ``text`` spells as ``{"name", "arguments"}``.

    None for anything else (not JSON, nested too deeply, a name that is not
    one of ``names``): the caller shows it as text rather than lose it.
    Arguments given as an object are passed on as its JSON text.
    """
    try:
        data = loads(text)
    except ValueError:
        return None
    name = data.get("name") if isinstance(data, dict) else None
    if not isinstance(name, str) or name not in names:
        return None
    arguments = data.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return ToolCall(id=_call_id(), name=name, arguments=arguments)


_BLOCK = re.compile(re.escape(TOOL_OPEN) + r"(.*?)" + re.escape(TOOL_CLOSE), re.DOTALL)


class ToolCallFilter:
    """Separates ``<tool_call>`` blocks from streamed reply text.

    Text is passed through as it arrives, except from the first ``<`` that
    may begin a block: that part is held back until it is known to be plain
    text, or until the reply ends. Blocks that parse as a call of a known
    tool become `ToolCall`s; anything else is given back as text, so a
    malformed block is visible rather than lost.
    """

    def __init__(self, tools: tuple[ToolSpec, ...]) -> None:
        self._names = {t.name for t in tools}
        self._held = ""

    def feed(self, text: str) -> str:
        """Takes new reply text and returns the part that is certainly not a tool call."""
        self._held += text
        start = self._held.find("<")
        while start != -1:
            rest = self._held[start:]
            if rest.startswith(TOOL_OPEN) or TOOL_OPEN.startswith(rest):
                out, self._held = self._held[:start], rest
                return out
            start = self._held.find("<", start + 1)
        out, self._held = self._held, ""
        return out

    def finish(self) -> tuple[str, tuple[ToolCall, ...]]:
        """Returns the held-back text with blocks removed, and the calls they held."""
        calls: list[ToolCall] = []

        def take(match: re.Match[str]) -> str:
            call = _parse_call(match.group(1), self._names)
            if call is None:
                return match.group(0)
            calls.append(call)
            return ""

        text = _BLOCK.sub(take, self._held).strip() if TOOL_OPEN in self._held else self._held
        self._held = ""
        return text, tuple(calls)
