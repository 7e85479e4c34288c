"""Adapters: a signature + input values (+ demos, + history) → messages; a reply → typed outputs.

An adapter is the only place that knows how a task is *worded* for a model.
Two ship with plait:

* `JSONAdapter` (the default) asks for one JSON object through the backend's
  schema mode (OpenAI ``json_schema``, llama.cpp grammars, Anthropic tools),
  so even a 135M model can only answer in the right shape;
* `ChatAdapter` marks fields with headers like ``[[ ## answer ## ]]`` for
  backends without a schema mode, and parses leniently;
* `PlainAdapter` sends a one-input, one-output step as plainly as a chat can:
  the instructions, the input's text, the output's bare value. What the
  smallest models follow best.

Both parse with pydantic through the signature's output model and raise
`StructuredOutputError` naming the field that is wrong, which `Predict` shows
to the model in its one re-ask.

An input field holding an `Image`, `Audio` or `File` (or a list of them) is
not written as text: the adapter leaves a slot where its value would stand,
and the user turn becomes parts, the media in their slots (`with_media`), so
every adapter words the turn as usual and the backend sends the media in the
provider's form.
"""

from __future__ import annotations

import enum
import json
import re
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from plait._jsondata import as_json_data
from plait._jsontext import loads
from plait.backends.types import Message, Response, ResponseSchema
from plait.errors import StructuredOutputError
from plait.media import Media
from plait.signatures._models import outputs_of
from plait.signatures.media_inputs import media_inputs
from plait.signatures.signature import FieldSpec, Signature, type_label

__all__ = [
    "Adapter",
    "ChatAdapter",
    "JSONAdapter",
    "PlainAdapter",
    "format_value",
    "validate_outputs",
    "with_media",
]


@runtime_checkable
class Adapter(Protocol):
    """What `Predict` needs from an adapter. Implement these three methods to write your own."""

    def format(
        self,
        signature: type[Signature],
        inputs: Mapping[str, Any],
        demos: Sequence[Mapping[str, Any]] = (),
        history: Sequence[Message] = (),
    ) -> tuple[Message, ...]:
        """Returns the conversation to send: system, demos, history, then the inputs."""
        ...

    def response_schema(self, signature: type[Signature]) -> ResponseSchema | None:
        """Returns the JSON schema the reply must follow, or None to send none."""
        ...

    def parse(self, signature: type[Signature], response: Response) -> dict[str, Any]:
        """Returns the typed output values by field name.

        Raises:
            StructuredOutputError: the reply does not hold valid outputs; the
                message names the field(s) at fault.
        """
        ...


# ------------------------------------------------------------------ values
# Private-use characters around a media item's key mark where it stands in a turn's text.
_SLOT_OPEN, _SLOT_CLOSE = "\ue000", "\ue001"
_SLOT = re.compile(f"{_SLOT_OPEN}([^{_SLOT_CLOSE}]*){_SLOT_CLOSE}")


def format_value(value: Any) -> str:
    """Returns how a value is shown to a model: text as is, anything else as compact JSON.

    Media (and lists of media) become slots that `with_media` fills with the items.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, Media):
        return f"{_SLOT_OPEN}{value.key}{_SLOT_CLOSE}"
    if isinstance(value, list | tuple) and value and all(isinstance(v, Media) for v in value):
        return "\n".join(format_value(item) for item in value)
    if isinstance(value, enum.Enum):
        return format_value(value.value)
    return json.dumps(as_json_data(value), ensure_ascii=False)


def _describe_fields(specs: Sequence[FieldSpec]) -> str:
    lines = []
    for spec in specs:
        line = f"- {spec.name} ({_type_hint(spec.annotation)})"
        if spec.description:
            line += f": {spec.description}"
        lines.append(line)
    return "\n".join(lines)


def _type_hint(annotation: Any) -> str:
    choices = _choices(annotation)
    if choices is not None:
        return "one of: " + ", ".join(format_value(c) for c in choices)
    return type_label(annotation)


def _choices(annotation: Any) -> tuple[Any, ...] | None:
    """Returns the allowed values of a Literal or Enum type, else None."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return tuple(member.value for member in annotation)
    return None


# ----------------------------------------------------------------- parsing
_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*(.*?)```", re.DOTALL)


def _lenient_json(text: str) -> Any:
    """Returns the JSON in ``text``: whole, inside a code fence, or the outermost ``{...}``.

    Raises:
        ValueError: no JSON could be found (the first decoder error).
    """
    fenced = _FENCE.search(text)
    candidate = (fenced.group(1) if fenced else text).strip()
    # strict=False: a raw newline inside a string is common in model replies.
    try:
        return loads(candidate, strict=False)
    except ValueError as exc:
        first = exc
    start, end = candidate.find("{"), candidate.rfind("}")
    if 0 <= start < end:
        try:
            return loads(candidate[start : end + 1], strict=False)
        except ValueError:
            pass
    raise first


def _normalize_choice(spec: FieldSpec, value: Any) -> Any:
    """Maps ``'Positive.'`` to the allowed ``'positive'`` (models capitalise and punctuate)."""
    choices = _choices(spec.annotation)
    if choices is None or not isinstance(value, str) or value in choices:
        return value
    wanted = value.strip().strip("\"'`.").strip().casefold()
    for choice in choices:
        if isinstance(choice, str) and choice.casefold() == wanted:
            return choice
    return value


def validate_outputs(
    signature: type[Signature], data: Mapping[str, Any], raw: str
) -> dict[str, Any]:
    """Returns the typed outputs in ``data`` validated by the signature's output model.

    Raises:
        StructuredOutputError: a field is missing or invalid; the message names each one.
    """
    # import time: pydantic loads on first use, not on a plain call
    from pydantic import ValidationError

    specs = tuple(signature.output_fields.values())
    cleaned = dict(data)
    for spec in specs:
        if spec.name in cleaned:
            cleaned[spec.name] = _normalize_choice(spec, cleaned[spec.name])
    try:
        instance = signature.output_model().model_validate(cleaned)
    except ValidationError as exc:
        problems = "; ".join(_problem(error) for error in exc.errors())
        raise StructuredOutputError(
            f"the reply does not fit the outputs of {signature.__name__}: {problems}",
            raw=raw,
            target=signature.__name__,
        ) from None
    return outputs_of(specs, instance)


def _problem(error: Mapping[str, Any]) -> str:
    loc = error.get("loc") or ()
    field = f"field `{loc[0]}`" if loc else "the reply"
    if len(loc) > 1:
        field += " at " + ".".join(str(part) for part in loc[1:])
    if error.get("type") == "missing":
        return f"{field} is missing"
    got = repr(error.get("input"))
    if len(got) > 60:
        got = got[:57] + "..."
    return f"{field}: {error.get('msg')} (got {got})"


def _fail(signature: type[Signature], message: str, raw: str) -> StructuredOutputError:
    return StructuredOutputError(
        f"the reply to {signature.__name__} {message}", raw=raw, target=signature.__name__
    )


def _without_task(text: str, task: str) -> str:
    """Returns a history's system text without a copy of ``task`` at its end."""
    if text == task:
        return ""
    if text.endswith("\n\n" + task):
        return text[: -len(task) - 2]
    return text


def with_media(role: Literal["user", "assistant"], text: str, inputs: Mapping[str, Any]) -> Message:
    """Returns the turn of ``text``, its media slots filled with the media among ``inputs``."""
    if _SLOT_OPEN not in text:
        return Message(role, text)
    media: dict[str, Media] = {}
    for value in inputs.values():
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, Media):
                media[item.key] = item
    pieces = _SLOT.split(text)  # text, key, text, key, ..., text
    parts = [media[piece] if i % 2 else piece for i, piece in enumerate(pieces)]
    return Message(role, parts=tuple(part for part in parts if part != ""))


# --------------------------------------------------------------- base class
class _MessageAdapter:
    """Shared assembly: system turn, demo pairs, history turns, the inputs turn."""

    def format(
        self,
        signature: type[Signature],
        inputs: Mapping[str, Any],
        demos: Sequence[Mapping[str, Any]] = (),
        history: Sequence[Message] = (),
    ) -> tuple[Message, ...]:
        inputs = media_inputs(signature, inputs)  # text for an Image field: a medium or refused
        messages = [Message("system", self._system_turn(signature, history))]
        for demo in demos:
            pair = self._demo_pair(signature, demo)
            if pair is not None:
                messages.extend(pair)
        messages.extend(m for m in history if m.role != "system")
        messages.append(with_media("user", self.format_inputs(signature, inputs, True), inputs))
        return tuple(messages)

    def _system_turn(self, signature: type[Signature], history: Sequence[Message]) -> str:
        """Returns the one system turn, always first, where every provider reads it.

        A history's own system prompt (say, a persona) leads it, then the task
        and its fields. A history restored from a saved conversation may hold
        the whole turn an earlier call sent; its copy of this task is dropped,
        not sent twice.
        """
        task = self.format_system(signature)
        preface = [
            text for m in history if m.role == "system" and (text := _without_task(m.content, task))
        ]
        return "\n\n".join([*preface, task])

    def _demo_pair(
        self, signature: type[Signature], demo: Mapping[str, Any]
    ) -> tuple[Message, Message] | None:
        outputs = {k: demo[k] for k in signature.output_fields if k in demo}
        if not outputs:
            return None  # a demo without an answer teaches nothing
        inputs = {k: demo[k] for k in signature.input_fields if k in demo}
        return (
            with_media("user", self.format_inputs(signature, inputs, final=False), inputs),
            Message("assistant", self.format_outputs(signature, outputs)),
        )

    def format_system(self, signature: type[Signature]) -> str:
        """Returns the system turn: instructions, then the input and output fields.

        ``format_instructions`` is the same method, for ported code.
        """
        parts = []
        if signature.instructions:
            parts.append(signature.instructions)
        if signature.input_fields:
            parts.append(
                "Input fields:\n" + _describe_fields(list(signature.input_fields.values()))
            )
        parts.append("Output fields:\n" + _describe_fields(list(signature.output_fields.values())))
        parts.append(self.reply_format(signature))
        return "\n\n".join(parts)

    def format_instructions(self, signature: type[Signature]) -> str:
        """Returns the system turn (`format_system`, for ported code)."""
        return self.format_system(signature)

    def parse_outputs(
        self, signature: type[Signature], completion: Response | str
    ) -> dict[str, Any]:
        """Returns the typed outputs of a reply given as a `Response` or as its text.

        `parse` for ported code; it also takes the reply as text.

        Raises:
            StructuredOutputError: the reply does not hold valid outputs.
        """
        if isinstance(completion, str):
            completion = Response(text=completion)
        return self.parse(signature, completion)  # type: ignore[attr-defined]

    def format_tool_schema(self, tool: Any) -> dict[str, Any]:
        """Returns a tool (a `plait.Tool` or a function) in OpenAI's function-tool format.

        For ported code that asks an adapter; plait's backends do this translation
        themselves from `Tool.spec`, so a program never needs it.
        """
        from plait.tools import Tool  # import time: tools load asyncio, only for a tool

        spec = (tool if isinstance(tool, Tool) else Tool(tool)).spec
        return {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": spec.parameters,
            },
        }

    def reply_format(self, signature: type[Signature]) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def format_inputs(
        self, signature: type[Signature], inputs: Mapping[str, Any], final: bool = True
    ) -> str:  # pragma: no cover - abstract
        """Returns the user turn holding ``inputs``.

        ``final`` (the default) is the turn the model must answer, which may
        repeat what to reply with; demos are formatted with ``final=False``.
        """
        raise NotImplementedError

    def format_outputs(
        self, signature: type[Signature], outputs: Mapping[str, Any]
    ) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# ------------------------------------------------------------------- JSON
class JSONAdapter(_MessageAdapter):
    """Asks for the outputs as one JSON object, enforced by the backend's schema mode.

    Example of what it sends for ``"question -> answer: int"``::

        system:  Given the fields `question`, produce the fields `answer`.
                 Input fields: - question (str)
                 Output fields: - answer (int)
                 Reply with a JSON object with the keys: "answer".
        user:    question: How many legs has a cat?

    Parsing is lenient about what small models do: code fences, prose around
    the object, a bare value when there is exactly one output field.
    """

    def reply_format(self, signature: type[Signature]) -> str:
        keys = ", ".join(f'"{name}"' for name in signature.output_fields)
        return f"Reply with a JSON object with the keys: {keys}."

    def format_inputs(
        self, signature: type[Signature], inputs: Mapping[str, Any], final: bool = True
    ) -> str:
        lines = [
            f"{name}: {format_value(inputs[name])}"
            for name in signature.input_fields
            if name in inputs
        ]
        return "\n".join(lines)

    def format_outputs(self, signature: type[Signature], outputs: Mapping[str, Any]) -> str:
        return json.dumps(as_json_data(dict(outputs)), ensure_ascii=False)

    def stream_fields(self, text: str) -> dict[str, str]:
        """Returns the output fields in a reply that is still arriving (for streaming)."""
        from plait.streaming import json_fields  # import time: only a streamed reply

        return json_fields(text)

    def response_schema(self, signature: type[Signature]) -> ResponseSchema | None:
        """Returns the output model's JSON schema, named after the signature."""
        from plait.execution.structured import output_type_for  # import time: only a schema sent

        return output_type_for(signature.output_model()).schema

    def parse(self, signature: type[Signature], response: Response) -> dict[str, Any]:
        text = response.text
        specs = list(signature.output_fields.values())
        single = specs[0].name if len(specs) == 1 else None
        try:
            data = _lenient_json(text)
        except ValueError as exc:
            if single is None or not text.strip():
                names = ", ".join(f"`{s.name}`" for s in specs)
                raise _fail(
                    signature, f"is not a JSON object with the fields {names}: {exc}", text
                ) from None
            data = {single: text.strip()}  # one field: the bare text is its value
        if single is not None and not (isinstance(data, dict) and single in data):
            data = {single: data}
        if not isinstance(data, dict):
            names = ", ".join(f"`{s.name}`" for s in specs)
            kind = type(data).__name__
            raise _fail(signature, f"is a JSON {kind}, not an object with the fields {names}", text)
        return validate_outputs(signature, data, text)


# ------------------------------------------------------------------ plain
class PlainAdapter(JSONAdapter):
    """Sends a step with one input and one output field as a plain exchange; JSON otherwise.

    The system turn is the instructions alone, the user turn the input's
    value, and each demo reply (and the expected reply) the output's bare
    value: no field names, no format rules. A choice output (``Literal``,
    ``Enum``) still sends its schema, which the local backend decodes as a
    bare label; a text output sends no schema. Signatures with more fields
    are handled as `JSONAdapter` handles them.

    Why: SmolLM2-135M followed `JSONAdapter`'s field descriptions and format
    rules poorly. On BBH ``boolean_expressions`` (100 test items, greedy), the
    same instructions scored 0.52 with `JSONAdapter` (every answer "True")
    and 0.64 with this adapter, as much as the instructions sent as plain text.

    Example of what it sends for ``"expression -> answer: Literal['True', 'False']"``::

        system:    Evaluate the boolean expression.
        user:      not ( True ) and ( True ) is
    """

    def _system_turn(self, signature: type[Signature], history: Sequence[Message]) -> str:
        if not _is_plain(signature):
            return super()._system_turn(signature, history)
        preface = [m.content for m in history if m.role == "system" and m.content]
        return "\n\n".join([*preface, signature.instructions])

    def format_inputs(
        self, signature: type[Signature], inputs: Mapping[str, Any], final: bool = True
    ) -> str:
        if not _is_plain(signature):
            return super().format_inputs(signature, inputs, final)
        (name,) = signature.input_fields
        return format_value(inputs[name]) if name in inputs else ""

    def format_outputs(self, signature: type[Signature], outputs: Mapping[str, Any]) -> str:
        if not _is_plain(signature):
            return super().format_outputs(signature, outputs)
        (name,) = signature.output_fields
        return format_value(outputs[name])

    def response_schema(self, signature: type[Signature]) -> ResponseSchema | None:
        """Returns the outputs' schema, except for one plain-text output (then None)."""
        if _is_plain(signature):
            (spec,) = signature.output_fields.values()
            if spec.annotation is str:
                return None
        return super().response_schema(signature)


def _is_plain(signature: type[Signature]) -> bool:
    return len(signature.input_fields) == 1 and len(signature.output_fields) == 1


# ------------------------------------------------------------------- chat
_MARKER = re.compile(r"\[\[\s*##\s*([A-Za-z_][A-Za-z0-9_]*)\s*##\s*\]\]")


def _marker(name: str) -> str:
    return f"[[ ## {name} ## ]]"


class ChatAdapter(_MessageAdapter):
    """Marks each field with a header ``[[ ## name ## ]]``; for backends without a schema mode.

    Parsing is lenient, because small models do not follow meta-formats: with
    exactly one output field and no headers, the whole reply is that field; a
    reply that is a JSON object is accepted too; values are coerced to the
    field's type by pydantic (``"3"`` → 3), and a list may come as lines or
    comma-separated text.
    """

    def reply_format(self, signature: type[Signature]) -> str:
        lines = [
            "Reply with each output field under its header, in this order, "
            f"then end with {_marker('completed')}:"
        ]
        for spec in signature.output_fields.values():
            lines.append(f"\n{_marker(spec.name)}\n{{{spec.name}: {_value_hint(spec)}}}")
        lines.append(f"\n{_marker('completed')}")
        return "\n".join(lines)

    def format_inputs(
        self, signature: type[Signature], inputs: Mapping[str, Any], final: bool = True
    ) -> str:
        blocks = [
            f"{_marker(name)}\n{format_value(inputs[name])}"
            for name in signature.input_fields
            if name in inputs
        ]
        if final:
            order = ", ".join(_marker(name) for name in signature.output_fields)
            blocks.append(f"Respond with {order}, then {_marker('completed')}.")
        return "\n\n".join(blocks)

    def format_outputs(self, signature: type[Signature], outputs: Mapping[str, Any]) -> str:
        blocks = [f"{_marker(name)}\n{format_value(value)}" for name, value in outputs.items()]
        blocks.append(_marker("completed"))
        return "\n\n".join(blocks)

    def stream_fields(self, text: str) -> dict[str, str]:
        """Returns the text under each header of a reply that is still arriving (for streaming).

        A header still being written at the end is left out of the field before it.
        """
        matches = list(_MARKER.finditer(text))
        found: dict[str, str] = {}
        for i, match in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
            body = text[match.end() : end]
            if i + 1 == len(matches):
                opening = body.rfind("[[")
                if opening >= 0:
                    body = body[:opening]
            if match.group(1) != "completed":
                found.setdefault(match.group(1), body.strip())
        return found

    def response_schema(self, signature: type[Signature]) -> None:
        """Returns None: this adapter is for backends without a schema mode."""
        return None

    def parse(self, signature: type[Signature], response: Response) -> dict[str, Any]:
        text = response.text
        specs = list(signature.output_fields.values())
        sections = _sections(text)
        missing = [s.name for s in specs if s.name not in sections]
        if missing and len(specs) == 1:
            sections = {specs[0].name: _MARKER.sub("", text).strip()}
        elif missing:
            data = _json_object(text)
            if data is not None:
                return validate_outputs(signature, data, text)
            names = ", ".join(f"`{name}` ({_marker(name)})" for name in missing)
            raise _fail(signature, f"has no section for field(s) {names}", text)
        data = {spec.name: _coerce_text(spec, sections[spec.name]) for spec in specs}
        return validate_outputs(signature, data, text)


def _value_hint(spec: FieldSpec) -> str:
    choices = _choices(spec.annotation)
    if choices is not None:
        return "one of " + ", ".join(format_value(c) for c in choices)
    if spec.annotation is str:
        return "text"
    if spec.annotation in (int, float, bool):
        return spec.annotation.__name__
    return f"{type_label(spec.annotation)}, as JSON"


def _sections(text: str) -> dict[str, str]:
    """Returns the text under each ``[[ ## name ## ]]`` header; the first one of a name wins."""
    found: dict[str, str] = {}
    matches = list(_MARKER.finditer(text))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        found.setdefault(match.group(1), text[match.end() : end].strip())
    found.pop("completed", None)
    return found


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        data = _lenient_json(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s*")


def _coerce_text(spec: FieldSpec, text: str) -> Any:
    """Returns the section text as the value pydantic should validate for ``spec``."""
    if spec.annotation is str:
        return text
    try:
        return _lenient_json(text)
    except ValueError:
        pass
    origin = typing.get_origin(spec.annotation) or spec.annotation
    if origin in (list, tuple, set, frozenset):
        lines = [line for line in text.splitlines() if line.strip()]
        items = lines if len(lines) > 1 else text.split(",")
        return [_BULLET.sub("", item).strip() for item in items if item.strip()]
    return text
