"""Provider-neutral request and response types.

Every backend translates a `Request` into its own wire format and its answer
back into a `Response`; nothing above the backend layer sees a provider's
dialect. The types are frozen dataclasses so a request can be hashed into a
cache key and shared between concurrent calls without copying.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from plait.media import Media

__all__ = [
    "HoldsUsage",
    "Message",
    "Part",
    "Price",
    "Request",
    "Response",
    "ResponseSchema",
    "SamplingOptions",
    "StreamChunk",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "message_from_dict",
    "message_to_dict",
    "tool_call_from_dict",
]

Role = Literal["system", "user", "assistant", "tool"]

Part = str | Media
"""One piece of a turn: text, or an `Image`, `Audio` or `File` (plait.media)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call the model asked for."""

    id: str
    """Provider's id for the call; a tool result answers it by this id."""
    name: str
    """Name of the tool to call."""
    arguments: str
    """Arguments as the JSON text the model produced (may be invalid JSON)."""


@dataclass(frozen=True, slots=True)
class Message:
    """One turn of a conversation.

    A turn that shows the model images, audio or documents is built from
    parts, in the order the model should see them::

        Message("user", ["What is the total of this invoice?", Image("invoice.png")])

    The list is kept in `parts`, and `content` holds the text of the parts
    joined, so code that reads only text keeps working. A text-only turn has
    no parts.
    """

    role: Role
    """Who speaks: ``system``, ``user``, ``assistant`` or ``tool``."""
    content: str = ""
    """The text of the turn (for a turn with parts, their text joined by blank lines)."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Calls an assistant turn made (empty for other roles)."""
    tool_call_id: str | None = None
    """For a ``tool`` turn: the id of the call it answers."""
    name: str | None = None
    """For a ``tool`` turn: the tool's name (some providers require it)."""
    parts: tuple[Part, ...] = ()
    """Text and media in order, when the turn holds media; empty for a text-only turn."""

    def __post_init__(self) -> None:
        if type(self.content) is not str:  # a list of parts given as the content
            object.__setattr__(self, "parts", _parts_of(self.content))
            object.__setattr__(self, "content", "")
        if self.parts:
            parts = self.parts if type(self.parts) is tuple else _parts_of(self.parts)
            if not self.content:
                text = [part for part in parts if isinstance(part, str)]
                object.__setattr__(self, "content", "\n\n".join(text))
            if not any(isinstance(part, Media) for part in parts):
                parts = ()  # text alone is plain content
            object.__setattr__(self, "parts", parts)

    @property
    def media(self) -> tuple[Media, ...]:
        """The images, audio and documents of the turn, in order."""
        return tuple(part for part in self.parts if isinstance(part, Media))

    # A message also reads as its OpenAI-style dict (code that keeps conversations
    # as such dicts keeps working): message["role"], message.get("tool_calls"), dict(message), and
    # it equals the dict that `message_to_dict` makes of it.
    def __getitem__(self, key: str) -> Any:
        return message_to_dict(self)[key]

    def get(self, key: str, default: Any = None) -> Any:
        """Returns the value under ``key`` of the message's OpenAI-style dict, or ``default``."""
        return message_to_dict(self).get(key, default)

    def keys(self) -> Any:
        """Returns the keys of the message's OpenAI-style dict (the parts that are set)."""
        return message_to_dict(self).keys()

    def __iter__(self) -> Any:
        return iter(self.keys())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Message):
            return (
                self.role == other.role
                and self.content == other.content
                and self.tool_calls == other.tool_calls
                and self.tool_call_id == other.tool_call_id
                and self.name == other.name
                and self.parts == other.parts
            )
        if isinstance(other, Mapping):
            return message_to_dict(self) == dict(other)
        return NotImplemented


def _parts_of(content: Any) -> tuple[Part, ...]:
    """Returns the parts of a list of text and media (text parts may be OpenAI dicts)."""
    if isinstance(content, Media):
        return (content,)
    if not isinstance(content, Sequence) or isinstance(content, bytes):
        raise TypeError(
            f"a message's content is text or a list of text and media, not {type(content).__name__}"
        )
    parts: list[Part] = []
    for index, part in enumerate(content):
        if isinstance(part, str | Media):
            parts.append(part)
        elif isinstance(part, Mapping) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
        else:
            raise TypeError(
                f"part {index} of a message is {type(part).__name__}; expected text, "
                "an Image, Audio or File, or {'type': 'text', 'text': ...}"
            )
    return tuple(parts)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call, described by a JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema (an ``object``) of the arguments."""


@dataclass(frozen=True, slots=True)
class ResponseSchema:
    """A JSON schema the reply must follow (structured output)."""

    name: str
    """A short identifier; OpenAI requires one for ``json_schema`` mode."""
    schema: dict[str, Any]
    """The JSON schema of the whole reply."""
    strict: bool = False
    """Ask the provider for strict schema adherence where it offers that."""


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """Sampling settings; None means "the provider's default", and is not sent."""

    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    stop: tuple[str, ...] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """Returns the options that are set, by name (for the wire and for cache keys)."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True, slots=True)
class Request:
    """Everything a backend needs to make one model call."""

    messages: tuple[Message, ...]
    """The conversation, oldest first. A system turn, if any, comes first."""
    model: str | None = None
    """Overrides the endpoint's model for this call."""
    options: SamplingOptions = field(default_factory=SamplingOptions)
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str | None = None
    """``auto``, ``none``, ``required`` or a tool name to force."""
    response_schema: ResponseSchema | None = None
    timeout: float | None = None
    """Seconds for the whole call; None uses the endpoint's timeout."""
    rollout_id: str | None = None
    """Distinguishes deliberate repeat samples in the response cache; never sent."""

    @property
    def system(self) -> str | None:
        """Returns the text of the leading system turn, if there is one."""
        if self.messages and self.messages[0].role == "system":
            return self.messages[0].content
        return None

    def with_messages(self, messages: tuple[Message, ...]) -> Request:
        """Returns a copy with another conversation (for re-asks)."""
        return replace(self, messages=messages)


@dataclass(slots=True)
class Usage:
    """What model calls consumed: tokens, dollars and cache hits, of one call or summed over many.

    The one record of usage in plait: a `Response` carries one, and every other
    record of usage holds one as its ``usage`` (a profiler's `NodeTiming` and
    `RequestTiming`, a module's `TraceRecord`, an evaluation's `ExampleRow`, a
    `UsageMeter`, an endpoint's totals), or is built from its fields (a served
    run's ``usage`` schema); their ``input_tokens`` / ``output_tokens`` / ``cost``
    / ``cache_hit`` read it. ``a + b`` returns the sum of two; ``total += usage``
    adds to a running total in place (no new object per call on the hot path),
    so a running total owns its `Usage`, and a usage once handed out (a
    response's, a record's) is not changed.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    """Dollars at the endpoint's price. 0.0 also when the cost is unknown: an endpoint
    without a price (the profiler names its alias in ``unpriced``, the run report says
    so) is the one way plait says a cost is unknown; a cache hit costs 0.0."""
    cached: int = 0
    """Calls among these answered from a response cache (0 or 1 for one call; its
    tokens are the original call's, its cost 0.0)."""

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def cache_hit(self) -> bool:
        """Whether a call (any, for a sum) was answered from a response cache."""
        return self.cached > 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cost + other.cost,
            self.cached + other.cached,
        )

    def __iadd__(self, other: Usage) -> Usage:
        """Adds another call's usage to this running total, in place."""
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cost += other.cost
        self.cached += other.cached
        return self


class HoldsUsage:
    """The usage facts of a record that holds a `Usage` as ``usage``, by their names.

    Records of a call or a piece of work (`NodeTiming`, `TraceRecord`,
    `ExampleRow`, `UsageMeter` …) keep their tokens, cost and cache hits in one
    `Usage` instead of declaring the fields again; these read-only properties
    keep the names their readers use (``record.input_tokens``).
    """

    __slots__ = ()
    usage: Usage

    @property
    def input_tokens(self) -> int:
        return self.usage.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.usage.output_tokens

    @property
    def cost(self) -> float:
        return self.usage.cost

    @property
    def cached(self) -> int:
        return self.usage.cached

    @property
    def cache_hit(self) -> bool:
        return self.usage.cache_hit


@dataclass(frozen=True, slots=True)
class Price:
    """What a model charges, in dollars per million tokens (`Usage.cost` is made from it)."""

    input: float
    """Dollars per million prompt (input) tokens."""
    output: float
    """Dollars per million completion (output) tokens."""

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        """Returns the dollar cost of a call with these token counts."""
        return (input_tokens * self.input + output_tokens * self.output) / 1_000_000


@dataclass(slots=True)
class Response:
    """A finished model call."""

    text: str
    """The reply text (empty when the model only called tools)."""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    """``stop``, ``length``, ``tool_calls`` … as the provider reports it, normalised."""
    model: str | None = None
    """The model that actually answered."""
    parsed: Any = None
    """The typed object, when a response type was requested and parsing succeeded."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Extra facts (cache hit, latency, attempts) added by the layers above."""


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """A piece of a streamed reply."""

    text: str = ""
    """New reply text since the previous chunk."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls completed in this chunk (delivered whole, not as fragments)."""
    finish_reason: str | None = None
    usage: Usage | None = None
    """Set on the last chunk when the provider reports usage."""


_ROLES = ("system", "user", "assistant", "tool")


def message_to_dict(message: Message) -> dict[str, Any]:
    """Returns a message as an OpenAI-style dict with only the parts that are set.

    A turn with media has as content a list of ``{"type": "text", "text": ...}``
    parts and the media values themselves (each provider spells those its own way).
    """
    content: Any = message.content
    if message.parts:
        content = [
            {"type": "text", "text": part} if isinstance(part, str) else part
            for part in message.parts
        ]
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def as_message(turn: Any, where: str) -> Message:
    """Returns ``turn`` as a `Message`: a Message as it is, an OpenAI-style dict read.

    The one rule for a turn that a user hands plait (a history item, a prompt
    item): anything else is a TypeError that names ``where`` and says what fits.
    """
    if isinstance(turn, Message):
        return turn
    if isinstance(turn, Mapping):
        return message_from_dict(turn, where)
    raise TypeError(
        f"{where} is {type(turn).__name__}; expected a Message or {{'role': ..., 'content': ...}}"
    )


def message_from_dict(item: Mapping[str, Any], where: str = "message") -> Message:
    """Returns the `Message` an OpenAI-style dict describes (the inverse of `message_to_dict`).

    Content may be text, None (a turn that only called tools) or a list of
    text parts (``[{"type": "text", "text": ...}]``) and media values
    (`plait.Image`, `Audio`, `File`); tool calls may be nested
    (``{"function": {"name", "arguments"}}``) or flat (``{"name", "arguments"}``).

    Raises:
        ValueError: the role is missing or unknown, or the content is neither
            text nor text parts; the message names ``where``.
    """
    role = item.get("role")
    if role not in _ROLES:
        raise ValueError(f"{where}: role must be system, user, assistant or tool; got {role!r}")
    calls = tuple(
        tool_call_from_dict(call, f"{where} tool call {i}")
        for i, call in enumerate(item.get("tool_calls") or ())
    )
    content = item.get("content")
    if isinstance(content, list) and any(isinstance(part, Media) for part in content):
        try:
            parts = _parts_of(content)
        except TypeError as exc:
            raise ValueError(f"{where}: {exc}") from None
        return Message(role, "", tool_calls=calls, parts=parts)
    return Message(
        role,
        _content_text(content, where),
        tool_calls=calls,
        tool_call_id=item.get("tool_call_id"),
        name=item.get("name"),
    )


def tool_call_from_dict(call: Any, where: str = "tool call") -> ToolCall:
    """Returns the `ToolCall` an OpenAI-style dict describes (nested ``function`` or flat).

    Raises:
        ValueError: ``call`` is not a mapping; the message names ``where``.
    """
    if not isinstance(call, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(call).__name__}")
    function = call.get("function")
    source = function if isinstance(function, Mapping) else call
    arguments = source.get("arguments")
    if not isinstance(arguments, str):
        import json  # import time: only a tool call given as a dict

        arguments = "" if arguments is None else json.dumps(arguments)
    return ToolCall(
        id=str(call.get("id") or ""), name=str(source.get("name") or ""), arguments=arguments
    )


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, Mapping) and part.get("type") == "text" for part in content
    ):
        return "".join(str(part.get("text", "")) for part in content)
    raise ValueError(
        f"{where}: content must be text or a list of text parts, got {type(content).__name__}"
    )
